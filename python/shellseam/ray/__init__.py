"""``shellseam[ray]``: the seam on a Ray cluster (SPEC §6).

``RayShellExecutor`` is a ``ShellExecutor`` whose commands run on one node of a Ray cluster,
through one node service actor per node. The protocol underneath (``protocol``,
``nodestate``, ``client``) knows nothing of Ray.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("shellseam.ray needs Ray: pip install 'shellseam[ray]'") from err

from .client import RemoteShellExecutor
from .executor import RayShellExecutor
from .handle import RemoteShellProcess

__all__ = ["RayShellExecutor", "RemoteShellExecutor", "RemoteShellProcess"]

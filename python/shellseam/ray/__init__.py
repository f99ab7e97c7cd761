"""``shellseam[ray]``: the seam on a Ray cluster (SPEC §6).

``RayShellExecutor`` is a ``ShellExecutor`` whose commands run on one node of a Ray cluster,
through one node service actor per node. The protocol underneath (``protocol``,
``nodestate``, ``link``, ``handle``, ``client``) knows nothing of Ray and imports without it;
only ``RayShellExecutor`` (``executor``, ``node``) needs the ``ray`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import RemoteShellExecutor
from .handle import RemoteShellProcess

if TYPE_CHECKING:
    from .executor import RayShellExecutor

__all__ = ["RayShellExecutor", "RemoteShellExecutor", "RemoteShellProcess"]


def __getattr__(name: str) -> Any:
    if name == "RayShellExecutor":
        try:
            from .executor import RayShellExecutor
        except ImportError as err:
            if err.name is None or not err.name.startswith("ray"):
                raise
            raise ImportError(
                "RayShellExecutor needs Ray: pip install 'shellseam[ray]'", name=err.name
            ) from err
        return RayShellExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

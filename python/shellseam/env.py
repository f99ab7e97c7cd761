"""The old home of the managed-environment registry, kept so that existing imports work.

The registry lives in ``shellseam.tool.managed_env`` (it resolves per tool call); import it
from there or from ``shellseam``.
"""

from .tool.managed_env import ManagedEnvContributor, ManagedEnvRegistry

__all__ = ["ManagedEnvContributor", "ManagedEnvRegistry"]

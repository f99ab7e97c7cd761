"""The managed-environment registry: trusted ``DSH_*`` variables for model-driven commands.

Every bash call gets a freshly collected snapshot: the built-ins (``<prefix>HOME``,
``<prefix>SHELL=1``, ``<prefix>SESSION_ID`` and, when known, ``<prefix>SESSION_JSONL``) plus
whatever registered contributors resolve for the calling context. Keys are owned: a key can
be declared by one contributor only, built-ins are reserved, and a resolver returning a key
it did not declare fails loudly, so no plugin can silently shadow another's value.

It lives with the tools because it resolves per tool call (``ToolContext``); the executor
below only sees the collected ``managed_env`` mapping.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import config_path

if TYPE_CHECKING:
    from .context import ToolContext

_BUILTIN_SUFFIXES = ("HOME", "SHELL", "SESSION_ID", "SESSION_JSONL")


@dataclass(frozen=True)
class ManagedEnvContributor:
    """A named producer of managed variables: the keys it may set and how to resolve them."""

    name: str
    keys: tuple[str, ...]
    resolve: Callable[[ToolContext], Mapping[str, str]]


class ManagedEnvRegistry:
    """Collects the managed environment for one tool call."""

    def __init__(self, *, home: str, prefix: str = "DSH_") -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not prefix:
            raise ValueError("prefix must be non-empty (the managed env prefix)")
        self.home = os.path.abspath(config_path(home, "home"))
        self.prefix = prefix
        self._builtin_keys = frozenset(prefix + suffix for suffix in _BUILTIN_SUFFIXES)
        self._lock = threading.Lock()
        # Insertion-ordered so collection is deterministic; values are the owners.
        self._contributors: list[ManagedEnvContributor] = []
        self._owner_of: dict[str, ManagedEnvContributor] = {}

    def register(self, contributor: ManagedEnvContributor) -> Callable[[], None]:
        """Add ``contributor``; returns an idempotent disposer that unregisters it.

        Raises ``ValueError`` for a key without the prefix, a built-in key, or a key that
        is already owned (by another contributor or declared twice by this one).
        """
        keys = tuple(contributor.keys)
        for key in keys:
            if not isinstance(key, str) or not key.startswith(self.prefix) or key == self.prefix:
                raise ValueError(
                    f"managed env contributor {contributor.name!r}: key {key!r} must start "
                    f"with {self.prefix!r}"
                )
            if key in self._builtin_keys:
                raise ValueError(
                    f"managed env contributor {contributor.name!r}: key {key!r} is a reserved "
                    "built-in"
                )
        if len(set(keys)) != len(keys):
            raise ValueError(f"managed env contributor {contributor.name!r} declares a key twice")
        with self._lock:
            for key in keys:
                owner = self._owner_of.get(key)
                if owner is not None:
                    raise ValueError(
                        f"managed env contributor {contributor.name!r}: key {key!r} is already "
                        f"owned by {owner.name!r}"
                    )
            self._contributors.append(contributor)
            for key in keys:
                self._owner_of[key] = contributor

        def dispose() -> None:
            with self._lock:
                if contributor not in self._contributors:
                    return
                self._contributors.remove(contributor)
                for key in keys:
                    self._owner_of.pop(key, None)

        return dispose

    def collect(self, ctx: ToolContext) -> dict[str, str]:
        """The built-ins for ``ctx`` plus every contributor's resolved values.

        Raises ``ValueError`` when a resolver returns a key it did not declare; resolver
        exceptions propagate unchanged (a broken contributor must not pass unnoticed).
        """
        p = self.prefix
        env = {f"{p}HOME": self.home, f"{p}SHELL": "1", f"{p}SESSION_ID": ctx.session_id}
        if ctx.session_jsonl is not None:
            env[f"{p}SESSION_JSONL"] = ctx.session_jsonl
        with self._lock:
            contributors = builtins.list(self._contributors)
        for contributor in contributors:
            values = contributor.resolve(ctx)
            for key, value in values.items():
                if key not in contributor.keys:
                    raise ValueError(
                        f"managed env contributor {contributor.name!r} returned undeclared key "
                        f"{key!r}"
                    )
                if not isinstance(value, str):
                    raise ValueError(
                        f"managed env contributor {contributor.name!r} returned a non-string "
                        f"value for {key!r}"
                    )
                env[key] = value
        return env

    def list(self) -> builtins.list[str]:
        """Every contributor-declared key, sorted (built-ins are not listed; nothing resolves)."""
        with self._lock:
            return sorted(self._owner_of)

"""Validation at the seam's edges, so that bad values fail clearly and early.

Configuration is refused when an executor is built, with ``TypeError``/``ValueError`` naming
the parameter; requests (at ``resolve``) and hand-built specs (at ``run``/``start``) are
refused with ``ShellError(INVALID_REQUEST)``. Nothing reaches the native core that could make
it panic or overflow.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from .abort import AbortSignal
from .errors import INVALID_REQUEST, ShellError
from .types import ResourceLimits, SandboxPolicy, ShellExecSpec

#: The longest timeout (and grace) in milliseconds: 2**31 - 1 (~24.8 days), the ceiling of
#: the seeds' JavaScript timers and of one poll/epoll wait.
MAX_TIMEOUT_MS = 2**31 - 1
#: Waits longer than this (about 31 years) are waits without a timeout.
MAX_WAIT_S = 2**30
#: The largest byte budget: what a file offset can address.
MAX_BYTES = 2**63 - 1
#: The longest command accepted (SPEC §3).
MAX_COMMAND_BYTES = 16 * 2**20
#: Largest value any limit accepts: rlimits and cgroup files take 64-bit values, and an
#: i64 keeps every conversion exact.
MAX_LIMIT = 2**63 - 1

LIMIT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ResourceLimits))


def invalid(reason: str) -> ShellError:
    return ShellError(INVALID_REQUEST, reason)


# -- configuration (constructors) ---------------------------------------------------------


def config_int(value: object, name: str, *, minimum: int, maximum: int) -> int:
    """An integer configuration value within ``[minimum, maximum]``.

    A float (even integral, infinite or NaN) is a ``ValueError``: the parameter counts whole
    units. Any other type is a ``TypeError``.
    """
    if isinstance(value, float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def config_bool(value: object, name: str) -> bool:
    """A flag: a real ``bool``, never a truthy string or number."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def config_path(value: object, name: str) -> str:
    """A path: a non-empty ``str`` without NUL (which no system call can take)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str path, got {type(value).__name__}")
    if not value or "\0" in value:
        raise ValueError(f"{name} must be a non-empty path without NUL, got {value!r}")
    return value


def wait_timeout(timeout: object) -> float | None:
    """A blocking wait's timeout in seconds: None or infinity wait forever; a negative
    timeout polls once."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__}"
        )
    if isinstance(timeout, float) and math.isnan(timeout):
        raise ValueError("timeout must be a number of seconds, got nan")
    if timeout <= 0:
        return 0.0
    if timeout == math.inf or timeout > MAX_WAIT_S:
        return None  # longer than any process can run: no timeout
    return float(timeout)


# -- requests and specs -------------------------------------------------------------------


def positive_int(value: object, name: str, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise invalid(f"{name} must be at most {maximum}, got {value}")
    return value


def check_text(value: str, name: str) -> None:
    """Text must be encodable: a lone surrogate (valid JSON, invalid UTF-8) is refused here
    instead of failing at spawn."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"{name} is not valid UTF-8 (it contains a lone surrogate)") from None


def check_command(command: object) -> str:
    if not isinstance(command, str) or not command.strip():
        raise invalid("command must be a non-empty string")
    if "\0" in command:
        raise invalid("command contains a NUL byte")
    check_text(command, "command")
    # A UTF-8 character takes at most 4 bytes: only a long command is encoded to measure it.
    if len(command) > MAX_COMMAND_BYTES // 4 and len(command.encode()) > MAX_COMMAND_BYTES:
        raise invalid(f"command is longer than {MAX_COMMAND_BYTES} bytes")
    return command


def check_workdir(workdir: object) -> str:
    if not isinstance(workdir, str) or not workdir or "\0" in workdir:
        raise invalid(f"workdir must be a non-empty path, got {workdir!r}")
    check_text(workdir, "workdir")
    return workdir


def check_env(env: object, name: str) -> None:
    """None, or a mapping of non-empty names (no ``=``, no NUL) to str values."""
    if env is None:
        return
    if not isinstance(env, Mapping):
        raise invalid(f"{name} must be a mapping of str to str, got {type(env).__name__}")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise invalid(f"{name} keys and values must be strings")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise invalid(f"{name} has an invalid entry {key!r}")
        check_text(key, name)
        check_text(value, name)


def check_signal(signal: object) -> None:
    if signal is not None and not isinstance(signal, AbortSignal):
        raise invalid(f"signal must be an AbortSignal or None, got {type(signal).__name__}")


def check_stdin(stdin: object) -> None:
    if stdin is None or isinstance(stdin, bytes):
        return
    if not isinstance(stdin, str):
        raise invalid(f"stdin must be str, bytes or None, got {type(stdin).__name__}")
    check_text(stdin, "stdin")


def check_policy(policy: object) -> None:
    if policy is not None and not isinstance(policy, SandboxPolicy):
        raise invalid(
            f"sandbox_policy must be a SandboxPolicy or None, got {type(policy).__name__}"
        )


def check_limits(limits: object, *, where: str) -> ResourceLimits:
    """Validates executor configuration: ``TypeError``/``ValueError`` naming the field."""
    if not isinstance(limits, ResourceLimits):
        raise TypeError(f"{where} must be a ResourceLimits, got {type(limits).__name__}")
    for name in LIMIT_FIELDS:
        value = getattr(limits, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}.{name} must be an int or None, got {value!r}")
        if not 0 < value <= MAX_LIMIT:
            raise ValueError(f"{where}.{name} must be a positive integer, got {value!r}")
    return limits


def request_limits(limits: object) -> ResourceLimits:
    """Validates a request's limits: ``ShellError(INVALID_REQUEST)`` naming the field."""
    try:
        return check_limits(limits, where="limits")
    except (TypeError, ValueError) as err:
        raise invalid(str(err)) from None


#: Where ``resolve`` records the field values it checked (see ``mark_checked``).
CHECKED_MARK = "_shellseam_checked"


#: The fields ``check_spec`` checks beyond ``env`` and ``managed_env``, in the order of the
#: mark's values (the core reads marked specs too: ``Supervisor.run_spec``).
CHECKED_FIELDS: tuple[str, ...] = (
    "command",
    "workdir",
    "timeout_ms",
    "stdout_max_bytes",
    "signal",
    "stdin",
    "sandbox_policy",
    "limits",
)

#: Their values, read off a spec's ``__dict__`` in one C call (the fields of the frozen
#: dataclass live there).
_checked_values = operator.itemgetter(*CHECKED_FIELDS)


def _checked_fields(spec: ShellExecSpec) -> tuple[object, ...]:
    values: tuple[object, ...] = _checked_values(spec.__dict__)
    return values


def mark_checked(spec: ShellExecSpec) -> ShellExecSpec:
    """Records on a spec ``resolve`` just built and checked the values it checked, so that
    running it does not check them again (their cold cost is a few percent of a short
    command). Only immutable values count: a spec with an ``env`` or ``managed_env``
    mapping, which its caller may still change, is checked at every run."""
    if spec.env is None and spec.managed_env is None:
        object.__setattr__(spec, CHECKED_MARK, _checked_fields(spec))
    return spec


def unmark(spec: ShellExecSpec) -> ShellExecSpec:
    """Drops a mark ``spec`` came with (a spec unpickled from another process carries the
    mark its sender set): only this process's ``resolve`` or checks may vouch for it."""
    spec.__dict__.pop(CHECKED_MARK, None)
    return spec


def marked_values(spec: object) -> dict[str, Any] | None:
    """The field values of a spec ``resolve`` marked (``mark_checked``) whose values are still
    the very objects it checked, else None (the spec needs ``check_spec``'s full check)."""
    if type(spec) is not ShellExecSpec:
        return None
    values = spec.__dict__
    mark = values.get(CHECKED_MARK)
    if (
        mark is not None
        and values["env"] is None
        and values["managed_env"] is None
        and all(map(operator.is_, mark, _checked_values(values)))
    ):
        return values
    return None


def check_spec(spec: object) -> ShellExecSpec:
    """A spec as ``resolve`` would have produced it; hand-built specs are checked here.

    A spec ``resolve`` marked (``mark_checked``) whose values are still the very objects it
    checked is not checked again; any other spec, a copy made with ``dataclasses.replace`` or a
    field changed behind the frozen dataclass's back included, is checked in full."""
    if marked_values(spec) is not None:
        return spec  # type: ignore[return-value]
    if not isinstance(spec, ShellExecSpec):
        raise invalid(f"expected a ShellExecSpec, got {type(spec).__name__}")
    check_command(spec.command)
    check_workdir(spec.workdir)
    positive_int(spec.timeout_ms, "timeout_ms", MAX_TIMEOUT_MS)
    positive_int(spec.stdout_max_bytes, "stdout_max_bytes", MAX_BYTES)
    check_signal(spec.signal)
    check_stdin(spec.stdin)
    check_env(spec.env, "env")
    check_env(spec.managed_env, "managed_env")
    check_policy(spec.sandbox_policy)
    request_limits(spec.limits)
    return spec


def with_signal(spec: ShellExecSpec, signal: AbortSignal | None) -> ShellExecSpec:
    """``spec`` (checked here) with another abort signal: what ``dataclasses.replace``
    makes, but for a spec without ``env`` mappings both ``spec`` and the copy are marked
    checked, so that neither is checked in full again (a node service sends every call of
    one spec through here, each with its own signal)."""
    mark_checked(check_spec(spec))
    check_signal(signal)
    copy = object.__new__(ShellExecSpec)
    values = copy.__dict__
    values.update(spec.__dict__)
    values["signal"] = signal
    return mark_checked(copy)

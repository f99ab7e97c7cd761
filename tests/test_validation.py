"""Bad configuration and bad requests fail up front and clearly: ValueError/TypeError naming
the parameter at construction, ShellError(INVALID_REQUEST) for requests and hand-built specs;
never a PanicException, an OverflowError or an AttributeError from deep inside."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import pytest

from shellseam import (
    AbortController,
    LocalShellExecutor,
    ManagedEnvRegistry,
    ResourceLimits,
    SandboxPolicy,
    SandboxShellExecutor,
    ShellError,
    ShellExecRequest,
    SubprocessService,
)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("max_timeout_ms", 1e30, ValueError),
        ("max_timeout_ms", math.inf, ValueError),
        ("timeout_ms", math.nan, ValueError),
        ("timeout_ms", 5000.0, ValueError),
        ("timeout_ms", 0, ValueError),
        ("timeout_ms", 2**31, ValueError),
        ("timeout_ms", "100", TypeError),
        ("timeout_ms", True, TypeError),
        ("grace_ms", 2**64, ValueError),
        ("grace_ms", -1, ValueError),
        ("grace_ms", math.inf, ValueError),
        ("max_output_bytes", 2**64, ValueError),
        ("max_output_bytes", -5, ValueError),
        ("max_spill_bytes", 2**63, ValueError),
        ("max_spill_bytes", None, TypeError),
    ],
)
def test_bad_numeric_config_names_the_parameter(name: str, value: object, error: type) -> None:
    for cls in (LocalShellExecutor, SandboxShellExecutor):
        with pytest.raises(error, match=name):
            cls(**{name: value})


@pytest.mark.parametrize(
    ("build", "name", "error"),
    [
        (lambda: SubprocessService(keep_spill="yes"), "keep_spill", TypeError),
        (lambda: SubprocessService(keep_spill=1), "keep_spill", TypeError),
        (lambda: SubprocessService(spill_parent="/x/\0y"), "spill_parent", ValueError),
        (lambda: SubprocessService(spill_parent=""), "spill_parent", ValueError),
        (lambda: SubprocessService(spill_parent=b"/tmp"), "spill_parent", TypeError),
        (lambda: LocalShellExecutor(cwd="/tmp/\0x"), "cwd", ValueError),
        (lambda: LocalShellExecutor(cwd=""), "cwd", ValueError),
        (lambda: LocalShellExecutor(cwd=3), "cwd", TypeError),
        (lambda: SandboxShellExecutor(cwd="/tmp/\0x"), "cwd", ValueError),
        (lambda: LocalShellExecutor(service="x"), "service", TypeError),
        (lambda: SandboxShellExecutor(service=object()), "service", TypeError),
        (lambda: ManagedEnvRegistry(home=5), "home", TypeError),
        (lambda: ManagedEnvRegistry(home=""), "home", ValueError),
        (lambda: ManagedEnvRegistry(home="/h/\0"), "home", ValueError),
        (lambda: ManagedEnvRegistry(home="/h", prefix=5), "prefix", TypeError),
    ],
)
def test_bad_constructor_values_name_the_parameter(
    build: Callable[[], object], name: str, error: type[Exception]
) -> None:
    # SPEC §2: TypeError/ValueError naming the parameter, at construction (a bool must be a
    # real bool; a path a non-empty str without NUL).
    with pytest.raises(error) as info:
        build()
    assert str(info.value).startswith(name)  # the message itself, not a note added to it


def test_service_takes_its_arguments_in_spec_order(tmp_path: os.PathLike[str]) -> None:
    # SPEC §3: SubprocessService(spill_parent=None, max_spill_total_bytes=2**30,
    # keep_spill=False), positional or by name.
    svc = SubprocessService(str(tmp_path), 12_345, True)
    try:
        assert (svc.spill_parent, svc.max_spill_total_bytes, svc.keep_spill) == (
            str(tmp_path),
            12_345,
            True,
        )
    finally:
        svc.dispose()


def test_extreme_but_valid_config_runs(service: SubprocessService) -> None:
    ex = LocalShellExecutor(
        timeout_ms=2**31 - 1,
        max_timeout_ms=2**31 - 1,
        max_output_bytes=2**63 - 1,
        max_spill_bytes=2**63 - 1,
        grace_ms=2**31 - 1,
        service=service,
    )
    result = ex.run_sync(ex.resolve(ShellExecRequest(command="echo ok")))
    assert (result.stdout.text, result.exit_code, result.timeout_ms) == ("ok\n", 0, 2**31 - 1)


def test_wait_sync_infinity_means_no_timeout(ex: LocalShellExecutor) -> None:
    proc = ex.start(ex.resolve(ShellExecRequest(command="sleep 0.1; echo done")))
    assert proc.wait_sync(math.inf) is True
    assert proc.exit_code == 0
    assert proc.wait_sync(1e300) is True
    assert proc.wait_sync(10**400) is True
    assert proc.wait_sync(-(10**400)) is True
    assert proc.wait_sync(-1) is True


def test_wait_sync_refuses_nonsense_timeouts(ex: LocalShellExecutor) -> None:
    proc = ex.start(ex.resolve(ShellExecRequest(command="true")))
    with pytest.raises(ValueError, match="timeout"):
        proc.wait_sync(math.nan)
    with pytest.raises(TypeError, match="timeout"):
        proc.wait_sync("5")  # type: ignore[arg-type]
    assert proc.wait_sync(None)


def test_a_short_finite_wait_still_times_out(ex: LocalShellExecutor) -> None:
    proc = ex.start(ex.resolve(ShellExecRequest(command="sleep 5")))
    try:
        assert proc.wait_sync(0.05) is False
        assert proc.status == "running"
    finally:
        proc.kill()
        proc.wait_sync(None)


BAD_REQUESTS: list[tuple[dict[str, object], str]] = [
    ({"signal": "abort please"}, "signal must be an AbortSignal"),
    ({"signal": AbortController()}, "signal must be an AbortSignal"),
    ({"env": [("A", "b")]}, "env must be a mapping"),
    ({"env": "A=b"}, "env must be a mapping"),
    ({"managed_env": ["DSH_X"]}, "managed_env must be a mapping"),
    ({"env": {"A": 1}}, "env keys and values must be strings"),
    ({"stdin": 5}, "stdin must be str, bytes or None"),
    ({"stdin": bytearray(b"x")}, "stdin must be str, bytes or None"),
    ({"stdout_max_bytes": "5"}, "stdout_max_bytes must be a positive integer"),
    ({"stdout_max_bytes": 1.5}, "stdout_max_bytes must be a positive integer"),
    ({"sandbox_policy": "read-only"}, "sandbox_policy must be a SandboxPolicy"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD_REQUESTS)
def test_bad_requests_are_invalid_request(
    ex: LocalShellExecutor, fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(ShellError) as info:
        ex.resolve(ShellExecRequest(command="true", **fields))  # type: ignore[arg-type]
    assert info.value.code == "INVALID_REQUEST"
    assert info.value.reason.startswith(reason)


def test_a_request_of_the_wrong_type_is_invalid_request(ex: LocalShellExecutor) -> None:
    with pytest.raises(ShellError) as info:
        ex.resolve({"command": "true"})  # type: ignore[arg-type]
    assert info.value.code == "INVALID_REQUEST"


@pytest.mark.parametrize(
    "fields",
    [
        {"signal": "x"},
        {"env": [("A", "b")]},
        {"managed_env": 3},
        {"stdin": 5},
        {"timeout_ms": 10**30},
        {"timeout_ms": 1.5},
        {"stdout_max_bytes": 0},
        {"command": ""},
        {"command": "x" * (16 * 2**20 + 1)},
        {"workdir": None},
        {"limits": ResourceLimits(memory_bytes=-1)},
        {"limits": ResourceLimits(max_processes=0)},
        {"limits": ResourceLimits(cpu_ms=1.5)},  # type: ignore[arg-type]
        {"limits": None},
        {"limits": {"max_processes": 5}},
    ],
)
def test_hand_built_specs_are_checked_at_run_and_start(
    ex: LocalShellExecutor, fields: dict[str, object]
) -> None:
    spec = dataclasses.replace(ex.resolve(ShellExecRequest(command="true")), **fields)  # type: ignore[arg-type]
    for call in (ex.run_sync, ex.start):
        with pytest.raises(ShellError) as info:
            call(spec)
        assert info.value.code == "INVALID_REQUEST"
    assert ex.service.running == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"limits": ResourceLimits(memory_bytes=-1)},
        {"sandbox_policy": SandboxPolicy(mode="workspace-write", workspace_root="ws")},
        {
            "sandbox_policy": SandboxPolicy(
                mode="workspace-write", workspace_root="/tmp", writable_roots=("rel",)
            )
        },
    ],
)
def test_a_start_refuses_what_run_refuses_with_invalid_request(
    service: SubprocessService, tmp_path: os.PathLike[str], fields: dict[str, object]
) -> None:
    # SPEC §2: bad values are refused up front, by start as by run, never settled as a
    # spawn failure.
    ex = SandboxShellExecutor(cwd=str(tmp_path), grace_ms=300, service=service)
    spec = dataclasses.replace(ex.resolve(ShellExecRequest(command="true")), **fields)  # type: ignore[arg-type]
    for call in (ex.run_sync, ex.start):
        with pytest.raises(ShellError) as info:
            call(spec)
        assert info.value.code == "INVALID_REQUEST"
    assert service.running == 0


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("grace_ms", 2**64, ValueError),
        ("stdout_cap", -1, ValueError),
        ("spill_cap", 2**64, ValueError),
        ("stderr_cap", 1.5, ValueError),
        ("grace_ms", "3000", TypeError),
    ],
)
def test_service_spawn_refuses_values_the_core_cannot_take(
    service: SubprocessService, ex: LocalShellExecutor, name: str, value: object, error: type
) -> None:
    spec = ex.resolve(ShellExecRequest(command="true"))
    fields: dict[str, object] = {
        "program": b"/bin/true",
        "argv": [b"true"],
        "cwd": "/",
        "env": ex._child_env(spec),
        "stdin": b"",
        "stdout_cap": 10,
        "stderr_cap": 10,
        "spill_cap": 10,
        "grace_ms": 10,
    }
    fields[name] = value
    with pytest.raises(error, match=name):
        service.spawn(**fields)  # type: ignore[arg-type]
    assert service.running == 0

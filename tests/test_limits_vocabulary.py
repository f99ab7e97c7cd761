"""ResourceLimits validation and tightening, and the exact limit markers (SPEC §2, §5 item 7)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakes import run_result as result
from shellseam import ResourceLimits, ShellError, ShellResources
from shellseam.checks import check_limits, request_limits
from shellseam.limits import tighten
from shellseam.render import render_result

MEMORY = ResourceLimits(memory_bytes=256 * 2**20)


def resources(exceeded: str | None, limits: ResourceLimits) -> ShellResources:
    return ShellResources(
        containment="cgroup",
        enforcement="tree",
        limits=limits,
        limit_exceeded=exceeded,  # type: ignore[arg-type]
        peak_memory_bytes=None,
        cpu_ms=1.0,
    )


@pytest.mark.parametrize(
    ("exceeded", "limits", "marker"),
    [
        ("memory", MEMORY, "[killed: memory limit of 268435456 bytes exceeded]"),
        ("cpu", ResourceLimits(cpu_ms=500), "[killed: cpu limit of 500ms exceeded]"),
        (
            "processes",
            ResourceLimits(max_processes=64),
            "[process limit of 64 reached; some forks failed]",
        ),
        (
            "file_size",
            ResourceLimits(file_size_bytes=4096),
            "[file size limit of 4096 bytes reached]",
        ),
    ],
)
def test_limit_markers_are_exact(exceeded: str, limits: ResourceLimits, marker: str) -> None:
    r = result("out\n", exit_code=None, signal="SIGKILL", resources=resources(exceeded, limits))
    assert render_result(r) == f"out\n{marker}\n[killed by signal: SIGKILL]"


def test_limit_marker_sits_between_timeout_and_leftover() -> None:
    r = result(
        "",
        exit_code=137,
        timed_out=True,
        timeout_ms=900,
        leftover_killed=2,
        resources=resources("processes", ResourceLimits(max_processes=8)),
    )
    assert render_result(r) == (
        "(no output)\n"
        "[timed out after 900ms]\n"
        "[process limit of 8 reached; some forks failed]\n"
        "[stopped 2 leftover background processes]\n"
        "[exit code: 137]"
    )


def test_no_marker_without_an_exceeded_limit() -> None:
    r = result("x\n", resources=resources(None, MEMORY))
    assert render_result(r) == "x\n[exit code: 0]"


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1", 2**63])
def test_executor_limits_refuse_bad_values(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="memory_bytes"):
        check_limits(ResourceLimits(memory_bytes=bad), where="limits")  # type: ignore[arg-type]


def test_executor_limits_must_be_resource_limits() -> None:
    with pytest.raises(TypeError, match="limits must be a ResourceLimits"):
        check_limits({"memory_bytes": 1}, where="limits")


@pytest.mark.parametrize("bad", [0, -5, False, 2.0])
def test_request_limits_refuse_with_invalid_request(bad: object) -> None:
    with pytest.raises(ShellError) as info:
        request_limits(ResourceLimits(cpu_ms=bad))  # type: ignore[arg-type]
    assert info.value.code == "INVALID_REQUEST"
    assert "cpu_ms" in str(info.value)


def test_request_only_tightens() -> None:
    ceiling = ResourceLimits(max_processes=4096, memory_bytes=2**30)
    asked = ResourceLimits(max_processes=10_000, memory_bytes=2**20, cpu_ms=50)
    assert tighten(ceiling, asked) == ResourceLimits(
        max_processes=4096, memory_bytes=2**20, cpu_ms=50
    )
    assert tighten(ceiling, None) is ceiling


limit_values = st.none() | st.integers(min_value=1, max_value=2**40)


@given(
    st.builds(ResourceLimits, memory_bytes=limit_values, cpu_ms=limit_values),
    st.builds(ResourceLimits, memory_bytes=limit_values, cpu_ms=limit_values),
)
def test_tighten_is_a_fieldwise_minimum(a: ResourceLimits, b: ResourceLimits) -> None:
    t = tighten(a, b)
    for name in ("memory_bytes", "cpu_ms"):
        values = [v for v in (getattr(a, name), getattr(b, name)) if v is not None]
        assert getattr(t, name) == (min(values) if values else None)
    assert tighten(a, b) == tighten(b, a)

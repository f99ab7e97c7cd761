"""ManagedEnvRegistry: built-ins, contributor ownership, loud failures, disposal."""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

from shellseam import ManagedEnvContributor, ManagedEnvRegistry
from shellseam.tool.context import ToolContext

CTX = ToolContext(session_id="sess-1", session_cwd="/work")


def fixed(name: str, keys: tuple[str, ...], values: Mapping[str, str]) -> ManagedEnvContributor:
    return ManagedEnvContributor(name, keys, lambda _ctx: values)


def test_builtins_with_default_prefix() -> None:
    reg = ManagedEnvRegistry(home="/h/.dsh")
    assert reg.collect(CTX) == {
        "DSH_HOME": "/h/.dsh",
        "DSH_SHELL": "1",
        "DSH_SESSION_ID": "sess-1",
    }
    ctx = ToolContext("sess-2", "/w", session_jsonl="/h/.dsh/sessions/sess-2.jsonl")
    assert reg.collect(ctx) == {
        "DSH_HOME": "/h/.dsh",
        "DSH_SHELL": "1",
        "DSH_SESSION_ID": "sess-2",
        "DSH_SESSION_JSONL": "/h/.dsh/sessions/sess-2.jsonl",
    }


def test_custom_prefix_and_relative_home_made_absolute() -> None:
    reg = ManagedEnvRegistry(home="rel/home", prefix="AGENT_")
    assert reg.collect(CTX) == {
        "AGENT_HOME": os.path.join(os.getcwd(), "rel/home"),
        "AGENT_SHELL": "1",
        "AGENT_SESSION_ID": "sess-1",
    }
    with pytest.raises(ValueError):
        reg.register(fixed("x", ("DSH_X",), {}))


def test_contributor_values_are_collected_per_context() -> None:
    reg = ManagedEnvRegistry(home="/h")
    seen: list[str] = []

    def resolve(ctx: ToolContext) -> Mapping[str, str]:
        seen.append(ctx.session_id)
        return {"DSH_PROJECT": f"p-{ctx.session_id}"}

    reg.register(ManagedEnvContributor("project", ("DSH_PROJECT", "DSH_UNUSED"), resolve))
    env = reg.collect(CTX)
    assert env["DSH_PROJECT"] == "p-sess-1"
    assert "DSH_UNUSED" not in env  # declared keys may be left unset
    assert seen == ["sess-1"]


def test_list_is_sorted_declared_keys_without_running_resolvers() -> None:
    reg = ManagedEnvRegistry(home="/h")

    def boom(_ctx: ToolContext) -> Mapping[str, str]:
        raise AssertionError("list() must not resolve")

    reg.register(ManagedEnvContributor("b", ("DSH_ZETA", "DSH_ALPHA"), boom))
    reg.register(ManagedEnvContributor("a", ("DSH_MID",), boom))
    assert reg.list() == ["DSH_ALPHA", "DSH_MID", "DSH_ZETA"]
    assert ManagedEnvRegistry(home="/h").list() == []


@pytest.mark.parametrize(
    "keys",
    [
        ("DSH_HOME",),
        ("DSH_SHELL",),
        ("DSH_SESSION_ID",),
        ("DSH_SESSION_JSONL",),
        ("PROJECT",),
        ("dsh_project",),
        ("DSH_",),
        ("DSH_A", "DSH_A"),
    ],
)
def test_bad_keys_are_refused(keys: tuple[str, ...]) -> None:
    reg = ManagedEnvRegistry(home="/h")
    with pytest.raises(ValueError):
        reg.register(fixed("bad", keys, {}))
    assert reg.list() == []


def test_a_key_has_one_owner_until_disposed() -> None:
    reg = ManagedEnvRegistry(home="/h")
    dispose = reg.register(fixed("first", ("DSH_A", "DSH_B"), {"DSH_A": "1"}))
    with pytest.raises(ValueError, match="already owned by 'first'"):
        reg.register(fixed("second", ("DSH_C", "DSH_B"), {}))
    # The refused contributor took nothing, not even its unclaimed key.
    assert reg.list() == ["DSH_A", "DSH_B"]
    dispose()
    dispose()
    assert reg.list() == []
    assert "DSH_A" not in reg.collect(CTX)
    reg.register(fixed("second", ("DSH_C", "DSH_B"), {"DSH_B": "2"}))
    assert reg.collect(CTX)["DSH_B"] == "2"


def test_undeclared_or_non_string_values_fail_at_collect() -> None:
    reg = ManagedEnvRegistry(home="/h")
    dispose = reg.register(fixed("sneaky", ("DSH_A",), {"DSH_A": "1", "DSH_HOME": "/evil"}))
    with pytest.raises(ValueError, match="undeclared key 'DSH_HOME'"):
        reg.collect(CTX)
    dispose()
    reg.register(fixed("typed", ("DSH_N",), {"DSH_N": 5}))  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="non-string"):
        reg.collect(CTX)


def test_resolver_errors_propagate() -> None:
    reg = ManagedEnvRegistry(home="/h")

    def broken(_ctx: ToolContext) -> Mapping[str, str]:
        raise RuntimeError("backend down")

    reg.register(ManagedEnvContributor("broken", ("DSH_X",), broken))
    with pytest.raises(RuntimeError, match="backend down"):
        reg.collect(CTX)

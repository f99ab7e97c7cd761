"""The child environment: scrub, managed prefix, terminal settings, caller layers, order."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conftest import run
from shellseam import LocalShellExecutor, SubprocessService


def child_env(ex: LocalShellExecutor, **fields: object) -> dict[str, str]:
    out = run(ex, "env -0", **fields).stdout.text
    return dict(item.split("=", 1) for item in out.split("\0") if item)


@pytest.fixture
def ambient() -> Iterator[None]:
    names = {
        "OPENAI_API_KEY": "sk-1",
        "my_secret_value": "s",
        "GH_TOKEN": "t",
        "DSH_SESSION_ID": "stale",
        "PLAIN_VALUE": "kept",
        "BASH_ENV": "/nonexistent/rc",
    }
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_scrub_drop_managed_and_terminal(ex: LocalShellExecutor, ambient: None) -> None:
    before = dict(os.environ)
    env = child_env(ex)
    assert "OPENAI_API_KEY" not in env and "my_secret_value" not in env and "GH_TOKEN" not in env
    assert "DSH_SESSION_ID" not in env and "BASH_ENV" not in env
    assert env["PLAIN_VALUE"] == "kept"
    for k, v in {
        "NO_COLOR": "1",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
    }.items():
        assert env[k] == v
    assert dict(os.environ) == before  # the harness's environment is never modified


def test_caller_env_wins_and_managed_env_is_last(ex: LocalShellExecutor, ambient: None) -> None:
    env = child_env(
        ex,
        env={"OPENAI_API_KEY": "mine", "TERM": "xterm", "DSH_HOME": "forged"},
        managed_env={"DSH_HOME": "/home/h", "DSH_SESSION_ID": "s1"},
    )
    assert env["OPENAI_API_KEY"] == "mine"  # explicit entries win even for scrubbed names
    assert env["TERM"] == "xterm"
    assert env["DSH_HOME"] == "/home/h" and env["DSH_SESSION_ID"] == "s1"


def test_caller_managed_prefix_names_are_ignored(ex: LocalShellExecutor) -> None:
    env = child_env(ex, env={"DSH_FORGED": "x"})
    assert "DSH_FORGED" not in env


def test_env_read_at_spawn_time(ex: LocalShellExecutor) -> None:
    os.environ["SHELLSEAM_LATE"] = "1"
    try:
        assert child_env(ex)["SHELLSEAM_LATE"] == "1"
    finally:
        del os.environ["SHELLSEAM_LATE"]


def test_custom_scrub_patterns_and_prefix(service: SubprocessService) -> None:
    ex = LocalShellExecutor(scrub_patterns=("PLAIN_*",), managed_prefix="XX_", service=service)
    os.environ["PLAIN_X"] = "1"
    os.environ["XX_Y"] = "1"
    os.environ["SOME_TOKEN"] = "1"
    try:
        env = child_env(ex)
    finally:
        for k in ("PLAIN_X", "XX_Y", "SOME_TOKEN"):
            del os.environ[k]
    assert "PLAIN_X" not in env and "XX_Y" not in env and env["SOME_TOKEN"] == "1"


def test_bash_env_startup_file_is_not_read(ex: LocalShellExecutor, tmp_path: object) -> None:
    rc = os.path.join(ex.cwd, "rc")
    with open(rc, "w") as f:
        f.write("echo SOURCED\n")
    os.environ["BASH_ENV"] = rc
    try:
        assert run(ex, "echo body").stdout.text == "body\n"
    finally:
        del os.environ["BASH_ENV"]


def test_cached_inherited_layer_follows_every_change(ex: LocalShellExecutor) -> None:
    os.environ["SHELLSEAM_CACHE"] = "a"
    try:
        assert child_env(ex)["SHELLSEAM_CACHE"] == "a"
        os.environ["SHELLSEAM_CACHE"] = "b"
        assert child_env(ex)["SHELLSEAM_CACHE"] == "b"
        del os.environ["SHELLSEAM_CACHE"]
        assert "SHELLSEAM_CACHE" not in child_env(ex)
        os.environ["SHELLSEAM_NEW_TOKEN"] = "secret"
        assert "SHELLSEAM_NEW_TOKEN" not in child_env(ex)
    finally:
        os.environ.pop("SHELLSEAM_CACHE", None)
        os.environ.pop("SHELLSEAM_NEW_TOKEN", None)

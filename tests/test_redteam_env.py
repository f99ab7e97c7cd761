"""Red team: credentials in the harness's environment that tried to slip past the scrub."""

from __future__ import annotations

import pytest

from conftest import run
from shellseam import LocalShellExecutor

LEAKED_BEFORE = {
    # Passwords typed without percent-encoding: SQLAlchemy-style URL parsers accept them, and
    # the scrub ended the authority at the first `/`, `?` or `#`, so the value reached the
    # command.
    "RT_DB_URL": "postgresql://app:pa/ss@db:5432/prod",
    "RT_REDIS_URL": "redis://:p#ss@cache:6379/0",
    "RT_AMQP_URL": "amqp://worker:p?x@broker/",
}
SCRUBBED_ALREADY = {
    "rt_api_key": "lower-case name",
    "Rt_Client_Secret": "mixed case",
    "rt_github_pat": "x",
    "rt_mysql_pwd": "x",
    "RT_HTTPS_URL": "HTTPS://U:P@H",
    "RT_PIP_INDEX": "--index-url https://u:tok@pypi.example/simple",
    "RT_GIT": "git+ssh://git:tok@github.com/x",
}
KEPT = {
    "RT_SERVICE": "http://localhost:8080/api",
    "RT_PROFILE": "http://host:8080/@user",
    "RT_NEXT": "https://example.org/login?next=a:b",
    "RT_SSH": "ssh://git@github.com/x",
}


@pytest.mark.parametrize("name", sorted({**LEAKED_BEFORE, **SCRUBBED_ALREADY}))
def test_credentials_never_reach_the_command(
    ex: LocalShellExecutor, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    value = {**LEAKED_BEFORE, **SCRUBBED_ALREADY}[name]
    monkeypatch.setenv(name, value)
    r = run(ex, f'printenv "{name}" || echo gone')
    assert r.stdout.text == "gone\n"


@pytest.mark.parametrize("name", sorted(KEPT))
def test_urls_without_a_password_are_kept(
    ex: LocalShellExecutor, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, KEPT[name])
    assert run(ex, f'printenv "{name}"').stdout.text == KEPT[name] + "\n"

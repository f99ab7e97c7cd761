"""The README opens with what shellseam is and `pip install shellseam`, its from-source
section starts with the two set-up commands, and its Python examples run as written.

The README is found in the repository root, which is the working directory of the test run
(`make test`, `.ci/run`) or ``$SHELLSEAM_REPO_ROOT``: never through this file's location, so the
suite also runs from a copy of ``tests/`` against an installed wheel.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("SHELLSEAM_REPO_ROOT") or os.getcwd())
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(
    not README.is_file(), reason="run from the repository root (or set SHELLSEAM_REPO_ROOT)"
)


def _blocks(lang: str, text: str | None = None) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text or README.read_text(), re.S)


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_readme_opens_with_what_it_is_then_the_two_setup_commands() -> None:
    # What shellseam is, then the two commands that work on a fresh machine (the package is
    # not on PyPI yet, so `pip install shellseam` follows in its own section).
    text = README.read_text()
    first_section = text[: text.index("\n## ")]
    assert "runs shell commands for LLM agents" in first_section
    assert _blocks("sh")[0].strip().splitlines() == ["make run", "make test"]
    assert _blocks("sh", _section("Install"))[0].strip() == "pip install shellseam"


def test_from_source_starts_with_the_two_setup_commands() -> None:
    commands = _blocks("sh", _section("From source"))[0].strip().splitlines()
    assert commands == ["make run", "make test"]


def test_requirements_name_the_kernel_of_each_feature() -> None:
    requirements = _section("Requirements")
    assert "Linux 5.13" in requirements and "Rust toolchain" in requirements
    for feature, kernel in (
        ("CLONE_PIDFD", "5.2"),
        ("CLONE_INTO_CGROUP", "5.7"),
        ("Landlock filesystem", "5.13"),
        ("cgroup.kill", "5.14"),
        ("ABI 4", "6.7"),
        ("ABI 6", "6.12"),
    ):
        row = next(line for line in requirements.splitlines() if feature in line)
        assert row.rstrip().endswith(f"| {kernel} |") or f"| {kernel} (required) |" in row, row


@pytest.mark.parametrize("index", [0, 1])
def test_python_examples_run(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = _blocks("python")[index]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})

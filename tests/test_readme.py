"""The README's Python API example runs as written, and its set-up commands are the two."""

from __future__ import annotations

import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def _blocks(lang: str) -> list[str]:
    with open(README) as f:
        return re.findall(rf"```{lang}\n(.*?)```", f.read(), re.S)


def test_readme_opens_with_two_setup_commands() -> None:
    first = _blocks("sh")[0].strip().splitlines()
    assert len(first) == 2
    assert "shellseam run" in first[0] and first[1] == "make test"


def test_python_api_example_runs() -> None:
    code = _blocks("python")[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})

"""Packaging: the metadata a wheel carries, the version's single source, and the wheel
workflow's shape (it cannot run here, so its YAML and matrix are checked instead).

Installed metadata is read through importlib.metadata (it holds for an installed wheel as
for a development install); the source files are read from the repository root, the working
directory of the test run (or ``$SHELLSEAM_REPO_ROOT``).
"""

from __future__ import annotations

import os
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import shellseam

ROOT = Path(os.environ.get("SHELLSEAM_REPO_ROOT") or os.getcwd())
in_checkout = pytest.mark.skipif(
    not (ROOT / "pyproject.toml").is_file(), reason="run from the repository root"
)


def _toml(name: str) -> dict[str, Any]:
    with open(ROOT / name, "rb") as f:
        return tomllib.load(f)


def test_version_is_the_installed_metadata_version() -> None:
    assert shellseam.__version__ == metadata.version("shellseam")


@in_checkout
def test_version_has_one_source_cargo_toml() -> None:
    pyproject = _toml("pyproject.toml")
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert metadata.version("shellseam") == _toml("Cargo.toml")["package"]["version"]


def test_installed_metadata_license_classifiers_urls() -> None:
    meta = metadata.metadata("shellseam")
    assert meta["License-Expression"] == "MIT"
    classifiers = set(meta.get_all("Classifier") or ())
    for expected in (
        "Typing :: Typed",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Rust",
    ):
        assert expected in classifiers, expected
    urls = {url.split(",")[0] for url in meta.get_all("Project-URL") or ()}
    assert {"Homepage", "Source", "Issues", "Changelog"} <= urls
    assert set(meta.get_all("Provides-Extra") or ()) >= {"mcp", "minisweagent", "ray"}
    assert "dev" not in set(meta.get_all("Provides-Extra") or ())
    # The description a package index shows opens with what shellseam is, not `pip install .`.
    description = meta.get_payload()  # type: ignore[attr-defined]
    assert description.startswith("# shellseam\n\nshellseam runs shell commands for LLM agents")


def test_the_license_file_ships_in_the_wheel() -> None:
    files = metadata.files("shellseam") or []
    licenses = [f for f in files if f.name == "LICENSE"]
    assert licenses, [str(f) for f in files]
    assert "MIT License" in licenses[0].read_text()


@in_checkout
def test_tools_live_in_dependency_groups_not_extras() -> None:
    pyproject = _toml("pyproject.toml")
    assert pyproject["project"]["license"] == "MIT"
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    assert "dev" not in pyproject["project"]["optional-dependencies"]
    groups = pyproject["dependency-groups"]
    test_group = " ".join(groups["test"])
    for tool in ("pytest", "hypothesis", "pytest-timeout", "pyyaml"):
        assert tool in test_group
    assert {"include-group": "test"} in groups["dev"] and {"include-group": "lint"} in groups["dev"]


@in_checkout
def test_release_profile_strips_the_extension() -> None:
    assert _toml("Cargo.toml")["profile"]["release"]["strip"] is True


# -- .github/workflows/wheels.yml ------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    yaml = pytest.importorskip("yaml")
    path = ROOT / ".github" / "workflows" / "wheels.yml"
    if not path.is_file():
        pytest.skip("run from the repository root")
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    return data


def _uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if str(s.get("uses", "")).startswith(action)]


def test_workflow_builds_the_wheel_matrix_with_maturin_action(workflow: dict[Any, Any]) -> None:
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert {"push", "pull_request"} <= set(triggers)
    wheels = workflow["jobs"]["wheels"]
    matrix = wheels["strategy"]["matrix"]
    assert set(matrix["target"]) == {"x86_64", "aarch64"}
    assert set(matrix["manylinux"]) == {"2_28", "musllinux_1_2"}
    (build,) = _uses(wheels, "PyO3/maturin-action@")
    assert build["with"]["target"] == "${{ matrix.target }}"
    assert build["with"]["manylinux"] == "${{ matrix.manylinux }}"
    assert "--release" in build["with"]["args"] and "--locked" in build["with"]["args"]


def test_workflow_builds_the_sdist_and_publishes_on_tags(workflow: dict[Any, Any]) -> None:
    jobs = workflow["jobs"]
    (sdist,) = _uses(jobs["sdist"], "PyO3/maturin-action@")
    assert sdist["with"]["command"] == "sdist"
    release = jobs["release"]
    assert set(release["needs"]) >= {"wheels", "sdist"}
    assert release["if"] == "startsWith(github.ref, 'refs/tags/')"
    assert release["permissions"] == {"id-token": "write"}
    assert _uses(release, "pypa/gh-action-pypi-publish@")

"""pyproject.toml's metadata tells the truth: the torch, triton and numpy this tier runs satisfy the ranges the
package declares (so the tested versions are inside them), and the README's support line names those ranges."""
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_installed_versions_satisfy_the_declared_ranges():
    requirements = pytest.importorskip("packaging.requirements")
    declared = [requirements.Requirement(r) for r in PROJECT["dependencies"]]
    assert {r.name for r in declared} == {"torch", "triton", "numpy"}
    for requirement in declared:
        installed = importlib.metadata.version(requirement.name).split("+")[0]
        assert requirement.specifier.contains(installed, prereleases=True), (requirement, installed)


def test_ranges_are_bounded_where_the_api_moves():
    """triton's Gluon API changes between releases: the range stops before the next one."""
    requirements = pytest.importorskip("packaging.requirements")
    triton = next(requirements.Requirement(r) for r in PROJECT["dependencies"] if r.startswith("triton"))
    assert any(spec.operator == "<" for spec in triton.specifier), triton


def test_readme_names_the_supported_versions():
    readme = (ROOT / "README.md").read_text()
    support = re.search(r"Support, as tested:(.*?)\n\n", readme, re.S)
    assert support, "README's support line"
    text = " ".join(support.group(1).split())
    torch_floor = re.search(r"torch>=([\d.]+)", " ".join(PROJECT["dependencies"])).group(1)
    assert f"torch ≥ {torch_floor}" in text and "triton 3.6" in text
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in PROJECT["classifiers"])


def test_license_is_declared_and_shipped():
    """The SPDX expression in the metadata names the license the LICENSE file holds, and the wheel carries the file."""
    assert PROJECT["license"] == "BSD-3-Clause" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])  # PEP 639: the expression instead

"""The rules of CONTRIBUTING.md that a machine can check: files a reader can hold, kernels with bundled arguments,
configs that are data, no run history in the package or the README, tests independent of scripts/."""
import ast
import re

import pytest
from helpers import ROOT

PACKAGE = sorted((ROOT / "flashtile").rglob("*.py"))
MAX_LINES = 600
MAX_PARAMETERS = 40


def _functions(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            yield node.name, len(a.posonlyargs + a.args + a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_the_package_is_found():
    assert len(PACKAGE) > 40 and (ROOT / "flashtile" / "kernels" / "hopper" / "fwd.py") in PACKAGE


@pytest.mark.parametrize("path", PACKAGE, ids=lambda p: str(p.relative_to(ROOT)))
def test_package_files_stay_short(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_no_function_takes_more_than_40_parameters():
    wide = [(str(p.relative_to(ROOT)), name, n) for p in PACKAGE for name, n in _functions(p) if n > MAX_PARAMETERS]
    assert not wide


def test_configs_are_data():
    """Comment lines under a quarter of the code lines of configs.py."""
    lines = [line.strip() for line in (ROOT / "flashtile" / "configs.py").read_text().splitlines() if line.strip()]
    comments = sum(line.startswith("#") for line in lines)
    assert comments * 4 < len(lines) - comments


HISTORY = re.compile(r"\b(run|call|stop|session) \d+\b|\brun\d+[a-z]?\b", re.IGNORECASE)


@pytest.mark.parametrize("path", [*PACKAGE, ROOT / "README.md", ROOT / "CONTRIBUTING.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_run_history(path):
    """The numbers and the story live in docs/perf/ and docs/results/, not in the code or the README."""
    hits = [line for line in path.read_text().splitlines() if HISTORY.search(line)]
    assert not hits


def test_history_pattern_finds_history():
    assert HISTORY.search("measured in run 36, call 6") and HISTORY.search("docs/results/bench-run45.md")
    assert not HISTORY.search("runs 128 rows a step") and not HISTORY.search("call the kernel")


SCRIPTS = {p.stem for p in (ROOT / "scripts").glob("*.py")}


@pytest.mark.parametrize("path", sorted((ROOT / "tests").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_import_nothing_from_scripts(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    assert not imported & (SCRIPTS | {"scripts"})


def test_the_project_files_exist():
    for name in ("LICENSE", "CONTRIBUTING.md", "docs/architecture.md", "docs/env.md"):
        assert (ROOT / name).is_file(), name
    assert len((ROOT / "README.md").read_text().splitlines()) < 250

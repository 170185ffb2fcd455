"""One-way imports: the library never imports the gate, the tools or the tests; the gate never
imports the tools or the tests; the gate's decisions (attnkit_perf.decide) import neither torch
nor the measuring code nor the orchestrator; no test module imports another. Checked on
the source with ast, so an import inside a function body counts as much as one at the top."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TESTS = REPO / "tests"
#: A string that is a path into the test tree (a file to run), not prose that mentions it.
TEST_TREE_PATH = re.compile(r"^(\./)?tests(/[\w.\-]+)*/?$|tests/\S+\.py")


def imports(source: str, package: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``source``; relative imports are resolved
    against ``package`` (the parts of the module's package, e.g. ``("attnkit", "triton")``).
    ``from pkg import name`` yields ``pkg`` and ``pkg.name`` (name may be a submodule)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*parent, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _file_imports(path: Path) -> list[tuple[int, str]]:
    package = path.relative_to(SRC).parent.parts if path.is_relative_to(SRC) else ()
    return imports(path.read_text(encoding="utf8"), package)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("attnkit", ("attnkit_perf", "attnkit_tools", "tests")),
        ("attnkit_perf", ("attnkit_tools", "tests")),
    ],
)
def test_imports_point_one_way(package, forbidden):
    files = _python_files(SRC / package)
    assert files, f"no source files under {SRC / package}"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module.split(".")[0] in forbidden
    ]
    assert not bad, f"{package} must not import {', '.join(forbidden)}:\n" + "\n".join(bad)


def test_the_decisions_are_pure():
    """attnkit_perf.decide holds every rule that turns measurements into an outcome, as functions
    of plain values: testable without a GPU, and never a way back into the orchestrator."""
    forbidden = ("torch", "attnkit_perf.measure", "attnkit_perf.session", "attnkit_perf.plugin")
    files = _python_files(SRC / "attnkit_perf" / "decide")
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert files and not bad, "attnkit_perf.decide must stay pure:\n" + "\n".join(bad)


def _names_a_test_file(text: str) -> bool:
    return bool(TEST_TREE_PATH.search(text.strip())) and " " not in text.strip()


def test_no_package_code_names_a_file_of_the_test_tree():
    """Package code must not run tests (bench/baseline.py ran tests/perf/test_attention_perf.py);
    prose that tells people to run ``pytest tests/perf`` is fine."""
    bad = []
    for path in _python_files(SRC):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _names_a_test_file(node.value)
            ):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not bad, "package code names files of the test tree:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "folder",
    [
        "gate",
        "perf",
        "correctness",
    ],
)
def test_no_test_module_imports_another(folder):
    modules = {p.stem for p in _python_files(TESTS) if p.name.startswith("test_")}
    assert "test_layout" in modules, f"test modules not found under {TESTS}"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _python_files(TESTS / folder)
        for line, module in _file_imports(path)
        if set(module.split(".")) & modules or module.split(".")[0] == "tests"
    ]
    assert not bad, (
        "tests share code through helper modules (perf_synthetic, strategies), not:\n" + "\n".join(bad)
    )


def test_every_test_folder_is_checked():
    folders = {p.parent.name for p in TESTS.rglob("test_*.py")}
    assert folders <= {"gate", "perf", "correctness"}, (
        f"add {folders - {'gate', 'perf', 'correctness'}} above"
    )


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("def f():\n    from ..attnkit_perf import gate\n", ("attnkit",), "attnkit_perf"),
        ("from . import registry\n", ("attnkit", "triton"), "attnkit.triton.registry"),
        ("import attnkit_tools.grid as g\n", (), "attnkit_tools.grid"),
        ("from test_report import write\n", (), "test_report"),
    ],
)
def test_the_scan_resolves_nested_and_relative_imports(source, package, expected):
    found = [module for _, module in imports(source, package)]
    assert expected in found, f"{source!r} in {package}: found {found}"


@pytest.mark.parametrize(
    ("text", "names_a_file"),
    [
        ("tests/perf/test_attention_perf.py", True),
        ("tests/perf", True),
        ("pytest tests/perf --attnkit-record", False),
        ("see tests/correctness for the rule", False),
    ],
)
def test_the_test_tree_pattern(text, names_a_file):
    assert _names_a_test_file(text) is names_a_file, f"{text!r}: want {names_a_file}"

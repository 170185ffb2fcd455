"""The maps of the tree in the docs match the tree: README's Structure block and PERF_GATE.md's
Layout block name only folders and modules that exist, and together name every package under
``src/``. A map that drifts sends a newcomer to a folder that is not there, or hides one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"

#: (document, heading of the section whose first code block is the map)
MAPS = (("README.md", "## Structure"), ("docs/PERF_GATE.md", "## Layout"))

FOLDER = re.compile(r"(?<![\w./<-])([A-Za-z_][\w.-]*(?:/[A-Za-z_][\w.-]*)*/)(?![\w<])")
MODULE = re.compile(r"(?<![\w/.<*-])([A-Za-z_]\w*\.py)\b")


def map_block(document: str, heading: str) -> str:
    """The first fenced block after ``heading`` in ``document``."""
    text = (REPO / document).read_text()
    assert heading in text, f"{document} has no section {heading!r}"
    after = text.split(heading, 1)[1]
    match = re.search(r"```[^\n]*\n(.*?)```", after, re.S)
    assert match, f"{document}'s {heading!r} section has no code block"
    return match.group(1)


def _tree_folders() -> set[str]:
    """Every folder of the repository, by each of its path suffixes ("gluon/", "triton/gluon/")."""
    names = set()
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if not path.is_dir() or any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        for start in range(len(rel.parts)):
            names.add("/".join(rel.parts[start:]) + "/")
    return names


def _tree_modules() -> set[str]:
    return {p.name for root in (SRC, REPO / "tests") for p in root.rglob("*.py")}


@pytest.mark.parametrize(("document", "heading"), MAPS)
def test_every_folder_and_module_a_map_names_exists(document, heading):
    block = map_block(document, heading)
    folders, modules = _tree_folders(), _tree_modules()
    missing = sorted({f for f in FOLDER.findall(block) if f not in folders})
    missing += sorted({m for m in MODULE.findall(block) if m not in modules})
    assert not missing, f"{document} ({heading}) names what the tree does not have: {missing}"


def test_every_package_is_named_in_a_map():
    named = set()
    for document, heading in MAPS:
        named |= set(FOLDER.findall(map_block(document, heading)))
    packages = sorted(p.parent for p in SRC.rglob("__init__.py") if "__pycache__" not in p.parts)
    # A package is named by any tail of its path: "gluon/", "triton/gluon/", "src/attnkit/".
    unnamed = []
    for package in packages:
        parts = package.relative_to(REPO).parts
        if not any("/".join(parts[start:]) + "/" in named for start in range(len(parts))):
            unnamed.append("/".join(parts))
    assert not unnamed, f"packages no map names (README.md Structure, docs/PERF_GATE.md Layout): {unnamed}"


def test_the_checks_catch_a_stale_name():
    """The patterns find folder and module names the way the maps write them."""
    line = "  run/   options.py (the options), sides.py; tests/perf/  gate_changes/ (patches)"
    assert FOLDER.findall(line) == ["run/", "tests/perf/", "gate_changes/"]
    assert MODULE.findall(line) == ["options.py", "sides.py"]
    assert "changes/" not in _tree_folders()

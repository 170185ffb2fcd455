"""One-way imports: the library never imports the gate, the tools or the tests; the gate never
imports the tools or the tests, and inside it the file formats (attnkit_perf.formats) import none
of the gate's other parts, the stages (measure, decide, report, history) never import the run
that sequences them, the run never imports the pytest entry, the commands or the
installed perf tests (attnkit_perf.suite: a leaf); the gate's decisions (attnkit_perf.decide)
import neither torch nor the measuring code; no test module imports another. Checked on
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


#: The perf gate's tests installed with it (``pytest --pyargs attnkit_perf.suite``): test code on
#: top of the gate's run and its pytest entry.
PERF_TESTS = SRC / "attnkit_perf" / "suite"


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


#: What the history package may import from attnkit_perf: it reads files the gate wrote, and runs
#: where the dashboard is built (a CPU job without torch or a GPU stack).
HISTORY_MAY_IMPORT = ("attnkit_perf.history", "attnkit_perf.formats.schema")


def test_the_history_package_needs_no_torch_and_no_gate_internals():
    files = _python_files(SRC / "attnkit_perf" / "history")
    assert files, "no source files under src/attnkit_perf/history"

    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module.split(".")[0] in ("torch", "triton", "attnkit")
        or (
            module.startswith("attnkit_perf")
            and not module.startswith(HISTORY_MAY_IMPORT)
            and module != "attnkit_perf"
        )
    ]
    assert not bad, (
        f"attnkit_perf.history may import only {HISTORY_MAY_IMPORT} of the project:\n" + "\n".join(bad)
    )


#: The gate's floors, lowest first: a part may import its own floor and those below. The file
#: formats know nothing of who writes or reads them; the stages (``bench``: the measuring stage's
#: public door) know nothing of the run that sequences them; the pytest entry sits on the run; on
#: top, the commands and the installed perf tests, each a leaf that no other part imports.
GATE_FLOORS = (
    ("formats",),
    ("measure", "bench", "decide", "report", "history"),
    ("run",),
    ("plugin",),
    ("commands", "suite"),
)


def _gate_part(module: str) -> str | None:
    """The part of the gate ``module`` belongs to (``run`` for ``attnkit_perf.run.session``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "attnkit_perf" and len(parts) > 1 else None


def _floor(part: str | None) -> int:
    return next((level for level, floor in enumerate(GATE_FLOORS) if part in floor), -1)


@pytest.mark.parametrize("level", range(len(GATE_FLOORS)))
def test_the_gate_imports_down_its_floors(level):
    gate = SRC / "attnkit_perf"
    files = {
        path: name
        for name in GATE_FLOORS[level]
        for path in (_python_files(gate / name) if (gate / name).is_dir() else [gate / f"{name}.py"])
    }
    assert all(p.is_file() for p in files), f"missing: {[str(p) for p in files if not p.is_file()]}"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path, own in files.items()
        for line, module in _file_imports(path)
        if _floor(_gate_part(module)) > level
        or (_floor(_gate_part(module)) == len(GATE_FLOORS) - 1 and _gate_part(module) != own)
    ]
    assert not bad, f"attnkit_perf's {GATE_FLOORS[level]} import above their floor:\n" + "\n".join(bad)


def test_the_installed_perf_tests_are_a_leaf():
    """attnkit_perf.suite imports the gate's run; so nothing in the library or the gate imports
    it (no cycle between the floors)."""
    assert (PERF_TESTS / "__init__.py").is_file(), f"{PERF_TESTS} is not a package"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for package in ("attnkit", "attnkit_perf", "attnkit_pytest")
        for path in _python_files(SRC / package)
        if not path.is_relative_to(PERF_TESTS)
        for line, module in _file_imports(path)
        if module == "attnkit_perf.suite" or module.startswith("attnkit_perf.suite.")
    ]
    assert not bad, "attnkit_perf.suite is a leaf: only tests import it:\n" + "\n".join(bad)


#: The parts of attnkit that are test code shipped with the package: only they may import the
#: test frameworks, so that ``import attnkit`` needs neither pytest nor hypothesis.
TEST_PARTS = ("testing", "suite")


def test_the_library_imports_no_test_framework():
    files = [
        p for p in _python_files(SRC / "attnkit") if p.relative_to(SRC / "attnkit").parts[0] not in TEST_PARTS
    ]
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module.split(".")[0] in ("pytest", "hypothesis", "_pytest")
        or module.split(".")[:2] in (["attnkit", part] for part in TEST_PARTS)
    ]
    assert not bad, (
        f"attnkit outside {TEST_PARTS} must not import the test frameworks or them:\n" + "\n".join(bad)
    )


def test_the_decisions_are_pure():
    """attnkit_perf.decide holds every rule that turns measurements into an outcome, as functions
    of plain values: testable without a GPU, and never a way back into the orchestrator."""
    forbidden = (
        "torch",
        "attnkit_perf.measure",
        "attnkit_perf.run",
        "attnkit_perf.plugin",
        "attnkit_perf.commands",
        "attnkit_perf.suite",
    )
    files = _python_files(SRC / "attnkit_perf" / "decide")

    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert files and not bad, "attnkit_perf.decide must stay pure:\n" + "\n".join(bad)


#: What reading or writing a file looks like in source: the gate's JSON reader, and the calls
#: that open a file.
FILE_ACCESS = {"attnkit_perf.formats.schema.read_json", "open", "read_text", "write_text", "read_bytes"}


def test_the_decisions_read_and_write_no_file():
    """The gate's file formats (paths, readers, writers, schemas) live in attnkit_perf.formats:
    attnkit_perf.decide holds no data file and no module of it opens one."""
    decide = SRC / "attnkit_perf" / "decide"
    data = [
        str(p.relative_to(REPO))
        for p in decide.rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    ]
    access = []
    for path in _python_files(decide):
        source = path.read_text(encoding="utf8")
        access += [
            f"{path.relative_to(REPO)}:{line} imports {m}" for line, m in imports(source) if m in FILE_ACCESS
        ]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in FILE_ACCESS:
                    access.append(f"{path.relative_to(REPO)}:{node.lineno} calls {name}")
    assert not data and not access, "attnkit_perf.decide reads or holds files:\n" + "\n".join(data + access)
    # The scan sees a reader where there is one.
    assert any(
        m in FILE_ACCESS for _, m in imports((SRC / "attnkit_perf" / "formats" / "baseline.py").read_text())
    ), "formats/baseline.py reads with read_json: the scan above would find nothing"


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
        "tools",
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
    checked = {"gate", "perf", "correctness", "tools"}
    assert folders <= checked, f"add {folders - checked} above"


def _private_names(module: str) -> list[str]:
    return [part for part in module.split(".") if part.startswith("_") and not part.startswith("__")]


def test_the_tools_use_only_public_names_of_the_library():
    """A tool is a user of attnkit: what it needs from the library is public, so a refactor of
    the library's insides cannot silently break the commands that regenerate the docs."""
    files = _python_files(SRC / "attnkit_tools")
    assert files, f"no source files under {SRC / 'attnkit_tools'}"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module.split(".")[0] == "attnkit" and _private_names(module)
    ]
    assert not bad, "attnkit_tools imports private names of attnkit:\n" + "\n".join(bad)


#: The jobs the tools are grouped by, each a package of attnkit_tools; beside them only the
#: package's door and ``attnkit-demo``.
TOOL_JOBS = ("gate", "pages", "tune")
TOOL_LOOSE_MODULES = ("__init__.py", "demo.py")


def test_the_tools_are_grouped_by_job():
    """A tool lives in the package of its job (``attnkit_tools.pages.grid``), so the folder says
    what each command is for; a module dropped beside the jobs is a drawer growing back."""
    tools = SRC / "attnkit_tools"
    folders = sorted(p.name for p in tools.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(TOOL_JOBS), f"attnkit_tools' packages are {folders}, want {sorted(TOOL_JOBS)}"
    assert all((tools / job / "__init__.py").is_file() for job in TOOL_JOBS), "a job folder is not a package"
    loose = sorted(p.name for p in tools.glob("*.py") if p.name not in TOOL_LOOSE_MODULES)
    assert not loose, f"modules outside a job in attnkit_tools: {loose}: move each into {TOOL_JOBS}"


#: What the measuring stage shows to code outside the gate: cases, runners, timing, the machine.
BENCH_DOOR = "attnkit_perf.bench"


@pytest.mark.parametrize("outside", ["attnkit_tools", "attnkit_perf/suite"])
def test_code_outside_the_measuring_stage_times_through_the_bench_door(outside):
    """The tools and the installed perf tests time with the gate's cases, runners and timing,
    imported from :mod:`attnkit_perf.bench`, never from the modules of attnkit_perf.measure: those
    can then be reshaped without breaking a command that regenerates the docs."""
    files = _python_files(SRC / outside)
    assert files, f"no source files under {SRC / outside}"
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module == "attnkit_perf.measure" or module.startswith("attnkit_perf.measure.")
    ]
    assert not bad, f"{outside} reaches into the measuring stage; import from {BENCH_DOOR}:\n" + "\n".join(
        bad
    )
    assert any(module == BENCH_DOOR for path in files for _, module in _file_imports(path)), (
        f"{outside} no longer imports {BENCH_DOOR}: the rule above checks nothing"
    )


def test_there_is_one_home_for_tools():
    """Tools are modules of attnkit_tools, run as ``python -m attnkit_tools.<job>.<tool>`` and tested;
    a loose scripts folder beside them would be a second home."""
    message = "a tools/ folder exists: make each script a tested module of attnkit_tools"
    assert not (REPO / "tools").exists(), message


@pytest.mark.parametrize(
    ("module", "private"),
    [
        ("attnkit.triton.launch._DOT_PRECISION", ["_DOT_PRECISION"]),
        ("attnkit.triton.forward_kernels._plain_fwd_kernel", ["_plain_fwd_kernel"]),
        ("attnkit.triton.__init__", []),
        ("attnkit.testing.compare_to_reference", []),
    ],
)
def test_the_private_name_scan(module, private):
    assert _private_names(module) == private, module


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("def f():\n    from ..attnkit_perf import gate\n", ("attnkit",), "attnkit_perf"),
        ("from . import registry\n", ("attnkit", "triton"), "attnkit.triton.registry"),
        ("import attnkit_tools.pages.grid as g\n", (), "attnkit_tools.pages.grid"),
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


#: attnkit.sdpa's modules in import order: each may import only those before it (the package's
#: ``__init__`` re-exports the public names and comes last).
SDPA_ORDER = ("support", "layout", "forcing", "calls", "split_causal", "lower_right", "semantics", "prepare")


def test_the_sdpa_package_imports_one_way():
    folder = SRC / "attnkit" / "sdpa"
    assert {p.stem for p in _python_files(folder)} == {*SDPA_ORDER, "__init__"}, (
        f"a module was added to or removed from {folder}: place it in SDPA_ORDER"
    )
    bad = []
    for position, name in enumerate(SDPA_ORDER):
        for line, module in _file_imports(folder / f"{name}.py"):
            parts = module.split(".")
            if parts[:2] == ["attnkit", "sdpa"] and len(parts) > 2 and parts[2] not in SDPA_ORDER[:position]:
                bad.append(f"attnkit/sdpa/{name}.py:{line} imports {module}")
    assert not bad, "attnkit.sdpa's modules import only modules listed before them:\n" + "\n".join(bad)


#: Who may import the compiled fast path, and what: the dispatcher its memo. Everything else
#: reaches it through attnkit.prepared (the Triton path describes its launches there, with
#: attnkit.triton.native_launch).
FASTPATH_IMPORTERS = {
    "attnkit/api.py": {"attnkit.fastpath"},
}


def test_the_fast_path_is_one_package_entered_through_the_prepared_run():
    """The fast path imports only attnkit's cache location and the prepared-run types; outside
    it, only the importers above touch it, and only as listed."""
    fastpath = SRC / "attnkit" / "fastpath"
    inward = [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for path in _python_files(fastpath)
        for line, module in _file_imports(path)
        if module.startswith("attnkit")
        and not module.startswith(("attnkit.fastpath", "attnkit.cache", "attnkit.prepared"))
    ]
    assert not inward, "the fast path depends on more of attnkit than the prepared run:\n" + "\n".join(inward)
    outward = []
    for path in _python_files(SRC / "attnkit"):
        if path.is_relative_to(fastpath):
            continue
        where = str(path.relative_to(SRC))
        found = {
            m for _, m in _file_imports(path) if m == "attnkit.fastpath" or m.startswith("attnkit.fastpath.")
        }
        if found - FASTPATH_IMPORTERS.get(where, set()):
            outward.append(f"{where} imports {sorted(found - FASTPATH_IMPORTERS.get(where, set()))}")
    assert not outward, "attnkit reaches into the fast path:\n" + "\n".join(outward)


def test_only_the_gluon_package_imports_the_experimental_triton_api():
    """``triton.experimental`` (Gluon) changes between triton releases: one package owns it, is
    imported so that it never fails (:mod:`attnkit.triton.gluon`), and the rest of the library
    reaches it only through that package's availability check."""
    gluon = SRC / "attnkit" / "triton" / "gluon"
    files = [p for p in _python_files(SRC) if not p.is_relative_to(gluon)]
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in files
        for line, module in _file_imports(path)
        if module == "triton.experimental" or module.startswith("triton.experimental.")
    ]
    assert not bad, "only attnkit.triton.gluon may import triton.experimental:\n" + "\n".join(bad)
    assert any(
        module.startswith("triton.experimental")
        for path in _python_files(gluon)
        for _, module in _file_imports(path)
    ), "attnkit.triton.gluon no longer imports triton.experimental: the rule above checks nothing"


def test_the_readme_names_every_outcome_the_gate_can_give():
    from attnkit_perf.formats.verdict import OUTCOMES

    readme = (REPO / "README.md").read_text()
    listed = readme.split("says per benchmark one of", 1)[1].split("\n\n", 1)[0]
    missing = [outcome for outcome in OUTCOMES if outcome not in listed]
    assert missing == [], f"README's list of the gate's outcomes lacks {missing}"

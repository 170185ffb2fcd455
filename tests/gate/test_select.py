"""What a diff can affect (attnkit_perf.select), on planted diffs: each changed file's effect,
the rows and tests kept, and git's view of committed, uncommitted, untracked, deleted and
renamed files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import attnkit
from attnkit.auto import AutoTable, fallback_order
from attnkit.builtins import builtin_names
from attnkit.reference import naive_attention
from attnkit.registry import get_backend
from attnkit_perf.formats.schema import validate
from attnkit_perf.measure.cases import gpu_suite_cases
from attnkit_perf.select.changes import changed_files
from attnkit_perf.select.rules import Affected, DependencyMap, affected

ROOT = Path(__file__).resolve().parents[2]
H200, H100 = "nvidia-h200", "nvidia-h100-80gb-hbm3"
SDPA = {"sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"}
#: ``backend="auto"``'s rows: a change to a backend it may dispatch to reaches them.
AUTO = "auto"
BACKWARD = ("bwd", "fwd+bwd")


@pytest.fixture(scope="module")
def deps() -> DependencyMap:
    return DependencyMap(ROOT)


def rows_run(changed: list[str], gpu: str) -> set[tuple[str, str]]:
    decision = affected(ROOT, "base", changed, gpu)
    return {
        (c.backend, c.pass_name)
        for c in gpu_suite_cases()
        if decision.row_skip(c.backend, c.pass_name) is None
    }


def every_row() -> set[tuple[str, str]]:
    return {(c.backend, c.pass_name) for c in gpu_suite_cases()}


def rows_of(backends, passes=("fwd", "bwd", "fwd+bwd")) -> set[tuple[str, str]]:
    """The grid's (backend, pass) rows of ``backends`` timing one of ``passes``."""
    return {r for r in every_row() if r[0] in backends and r[1] in passes}


def test_every_file_under_src_is_mapped_or_runs_everything(deps):
    """No file can silently select nothing: each is shared, a backend's, a test entry point,
    declared as affecting nothing, or (unmapped) everything."""
    for path in sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*") if p.is_file()):
        if "__pycache__" in path:
            continue
        effect = deps.effect(path)
        assert effect.kind in ("everything", "backends", "correctness", "nothing"), path
        if effect.kind == "backends":
            assert effect.backends, f"{path} maps to no backend"
        if effect.kind == "nothing":
            assert path.endswith(".md"), f"{path} affects nothing: only documentation may"


def test_the_declared_roots_are_the_registered_backends_functions(deps):
    """The table's roots name the functions attnkit registers for each own backend."""
    table = deps.table["backends"]
    for name in builtin_names():
        spec = table[name]
        spec = table.get(spec.get("same_as"), spec)
        backend = get_backend(name)
        functions = [backend.fn, backend.run, backend.prepare, backend.device_support, backend.supports]
        for fn in filter(None, functions):
            fn = getattr(fn, "func", fn)
            if fn.__module__.startswith("attnkit.registry"):
                continue
            root = f"{fn.__module__}:{fn.__qualname__}"
            resolved = {n for r in spec["roots"] for n in deps.graph.resolve(*r.split(":"))}
            assert deps.graph.resolve(fn.__module__, fn.__qualname__)[0] in resolved, (name, root)


def test_a_tile_table_runs_triton_rows_of_its_gpu_only():
    table = [f"src/attnkit/triton/configs/{H200}.json"]
    assert rows_run(table, H200) == rows_of({"triton", AUTO})
    assert rows_run(table, H100) == set()


def test_the_backward_kernels_run_every_triton_row():
    """The forward reaches them too (LaunchSetup names the backward kernels for every problem):
    no forward row can be proven unaffected, so every Triton row runs (and auto's)."""
    ran = rows_run(["src/attnkit/triton/backward_kernels.py"], H200)
    assert ran == rows_of({"triton", AUTO})


def test_the_shared_autograd_function_runs_tiled_and_triton():
    """The installed suite's log-sum-exp test imports flash_autograd's PATHS but calls the flash
    op only for the backends registered there (dependencies.json narrows that edge): a change
    runs the backends whose code reaches it, not every backend."""
    ran = rows_run(["src/attnkit/flash_autograd.py"], H200)
    assert {b for b, _ in ran} == {"tiled", "triton", AUTO}


@pytest.mark.parametrize(
    "path",
    [
        "src/attnkit/triton/gluon/hopper_forward.py",
        "src/attnkit/triton/gluon/forward_launch.py",
        "src/attnkit/triton/gluon/route.py",
        "src/attnkit/triton/gluon/config.py",
        "src/attnkit/triton/plan.py",
        "src/attnkit/triton/softmax.py",
        "src/attnkit/triton/native_launch.py",
    ],
)
def test_a_gluon_forward_or_plan_file_runs_every_triton_row(path):
    assert rows_run([path], H200) == rows_of({"triton", AUTO})


@pytest.mark.parametrize(
    "path", ["src/attnkit/triton/gluon/hopper_backward.py", "src/attnkit/triton/gluon/backward_launch.py"]
)
def test_a_gluon_backward_file_runs_the_triton_rows_timing_a_backward(path):
    ran = rows_run([path], H200)
    assert ran == rows_of({"triton", AUTO}, BACKWARD)
    assert ("triton", "bwd") in ran and (AUTO, "fwd+bwd") in ran, "the grid has their backward rows"


def test_every_path_the_map_declares_exists(deps):
    """No stale entry: each declared glob matches a tracked file, each module and root a module
    of the tree."""
    import importlib

    from attnkit_perf.select.rules import _glob

    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    files = tracked.stdout.split()
    table = deps.table
    globs = [p for key in ("shared", "tests_only", "nothing", "test_modules") for p in table[key]["paths"]]
    globs += [p for entry in table["data"] for p in entry["paths"]]
    for pattern in globs:
        assert any(_glob(pattern).match(f) for f in files), f"dependencies.json: {pattern} matches no file"
    modules = [*table["registration"]["modules"]]
    modules += [m for n in table["narrowed"] for m in (n["from"], n["to"])]
    for module in modules:
        assert module in deps.graph.modules, f"dependencies.json: no module {module}"
    roots = [r for spec in table["backends"].values() for r in spec.get("roots", ())]
    for entry in (e for e in table["data"] if "read_by" in e):
        readers = entry["read_by"]
        roots += [readers] if isinstance(readers, str) else readers
    for root in roots:
        assert deps.graph.resolve(*root.split(":")), f"dependencies.json: {root} names nothing"
    for name, spec in table["backends"].items():
        targets = spec.get("dispatches_to")
        if targets is None:
            continue
        assert any(_glob(targets["tables"]).match(f) for f in files), f"{name}: {targets['tables']}"
        for function in (targets["fallback"], targets["read_with"]):
            module, _, attribute = function.partition(":")
            assert callable(getattr(importlib.import_module(module), attribute, None)), function


def test_sdpa_runs_every_sdpa_backend():
    ran = rows_run(["src/attnkit/sdpa/semantics.py"], H200)
    assert {b for b, _ in ran} == (SDPA | {AUTO}) & {c.backend for c in gpu_suite_cases()}


def test_auto_and_its_tables_run_the_auto_rows_only(deps):
    """The grid times ``backend="auto"`` (forward and training step): a change to its dispatch
    or to one GPU model's auto table is measured there, on that model."""
    assert rows_of({AUTO}) == {(AUTO, "fwd"), (AUTO, "fwd+bwd")}
    for path in ("src/attnkit/auto.py", f"src/attnkit/auto_tables/{H100}.json"):
        decision = affected(ROOT, "base", [path], H100)
        assert set(decision.backends) == {AUTO}, path
        assert rows_run([path], H100) == rows_of({AUTO})
    assert affected(ROOT, "base", [f"src/attnkit/auto_tables/{H100}.json"], H200).backends == {}
    assert rows_run([f"src/attnkit/auto_tables/{H100}.json"], H200) == set()


def test_auto_runs_for_a_change_to_a_backend_it_may_run_and_for_no_other(deps):
    """``auto`` runs its GPU model's measured paths, then the backends that declare an auto rank:
    a change to one of them reaches auto's rows; a change to flex (neither ranked nor measured)
    runs flex's alone. The decision survives the selection file."""
    measured = AutoTable(json.loads((ROOT / f"src/attnkit/auto_tables/{H200}.json").read_text()), "t").paths
    targets = deps.dispatch_targets(H200)[AUTO]
    assert set(targets) == set(fallback_order()) | measured and "flex" not in targets
    assert deps.dispatch_targets("a-gpu-never-measured")[AUTO] == tuple(sorted(fallback_order()))
    for path, expected in [
        ("src/attnkit/flex.py", {"flex": "all"}),
        ("src/attnkit/tiled.py", {"tiled": "all", AUTO: "all"}),
        ("src/attnkit/sdpa/semantics.py", {**dict.fromkeys(SDPA, "all"), AUTO: "all"}),
    ]:
        decision = affected(ROOT, "base", [path], H200)
        assert decision.backends == expected, path
        data = json.loads(json.dumps(decision.to_dict()))
        validate("selection", data, "the selection made")
        assert Affected.from_dict(data, H200).backends == expected, path


def test_a_backend_registered_with_an_auto_rank_is_one_auto_may_run(deps):
    attnkit.register_backend("ranked-plugin", run=naive_attention, auto_rank=50)
    try:
        assert "ranked-plugin" in deps.dispatch_targets(H200)[AUTO]
    finally:
        attnkit.unregister_backend("ranked-plugin")
    assert "ranked-plugin" not in deps.dispatch_targets(H200)[AUTO]


@pytest.mark.parametrize(
    "path",
    [
        "src/attnkit/brand_new_module.py",
        "pyproject.toml",
        "src/attnkit_perf/plugin.py",
        "src/attnkit_perf/select/rules.py",
        "src/attnkit_pytest/__init__.py",
        "tests/correctness/conftest.py",
        ".ci/gpu-gate.sh",
        "src/attnkit/api.py",
        "src/attnkit/registry.py",
        "a/file/nothing/maps.txt",
    ],
)
def test_shared_new_and_unmapped_files_run_everything(path):
    assert rows_run([path], H200) == every_row()


def test_documentation_runs_nothing():
    assert rows_run(["docs/PERF_GATE.md", "README.md"], H200) == set()


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def test_changed_files_sees_committed_uncommitted_untracked_deleted_and_renamed(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for name in ("kept.py", "edited.py", "deleted.py", "renamed.py", "committed.py"):
        (repo / name).write_text(f"# {name}\nvalue = '{name}' * 40\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-qb", "pr")
    (repo / "committed.py").write_text("changed = 1\n")
    _git(repo, "mv", "renamed.py", "moved.py")
    _git(repo, "commit", "-qam", "pr")
    (repo / "edited.py").write_text("uncommitted = 1\n")
    (repo / "deleted.py").unlink()
    (repo / "untracked.py").write_text("new = 1\n")
    assert changed_files(repo, "main") == [
        "committed.py",
        "deleted.py",
        "edited.py",
        "moved.py",
        "renamed.py",
        "untracked.py",
    ]


def test_a_deleted_or_renamed_module_runs_everything():
    gone = ["src/attnkit/triton/removed_helper.py"]
    assert rows_run(gone, H200) == every_row()


def test_a_verdict_with_nothing_affected_passes_only_for_that_reason():
    from attnkit_perf.formats.verdict import VerdictDocument
    from attnkit_perf.report.terminal import summary_line

    selection = {"base": "main", "everything": False, "selected": 0, "skipped": [{"reason": "r", "count": 3}]}
    doc = VerdictDocument("paired", {"label": "b"}, {"label": "h"}, {}, [], selection=selection)
    assert doc.passed and "nothing to compare" in summary_line(doc)
    assert not VerdictDocument("paired", {"label": "b"}, {"label": "h"}, {}, []).passed
    selection = {**selection, "selected": 2}
    assert not VerdictDocument("paired", {"label": "b"}, {"label": "h"}, {}, [], selection=selection).passed


CORRECTNESS_TESTS = {
    "tests/correctness/test_triton_named.py": 'def test_names_triton():\n    assert "triton"\n',
    "tests/correctness/test_by_backend.py": (
        "import pytest\n\n\n"
        '@pytest.mark.parametrize("backend", ["triton", "tiled", "sdpa-math"])\n'
        "def test_each(backend):\n    assert backend\n"
    ),
    "tests/correctness/test_independent.py": "def test_alone():\n    assert 1\n",
}


def _commit_base(repo: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) into ``repo`` and commit everything there as the
    base of a planted change."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")


@pytest.fixture
def planted(pytester, monkeypatch):
    """A git repository with the library's source (linked) and three correctness test modules,
    committed: ``change(path)`` plants a changed file, ``run()`` selects against the commit."""
    (pytester.path / "src").symlink_to(ROOT / "src", target_is_directory=True)
    _commit_base(pytester.path, CORRECTNESS_TESTS)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")

    def change(path: str) -> None:
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("# changed\n")

    def run(*extra):
        args = ("-p", "attnkit_perf.plugin", "--attnkit-changes-since", "main", *extra, *CORRECTNESS_TESTS)
        return pytester.runpytest_inprocess(*args)

    return change, run


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_documentation_alone_deselects_every_test_and_passes_for_that_reason(planted, workers):
    change, run = planted
    change("docs/NOTES.md")
    result = run(*workers)
    assert result.ret == 0, result.stdout.str()
    if not workers:  # xdist's workers print their selection lines where the controller does not show them
        result.stdout.fnmatch_lines(["*attnkit select (changes since main): nothing:*", "*5 deselected*"])


def test_shared_code_runs_every_test(planted):
    change, run = planted
    change("pyproject.toml")
    result = run()
    result.assert_outcomes(passed=5)


def test_a_table_of_every_backend_keeps_the_backend_tests_not_the_independent_ones(planted):
    change, run = planted
    change("baselines/cpu-x86_64/noise-paired.json")
    result = run()
    result.assert_outcomes(passed=4, deselected=1)
    result.stdout.fnmatch_lines(["*1 deselected: backend-independent tests: no shared code changed"])


def test_a_changed_test_module_runs_itself(planted, pytester):
    change, run = planted
    (pytester.path / "tests/correctness/test_independent.py").write_text("def test_alone():\n    assert 2\n")
    change("docs/NOTES.md")
    result = run()
    result.assert_outcomes(passed=1, deselected=4)


def test_the_perf_grid_keeps_the_rows_of_the_backends_a_change_reaches(pytester, monkeypatch):
    """A copy of the source with tiled.py changed: of the CPU smoke grid only the tiled rows stay;
    every GPU row (of other backends) is deselected with its reason."""
    import shutil

    shutil.copytree(ROOT / "src", pytester.path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    _commit_base(pytester.path, {})
    with open(pytester.path / "src/attnkit/tiled.py", "a") as f:
        f.write("\n# changed\n")
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    # -p: attnkit's plugin loads the gate's for --pyargs attnkit_perf.suite; an installed attnkit
    # loads it as its entry point of the same name, a checkout's src/ on the path does not.
    result = pytester.runpytest_inprocess(
        "-p", "attnkit_pytest", "--pyargs", "attnkit_perf.suite", "--attnkit-changes-since", "main",
        "--collect-only", "-q",
    )  # fmt: skip
    names = [line for line in result.stdout.lines if "::test_" in line]
    assert names and all("[tiled-" in line or "[auto-" in line for line in names), names
    assert any("[auto-" in line for line in names), "auto may dispatch to tiled: its rows run"
    result.stdout.fnmatch_lines(["*deselected: backend naive: no changed file reaches its code"])


@pytest.mark.parametrize("backend", ["naive", "tiled", "sdpa", "sdpa-math", "sdpa-flash", "triton"])
def test_what_a_backend_runs_on_the_cpu_is_mapped_to_it(deps, backend):
    """Every library function a call enters (forward alone, then a training step) lies in a
    module the map gives that backend (for that pass) or calls shared: the derivation holds
    for what actually runs, kernels interpreted by Triton included."""
    import sys

    import torch

    if attnkit.unavailable_reason(backend, "cpu"):
        pytest.skip(attnkit.unavailable_reason(backend, "cpu"))
    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    for training in (False, True):
        entered: set[str] = set()

        def profile(frame, event, arg, entered=entered):
            if event == "call":
                entered.add(frame.f_globals.get("__name__") or "")

        leaves = [x.clone().requires_grad_(training) for x in (q, k, v)]
        sys.setprofile(profile)
        try:
            out = attnkit.attention(*leaves, causal=True, backend=backend)
            if training:
                out.sum().backward()
        finally:
            sys.setprofile(None)
        for module in sorted(m for m in entered if m.startswith("attnkit.")):
            if module in deps.shared_modules:
                continue
            passes = deps.passes_by_module.get(module, {}).get(backend)
            assert passes is not None, f"{backend} ran {module}, which the map does not give it"
            assert training or passes == "all", (
                f"{backend}'s forward ran {module}, mapped to its backward only"
            )


def _retuned(family: str | None, section: str = "families") -> str:
    """The H200 tile table as the base had it, with one entry of ``section`` (slash-separated
    key path) different (None: only its provenance, and the Gluon section's)."""
    import json

    table = json.loads((ROOT / f"src/attnkit/triton/configs/{H200}.json").read_text())
    if family is None:
        table["provenance"] = {"planted": True}
        table["gluon"]["provenance"] = {"planted": True}
        table["gluon"]["provenance_of"] = {}
        return json.dumps(table)
    entries = table
    for key in section.split("/"):
        entries = entries[key]
    old = entries.get(family)  # a routed cell's N, a tile config, or absent (a new cell)
    entries[family] = old + 1 if isinstance(old, int) else {**(old or {}), "planted": True}
    return json.dumps(table)


@pytest.mark.parametrize(
    ("family", "head_dims"),
    [("16bit-d128-causal", {128}), ("16bit-d64-full", {64}), (None, set())],
    ids=["d128-causal", "d64-full", "provenance-only"],
)
def test_a_retuned_family_runs_the_triton_rows_that_read_it(family, head_dims):
    """The base's table compared entry by entry: a call reads its own family (get_config: dtype
    class, padded head dim, causal mode), so only the rows of the changed family run, auto's
    among them (it may dispatch to Triton); a table whose families are unchanged runs none."""
    path = f"src/attnkit/triton/configs/{H200}.json"
    decision = affected(ROOT, "base", [path], H200, before=lambda p: _retuned(family) if p == path else None)
    ran = {c for c in gpu_suite_cases() if decision.row_skip(c.backend, c.pass_name, c) is None}
    assert {c.head_dim for c in ran} == head_dims
    causal = family is not None and family.endswith("causal")
    expected = {
        c
        for c in gpu_suite_cases()
        if c.backend in ("triton", AUTO) and c.head_dim in head_dims and c.causal == causal
    }
    assert ran == expected
    assert head_dims != {64} or not any(c.backend == AUTO for c in ran), "auto's rows are D=128"


def test_a_plugin_backend_is_never_deselected():
    """Its code is not in the map: a diff that runs no attnkit row still runs a plugin's."""
    decision = affected(ROOT, "base", ["docs/PERF_GATE.md"], H200)
    assert decision.row_skip("my-plugin-kernel", "fwd") is None
    assert decision.row_skip("triton", "fwd") is not None


def _rows_after(section: str, entry: str | None, gpu: str) -> set:
    path = f"src/attnkit/triton/configs/{H200}.json"
    before = _retuned(entry, section)
    decision = affected(ROOT, "base", [path], gpu, before=lambda p: before if p == path else None)
    return {c for c in gpu_suite_cases() if decision.row_skip(c.backend, c.pass_name, c) is None}


@pytest.mark.parametrize(
    ("section", "cell", "passes"),
    [
        ("gluon/forward", "d128-causal", ("fwd", "bwd", "fwd+bwd")),
        ("gluon/routed/forward", "d64-full", ("fwd", "bwd", "fwd+bwd")),
        ("gluon/backward", "d64-causal", BACKWARD),
        ("gluon/routed/backward", "d128-full", BACKWARD),
    ],
)
def test_a_changed_gluon_cell_runs_every_row_of_its_reader(section, cell, passes):
    """The Gluon section's readers parse every cell of their part (forward_configs,
    backward_configs, routed_cells): one changed cell reaches every Triton row (and auto's) of the
    passes that part configures (a backward part: rows timing a backward), on that GPU model only."""
    expected = {c for c in gpu_suite_cases() if c.backend in ("triton", AUTO) and c.pass_name in passes}
    assert {c.head_dim for c in expected} == {64, 128}
    assert _rows_after(section, cell, H200) == expected
    assert _rows_after(section, cell, H100) == set()


def test_a_provenance_only_change_runs_nothing():
    """Where the table and its Gluon section were measured: no library code reads it."""
    path = f"src/attnkit/triton/configs/{H200}.json"
    decision = affected(ROOT, "base", [path], H200, before=lambda p: _retuned(None) if p == path else None)
    assert decision.backends == {} and not decision.everything
    assert decision.effects[0].kind == "nothing"


def test_an_unknown_part_of_the_table_runs_every_triton_row():
    """A key no rule knows (neither entries nor declared unread) may be read by any row."""
    import json

    path = f"src/attnkit/triton/configs/{H200}.json"
    table = json.loads((ROOT / path).read_text())
    table["gluon"]["new_knob"] = 1
    decision = affected(ROOT, "base", [path], H200, before=lambda p: json.dumps(table) if p == path else None)
    cases = gpu_suite_cases()
    ran = {(c.backend, c.pass_name) for c in cases if decision.row_skip(c.backend, c.pass_name, c) is None}
    assert ran == rows_of({"triton", AUTO})


def test_a_routed_cell_reaches_triton_tests_on_every_gpu():
    """Routed cells of every packaged table are triton's dispatch boundaries (its scale-tier
    tests), on any GPU model; its perf rows only on the table's."""
    path = f"src/attnkit/triton/configs/{H200}.json"
    before = _retuned("d64-full", "gluon/routed/forward")
    decision = affected(ROOT, "base", [path], H100, before=lambda p: before if p == path else None)
    assert decision.backends == {} and "triton" in decision.test_backends
    new_table = DependencyMap(ROOT).effect(path)  # no base text: any cell may differ
    assert new_table.tests_every_gpu


#: Correctness modules of a planted repository: one reaching the KV-cache entry point, one
#: parametrized over backends alone, one naming a backend, one independent of any.
KVCACHE_TESTS = {
    **CORRECTNESS_TESTS,
    "tests/correctness/test_cache_by_backend.py": (
        "import pytest\n\nfrom attnkit import attention_with_kvcache\n\n\n"
        '@pytest.mark.parametrize("backend", ["triton", "tiled", "naive"])\n'
        "def test_cache(backend):\n    assert attention_with_kvcache\n"
    ),
}


@pytest.fixture
def planted_source(pytester, monkeypatch):
    """A git repository with a copy of the library's source and :data:`KVCACHE_TESTS`,
    committed: ``edit(path)`` changes a source file, ``run()`` selects against the commit."""
    import shutil

    shutil.copytree(ROOT / "src", pytester.path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    _commit_base(pytester.path, KVCACHE_TESTS)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")

    def edit(path: str) -> None:
        with open(pytester.path / path, "a") as f:
            f.write("\n# changed\n")

    def run():
        args = ("-p", "attnkit_perf.plugin", "--attnkit-changes-since", "main", "-v", *KVCACHE_TESTS)
        return pytester.runpytest_inprocess(*args)

    return edit, run


def _passed(result) -> set[str]:
    return {line.split("::")[1].split(" ")[0] for line in result.stdout.lines if " PASSED" in line}


@pytest.mark.parametrize("path", ["src/attnkit/kvcache.py", "src/attnkit/kvcache_inputs.py"])
def test_a_kvcache_change_keeps_every_backends_kvcache_tests(planted_source, path):
    """The KV-cache code is no backend's: every backend's test of a module that reaches it runs
    (a paged-gather bug shows on the backends' oracle tests), and nothing else."""
    edit, run = planted_source
    edit(path)
    result = run()
    result.assert_outcomes(passed=3, deselected=5)
    assert _passed(result) == {"test_cache[triton]", "test_cache[tiled]", "test_cache[naive]"}


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("src/attnkit/tiled.py", {"test_cache[tiled]", "test_each[tiled]"}),
        (
            "src/attnkit/triton/decode.py",
            {"test_cache[triton]", "test_each[triton]", "test_each[sdpa-math]", "test_names_triton"},
        ),
    ],
    ids=["tiled", "triton-decode"],
)
def test_a_change_to_backend_code_narrows_to_that_backends_tests(planted_source, path, kept):
    """A backend parameter narrows a change to backend code, even in a module that imports the
    changed file: the KV-cache tests of the other backends do not run that code."""
    edit, run = planted_source
    edit(path)
    result = run()
    assert _passed(result) == kept, result.stdout.str()
    result.assert_outcomes(passed=len(kept), deselected=8 - len(kept))


#: A tile-table entry test module (as tests/correctness/test_tile_table.py parametrizes it).
ENTRY_TESTS = {
    **KVCACHE_TESTS,
    "tests/correctness/test_entries.py": (
        "import pytest\n\nfrom attnkit.triton.config import get_config\n\n\n"
        '@pytest.mark.parametrize("tile_table_entry", [\n'
        f'    "{H200}:families/16bit-d64-full", "{H200}:families/16bit-d128-full",\n'
        f'    "{H100}:families/16bit-d64-full",\n'
        "])\n"
        "def test_entry(tile_table_entry):\n    assert get_config\n"
    ),
}


def _edit_table(repo: Path, section: str, name: str, kernel: str | None = "fwd", value=None) -> None:
    """Change one entry of the H200 table in ``repo``: a kernel's block_n in ``families``, or a
    Gluon cell (``kernel`` None: the cell replaced by ``value``)."""
    import json

    path = repo / f"src/attnkit/triton/configs/{H200}.json"
    table = json.loads(path.read_text())
    entries = table
    for key in section.split("/"):
        entries = entries[key]
    if kernel is None:
        entries[name] = value
    else:
        entries[name][kernel]["block_n"] = (
            value if value is not None else 64 + 128 - entries[name][kernel]["block_n"]
        )
    path.write_text(json.dumps(table, indent=1))


@pytest.fixture
def planted_entries(pytester, monkeypatch):
    import shutil

    shutil.copytree(ROOT / "src", pytester.path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    _commit_base(pytester.path, ENTRY_TESTS)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    # The run's GPU model is the changed table's (the selection applies a GPU-keyed table there).
    monkeypatch.setattr("attnkit_perf.run.session.gpu_key", lambda device=None: H200)

    def run():
        args = ("-p", "attnkit_perf.plugin", "--attnkit-changes-since", "main", "-v", *ENTRY_TESTS)
        return pytester.runpytest_inprocess(*args)

    return pytester.path, run


def test_a_changed_tile_entry_runs_that_entrys_tests_alone(planted_entries):
    """A call reads its own family's entry, and the entry's tests run its config on shapes of its
    family: a diff that changes only entries runs their tests, not the Triton suite."""
    repo, run = planted_entries
    _edit_table(repo, "families", "16bit-d64-full")
    result = run()
    assert _passed(result) == {f"test_entry[{H200}:families/16bit-d64-full]"}, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*deselected: tests of table entries that did not change",
        f"*deselected: tests of triton: only table entries changed ({H200}:families/16bit-d64-full)*",
    ])  # fmt: skip


def test_an_entry_the_library_refuses_runs_its_tests_which_fail_on_it(planted_entries):
    """A refused entry counts as changed: its tests run, and the entry's config fails to parse there."""
    repo, run = planted_entries
    _edit_table(repo, "families", "16bit-d128-full", "dq", 7)
    result = run()
    assert _passed(result) == {f"test_entry[{H200}:families/16bit-d128-full]"}, result.stdout.str()


@pytest.mark.parametrize("change", ["code", "gluon-cell"])
def test_code_or_an_entry_without_tests_of_its_own_runs_the_whole_triton_suite(planted_entries, change):
    """A Gluon cell is parsed with every cell of its part, and code reaches any call: no narrowing."""
    repo, run = planted_entries
    if change == "code":
        _edit_table(repo, "families", "16bit-d64-full")
        with open(repo / "src/attnkit/triton/decode.py", "a") as f:
            f.write("\n# changed\n")
    else:
        _edit_table(repo, "gluon/forward", "d64-full", None, {"block_m": 64})
    result = run()
    kept = {
        f"test_entry[{e}]"
        for e in (
            f"{H200}:families/16bit-d64-full",
            f"{H200}:families/16bit-d128-full",
            f"{H100}:families/16bit-d64-full",
        )
    }
    kept |= {"test_cache[triton]", "test_each[triton]", "test_names_triton"}
    if change == "code":
        kept.add("test_each[sdpa-math]")  # decode.py is reached through the sdpa-math path too
    assert _passed(result) == kept, result.stdout.str()


def test_a_gpu_key_with_no_data_here_is_named_not_silently_taken(capsys):
    """A misspelt --gpu would make a GPU-keyed change select nothing: the command says that the
    key holds no data here (a new GPU model may be meant), and names the models that do."""
    from attnkit_perf.select.__main__ import main

    assert DependencyMap(ROOT).gpu_keys() >= {H200, H100}
    assert main(["--base", "HEAD", "--root", str(ROOT), "--gpu", "nvidai-h200"]) == 0
    err = capsys.readouterr().err
    assert "--gpu 'nvidai-h200' holds no table or baseline here" in err and H200 in err, err
    assert main(["--base", "HEAD", "--root", str(ROOT), "--gpu", H200]) == 0
    assert "holds no table" not in capsys.readouterr().err

"""The installed perf gate (``pytest --pyargs attnkit_perf.suite``) on a repository other than attnkit's:
a throwaway git repository whose package registers a backend through an ``attnkit.backends``
entry point, compared between two of its own commits in paired mode on the CPU.

The package is installed as an editable install of a src layout is: its ``*.dist-info`` (with
``entry_points.txt``) in a site folder, and the working tree's ``src`` on the path after it.
Each side's worker must still import the package from that side's commit (its import roots
come first on the worker's path): a base that ran the head's code would make the slowdown
invisible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnkit
from attnkit_perf.formats.schema import validate
from attnkit_perf.measure.paired_session import PairedSession
from attnkit_perf.measure.processes import WorkerError

BACKEND = "perfkernel"
#: The CPU smoke benchmarks a run selects: this backend's forward and attnkit's naive one.
SELECT = "cpu_smoke and fwd and not causal"
MINE = f"fwd[{BACKEND}-fp32-B1-H2-N128-D32]"
NAIVE = "fwd[naive-fp32-B1-H2-N128-D32]"

KERNEL = '''"""A small attention kernel registered with attnkit through an entry point."""

import torch

#: How many times the scores are computed; the result is the last one.
REPEATS = {repeats}


def _once(q, k, v, causal, scale):
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        rows = torch.arange(n, device=q.device)[:, None]
        cols = torch.arange(m, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (m - n), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attend(q, k, v, *, causal, scale, window):
    """q (B, H, N, D), k and v (B, H, M, D) -> (B, H, N, D)."""
    for _ in range(REPEATS):
        out = _once(q, k, v, causal, scale)
    return out


def supports(problem):
    if problem.window is not None:
        return "no sliding windows"
    return "no GQA" if problem.kv_heads != problem.q_heads else None
'''

PACKAGE_INIT = f"""from attnkit import Backend

from perfkernel.kernel import attend, supports

backend = Backend({BACKEND!r}, attend, supports=supports, description="a test kernel")
"""


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _write_package(repo: Path, repeats: int) -> None:
    package = repo / "src" / "perfkernel"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "kernel.py").write_text(KERNEL.format(repeats=repeats))


@pytest.fixture(scope="module")
def plugin_repo(tmp_path_factory) -> dict:
    """The repository and its commits: ``empty`` (no src/), ``other`` (src/ without the package),
    ``fast``, ``docs`` (a README), then ``slow`` (the kernel computed 20 times), checked out;
    ``site``: the install."""
    root = tmp_path_factory.mktemp("external")
    repo, site = root / "repo", root / "site"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "pyproject.toml").write_text('[project]\nname = "perfkernel"\n\n[tool.attnkit]\nsrc = ["src"]\n')
    commits = {"empty": _commit(repo, "a project without sources")}
    (repo / "src").mkdir()
    (repo / "src" / "other.py").write_text("")
    commits["other"] = _commit(repo, "sources, no kernel yet")
    _write_package(repo, repeats=1)
    commits["fast"] = _commit(repo, "the kernel")
    (repo / "README.md").write_text("A kernel.\n")
    commits["docs"] = _commit(repo, "a README")
    _write_package(repo, repeats=20)
    commits["slow"] = _commit(repo, "compute the scores twenty times")
    info = site / "perfkernel-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: perfkernel\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[attnkit.backends]\n{BACKEND} = perfkernel:backend\n")
    return {"repo": repo, "site": site, **commits}


def _environment(plugin_repo: dict) -> dict:
    repo = plugin_repo["repo"]
    attnkit_root = str(Path(attnkit.__file__).resolve().parents[1])
    env = {
        **os.environ,
        # The editable install's order: its metadata, then the working tree's src/ (a .pth entry).
        "PYTHONPATH": os.pathsep.join([str(plugin_repo["site"]), str(repo / "src"), attnkit_root]),
        "ATTNKIT_TEST_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _gate(plugin_repo: dict, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    repo, env = plugin_repo["repo"], _environment(plugin_repo)
    command = [sys.executable, "-m", "pytest", "--pyargs", "attnkit_perf.suite", "-p", "attnkit_pytest",
               "-p", "no:cacheprovider", "-q", "--attnkit-allow-cpu", *args]  # fmt: skip
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    return result, result.stdout + result.stderr


def _paired(plugin_repo: dict, tmp_path: Path, base: str, *backends: str) -> tuple[int, dict, str]:
    verdict = tmp_path / "verdict.json"
    result, output = _gate(
        plugin_repo,
        tmp_path,
        "-k",
        SELECT,
        *(f"--attnkit-backend={b}" for b in backends),
        f"--attnkit-base={base}",
        "--attnkit-budget-s=5",
        # A shared 2-core runner moves single blocks by 10-45%, and a worker process's host time by
        # up to 1.8x: both practical thresholds are set where twenty computations instead of one
        # are far beyond them and CPU contention is not (on the CPU the host time per call is the
        # whole computation).
        "--attnkit-slower=0.5",
        "--attnkit-host-slower=0.5",
        f"--attnkit-verdict-json={verdict}",
    )
    assert verdict.is_file(), f"no verdict (exit {result.returncode}):\n{output[-4000:]}"
    data = json.loads(verdict.read_text())
    validate("verdict", data, str(verdict))
    return result.returncode, data, output


def _rows(verdict: dict) -> dict[str, dict]:
    return {row["name"]: row for row in verdict["benchmarks"]}


def test_a_slower_commit_of_the_plugin_fails_on_its_benchmarks_only_and_unchanged_it_passes(
    plugin_repo, tmp_path
):
    repo = plugin_repo["repo"]
    _git(repo, "checkout", "-q", plugin_repo["slow"])
    code, verdict, output = _paired(plugin_repo, tmp_path / "slow", plugin_repo["fast"], BACKEND, "naive")
    rows = _rows(verdict)
    assert set(rows) == {MINE, NAIVE}, f"benchmarks run: {sorted(rows)}\n{output[-3000:]}"
    mine = rows[MINE]
    assert mine["outcome"] == "slower" and mine["ratio"] > 3, f"{mine}\n{output[-3000:]}"
    assert mine["host"]["outcome"] == "slower" and mine["host"]["ratio"] > 3, mine["host"]
    assert rows[NAIVE]["outcome"] in ("same", "inconclusive"), f"{rows[NAIVE]}\n{output[-3000:]}"
    assert code == 1 and verdict["passed"] is False, f"exit {code}\n{output[-3000:]}"
    assert plugin_repo["fast"] in verdict["base"]["label"], verdict["base"]["label"]
    sources = [verdict[side]["provenance"]["source"] for side in ("base", "head")]
    assert sources[0] != sources[1], f"the two commits are other code: {sources}"

    _git(repo, "checkout", "-q", plugin_repo["fast"])
    code, verdict, output = _paired(plugin_repo, tmp_path / "same", plugin_repo["fast"], BACKEND)
    row = _rows(verdict)[MINE]
    assert row["outcome"] in ("same", "inconclusive"), f"{row}\n{output[-3000:]}"
    assert code == 0 and verdict["passed"] is True, f"exit {code}\n{output[-3000:]}"


def test_a_base_without_the_backends_package_makes_its_benchmarks_new(plugin_repo, tmp_path):
    """The kernel is new in this commit: the base's workers do not have its package (the
    install's copy, the head's, does not stand in for it), so its cases are new, not failed."""
    _git(plugin_repo["repo"], "checkout", "-q", plugin_repo["fast"])
    # attnkit's naive path beside it: a run that compared nothing at all would fail.
    code, verdict, output = _paired(plugin_repo, tmp_path, plugin_repo["other"], BACKEND, "naive")
    rows = _rows(verdict)
    row = rows[MINE]
    assert row["outcome"] == "new", f"{row}\n{output[-3000:]}"
    assert rows[NAIVE]["outcome"] in ("same", "inconclusive"), f"{rows[NAIVE]}\n{output[-3000:]}"
    assert "its module perfkernel.kernel is not in the base's import roots" in row["reason"], row["reason"]
    assert code == 0 and verdict["passed"] is True, f"exit {code}\n{output[-3000:]}"


def test_a_base_without_the_import_root_is_a_usage_error(plugin_repo, tmp_path):
    _git(plugin_repo["repo"], "checkout", "-q", plugin_repo["fast"])
    result, output = _gate(
        plugin_repo, tmp_path, f"--attnkit-backend={BACKEND}", f"--attnkit-base={plugin_repo['empty']}"
    )
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, f"exit {result.returncode}\n{output[-3000:]}"
    expected = "the import root 'src' is not a folder at that commit"
    assert expected in output and plugin_repo["empty"][:12] in output, output[-3000:]


def test_without_a_backend_named_the_repositorys_own_backends_are_timed(plugin_repo, tmp_path):
    _git(plugin_repo["repo"], "checkout", "-q", plugin_repo["fast"])
    result, output = _gate(plugin_repo, tmp_path, "--collect-only")
    assert result.returncode == 0, output[-3000:]
    collected = [line for line in output.splitlines() if "::" in line]
    assert collected and all(BACKEND in line for line in collected), "\n".join(collected)
    assert any("test_fwd_bwd[" in line for line in collected), "a kernel with a backward has training steps"


# --- where each side imported the backend from --------------------------------------------


class _Worker:
    label = "base[0]"


def _session(tmp_path: Path) -> PairedSession:
    """A session of two sides' roots, its workers not started: only the check is exercised."""
    session = PairedSession.__new__(PairedSession)
    session.sides = {"base": [tmp_path / "base" / "src"], "head": [tmp_path / "head" / "src"]}
    session.checked_backends = (BACKEND,)
    for side in session.sides:
        (tmp_path / side / "src" / "perfkernel").mkdir(parents=True)
        (tmp_path / side / "src" / "perfkernel" / "__init__.py").write_text("")
    return session


def _found(file: Path) -> dict:
    return {"found": {BACKEND: {"module": "perfkernel.kernel", "file": str(file)}}}


def test_a_side_that_imported_its_own_copy_passes_the_check(tmp_path):
    session = _session(tmp_path)
    mine = tmp_path / "base" / "src" / "perfkernel" / "kernel.py"
    assert session._check_backends("base", _Worker(), _found(mine)) == {}


def test_a_side_whose_copy_is_shadowed_is_an_error_naming_both_places(tmp_path):
    session = _session(tmp_path)
    installed = tmp_path / "site-packages" / "perfkernel" / "kernel.py"
    with pytest.raises(WorkerError) as caught:
        session._check_backends("base", _Worker(), _found(installed))
    message = str(caught.value)
    for part in (f"backend {BACKEND!r}", str(installed), "another copy shadows the side's source", "-e"):
        assert part in message, f"{part!r} missing from: {message}"


def test_a_head_whose_backend_is_not_in_the_roots_is_an_error(tmp_path):
    session = _session(tmp_path)
    session.sides["head"] = [tmp_path / "lib"]
    (tmp_path / "lib").mkdir()
    with pytest.raises(
        WorkerError, match=r"not in the repository's import roots: check \[tool.attnkit\] src"
    ):
        session._check_backends("head", _Worker(), _found(tmp_path / "head" / "src" / "perfkernel" / "k.py"))


def test_a_base_whose_entry_points_fail_does_not_have_the_backends(tmp_path):
    session = _session(tmp_path)
    absent = session._check_backends(
        "base", _Worker(), {"error": "BackendEntryPointError: importing it failed"}
    )
    assert absent == {BACKEND: "its backends do not load there (BackendEntryPointError: importing it failed)"}


def test_the_repository_records_its_baseline_and_compares_with_it(plugin_repo, tmp_path):
    """Stored mode in another repository: the baseline lives under its rootdir, the usage error
    names the command that records it, and a run compares with what it recorded: the kernel made
    twenty times slower fails against it.

    No unchanged-code claim here: on a shared CPU machine the same code timed twice, seconds
    apart, differs by up to 1.8x (the host's state, not the code). Stored mode cannot tell that
    from a change; paired mode can, and the unchanged-code check is made there."""
    repo = plugin_repo["repo"]
    _git(repo, "checkout", "-q", plugin_repo["fast"])
    select = ("-k", SELECT, f"--attnkit-backend={BACKEND}")
    result, output = _gate(plugin_repo, tmp_path, *select, "--benchmark-compare")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert f"pytest --pyargs attnkit_perf.suite --attnkit-backend {BACKEND} --attnkit-record" in output, (
        output
    )

    result, output = _gate(plugin_repo, tmp_path, *select, "--attnkit-record")
    baselines = list((repo / "baselines").glob("*/baseline.json"))
    assert result.returncode == 0 and len(baselines) == 1, f"{baselines}\n{output[-3000:]}"
    recorded = json.loads(baselines[0].read_text())
    assert [b["extra_info"]["name"] for b in recorded["benchmarks"]] == [MINE], recorded["benchmarks"]
    recorded_median_ms = recorded["benchmarks"][0]["stats"]["median"] * 1e3

    _git(repo, "checkout", "-q", plugin_repo["slow"])
    verdict = tmp_path / "verdict.json"
    result, output = _gate(
        plugin_repo,
        tmp_path,
        *select,
        "--benchmark-compare",
        "--attnkit-slower=0.5",
        f"--attnkit-verdict-json={verdict}",
    )
    rows = _rows(json.loads(verdict.read_text()))
    assert list(rows) == [MINE], rows
    row = rows[MINE]
    assert row["base_median_ms"] == pytest.approx(recorded_median_ms), (row, recorded_median_ms)
    assert row["outcome"] == "slower" and row["ratio"] > 5, row
    assert f"adjudicated by paired vs {plugin_repo['fast'][:12]}" in row["reason"], row["reason"]
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, output[-3000:]


def test_bisect_finds_the_repositorys_commit_that_made_its_kernel_slower(plugin_repo):
    """Bisect over the repository's own commits: each side is that commit's import roots over the
    installed attnkit, as in paired mode. One candidate keeps it to one comparison on the CPU;
    the search itself is tested in test_bisect.py."""
    repo = plugin_repo["repo"]
    command = [sys.executable, "-m", "attnkit_perf.commands.bisect", plugin_repo["docs"], plugin_repo["slow"],
               "-k", MINE, "--repo", str(repo), "--allow-cpu", "--slower=0.5", "--budget-s=5"]  # fmt: skip
    result = subprocess.run(
        command, cwd=repo, env=_environment(plugin_repo), capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"first slower commit: {plugin_repo['slow']} compute the scores twenty times" in output, output


# --- which backends a run times -----------------------------------------------------------


def _config(*names: str):
    from types import SimpleNamespace

    return SimpleNamespace(getoption=lambda option, default=None: list(names))


def test_without_a_name_another_repository_times_the_backends_its_roots_hold(tmp_path):
    from attnkit_perf.measure.repo import Repository
    from attnkit_perf.run.backend_choice import grid_backends, grid_cases

    (tmp_path / "src" / "zzkernel").mkdir(parents=True)
    (tmp_path / "src" / "zzkernel" / "__init__.py").write_text("")

    def fn(q, k, v, *, causal, scale, window):
        return q

    fn.__module__ = "zzkernel.kernel"
    attnkit.register_backend("zz", fn, forward_only=True)
    try:
        external = Repository(tmp_path, ("src",), own=False)
        assert grid_backends(_config(), external) == ["zz"]
        assert grid_backends(_config("zz", "naive"), external) == ["zz", "naive"]
        assert grid_backends(_config(), Repository(tmp_path, ("src",), own=True)) is None
        assert grid_backends(_config(), None) is None
        assert {c.pass_name for c in grid_cases(["zz"], gpu=True)} == {"fwd"}, "forward-only: forwards"
        with pytest.raises(pytest.UsageError, match=r"no backend of .* is registered \(registered from"):
            grid_backends(_config(), Repository(tmp_path, ("lib",), own=False))
    finally:
        attnkit.unregister_backend("zz")
    with pytest.raises(pytest.UsageError, match="--attnkit-backend: 'zz' is not registered"):
        grid_backends(_config("zz"), None)


def test_the_import_roots_come_from_pyproject_or_the_layout(tmp_path):
    from attnkit_perf.measure.repo import RepositoryError, import_roots

    assert import_roots(tmp_path) == (".",)
    (tmp_path / "src").mkdir()
    assert import_roots(tmp_path) == ("src",)
    (tmp_path / "lib").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.attnkit]\nsrc = ["lib", "src"]\n')
    assert import_roots(tmp_path) == ("lib", "src")
    for bad, message in (
        ('src = "src"', "expected a non-empty list of folders"),
        ('src = ["../elsewhere"]', "must be a folder inside the repository"),
        ('src = ["nope"]', "names 'nope', which is not a folder of"),
    ):
        (tmp_path / "pyproject.toml").write_text(f"[tool.attnkit]\n{bad}\n")
        with pytest.raises(RepositoryError, match=message):
            import_roots(tmp_path)

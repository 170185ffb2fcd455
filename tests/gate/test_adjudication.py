"""A stored "slower" adjudicated by paired mode against the baseline's commit before it fails:
the rule's wording, the baseline's source found (or not) in a real git repository, and the whole
path on the CPU: a copy of this checkout committed to a fresh repository, a baseline recorded
there, then compared in stored mode and adjudicated by real worker processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from perf_synthetic import FAST_PROBES, SHAPE, SYNTHETIC_SUITE

from attnkit_perf.decide import gate
from attnkit_perf.decide.adjudication import adjudicated, kept, source_problem
from attnkit_perf.formats.schema import validate
from attnkit_perf.measure.machine import source_digest
from attnkit_perf.run.stored_recheck import Adjudicator, adjudicate_rows

REPO = Path(__file__).resolve().parents[2]
STORED = gate.Thresholds(slower=gate.Thresholds.STORED_SLOWER)


def _git(repo: Path, *args: str) -> str:
    names = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")
    env = {**os.environ, **dict.fromkeys(names, "attnkit")}
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def _commit_all(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _slower(ratio: float = 1.15) -> gate.Decision:
    return gate.Decision(
        "slower", ratio=ratio, ci=(1.12, 1.18), threshold=0.1, alpha=1e-4, reason=f"x{ratio} stored evidence"
    )


# --- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provenance", "problem"),
    [
        ({"commit": "43096ce"}, None),
        ({}, "names no commit"),
        ({"commit": None}, "names no commit"),
        ({"commit": "43096ce+dirty"}, "a tree with local changes (43096ce+dirty)"),
    ],
)
def test_the_baselines_source_must_be_a_clean_commit(provenance, problem):
    found = source_problem(provenance)
    assert (found is None) if problem is None else (problem in found), found


def test_the_row_says_paired_mode_decided_and_keeps_the_stored_evidence():
    paired = gate.Decision("same", ratio=1.0012, ci=(0.99, 1.01), threshold=0.1, alpha=1e-4, reason="bounds")
    d = adjudicated(_slower(), paired, "43096ce0123456789")
    assert d.outcome == "same" and d.ratio == 1.0012 and d.ci == (0.99, 1.01), d
    assert d.reason.startswith("adjudicated by paired vs 43096ce01234: x1.0012, same (bounds)"), d.reason
    assert "stored said x1.1500, slower (x1.15 stored evidence)" in d.reason, d.reason
    evidence = d.extra["adjudication"]
    assert evidence["mode"] == "paired" and evidence["stored"]["ratio"] == 1.15, evidence


def test_a_slower_without_its_source_stands_and_says_why():
    d = kept(_slower(), "the baseline names no commit")
    assert d.outcome == "slower", d
    assert d.reason.endswith(
        "not adjudicated by paired mode (the baseline names no commit): the stored decision stands"
    )
    assert d.extra["adjudication"] == {"mode": None, "why": "the baseline names no commit"}


def test_only_slower_rows_are_adjudicated():
    class Fake:
        closed, seen = False, []

        def adjudicate(self, case, decision):
            self.seen.append(case.name)
            return gate.Decision("same", reason="adjudicated")

        def close(self):
            self.closed = True

    info = {"shape": dict(SHAPE), "backend": "sdpa", "pass": "fwd"}
    rows = [
        (info, _slower(), {}),
        (info, gate.Decision("inconclusive"), {}),
        (info, gate.Decision("same"), {}),
    ]
    fake = Fake()
    out = adjudicate_rows(rows, fake)
    assert [d.outcome for _, d, _ in out] == ["same", "inconclusive", "same"], out
    assert fake.seen == ["fwd[sdpa-fp32-B1-H2-N128-D32-causal]"] and fake.closed, fake.seen


# --- the baseline's source in a real repository ------------------------------------------------


@pytest.fixture
def tiny_repo(tmp_path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    (repo / "src" / "attnkit").mkdir(parents=True)
    (repo / "src" / "attnkit" / "__init__.py").write_text("SPEED = 1\n")
    _git(repo, "init", "-q")
    return repo, _commit_all(repo, "first")


def test_the_baselines_commit_is_extracted_and_checked_against_its_source_digest(tiny_repo):
    repo, commit = tiny_repo
    digest = source_digest(repo / "src" / "attnkit")
    judge = Adjudicator(repo, None, None, {"commit": commit[:7], "source": digest}, STORED)
    try:
        roots, found, problem = judge.source()
        assert problem is None and found == commit, problem
        assert (roots[0] / "attnkit" / "__init__.py").read_text() == "SPEED = 1\n"
    finally:
        judge.close()
    other = Adjudicator(repo, None, None, {"commit": commit, "source": "0123456789abcdef"}, STORED)
    _, _, problem = other.source()
    other.close()
    assert f"source {digest}) is not the code the baseline recorded (source 0123456789abcdef)" in problem, (
        problem
    )


def test_a_commit_this_repository_lacks_leaves_the_stored_slower(tiny_repo):
    repo, _ = tiny_repo
    judge = Adjudicator(repo, None, None, {"commit": "feedfacefeedface"}, STORED)
    d = judge.adjudicate(None, _slower())
    judge.close()
    assert d.outcome == "slower", d
    assert "the baseline's commit feedfacefeedface is not available in" in d.reason, d.reason


def test_through_the_plugin_an_unavailable_source_keeps_the_slower_and_says_so(pytester, monkeypatch):
    """The synthetic suite's rootdir is no git repository: the stored slower fails, named."""
    pytester.makepyfile(test_synthetic=SYNTHETIC_SUITE)
    pytester.makeconftest(FAST_PROBES)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    monkeypatch.setenv("ATTNKIT_COMMIT", "feedface")  # the provenance's commit
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def run(*args, scale):
        spec = {"names": ["flash_a"], "scale": scale, "peak": {}, "seed": 0, "jitter": 0.03, "interrupt": []}
        monkeypatch.setenv("ATTNKIT_SYNTH_SPEC", json.dumps({**spec, "shape": SHAPE}))
        root = pytester.path / "baselines"
        return pytester.runpytest_inprocess(
            "-p", "attnkit_perf.plugin", f"--attnkit-baseline-dir={root}", "-p", "no:cacheprovider", *args
        )

    assert run("--attnkit-record", "--attnkit-allow-cpu", scale={}).ret == 0
    path = pytester.path / "verdict.json"
    result = run(
        "--benchmark-compare", "--attnkit-allow-cpu", f"--attnkit-verdict-json={path}", scale={"flash_a": 1.3}
    )
    row = json.loads(path.read_text())["benchmarks"][0]
    assert result.ret == 1 and row["outcome"] == "slower", row
    assert (
        "not adjudicated by paired mode (the baseline's commit feedface is not available in" in row["reason"]
    )


# --- end to end: real worker processes against the baseline's commit ---------------------------

CASE = "fwd[naive-fp32-B1-H2-N128-D32]"
NAIVE_DOC_END = 'rounded to v\'s dtype for P @ V, as fused kernels do, and the result has q\'s dtype."""\n'


def _checkout_repo(root: Path) -> tuple[Path, str]:
    """A fresh repository holding this checkout's src, perf suite and pytest configuration."""
    repo = root / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "src", repo / "src", ignore=ignore)
    shutil.copytree(REPO / "tests" / "perf", repo / "tests" / "perf", ignore=ignore)
    shutil.copy(REPO / "tests" / "conftest.py", repo / "tests" / "conftest.py")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    _git(repo, "init", "-q")
    return repo, _commit_all(repo, "the baseline's commit")


def _perf(repo: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    # One intra-op thread per process: on a shared runner the OpenMP threads of the workers
    # would otherwise time each other instead of the code.
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "ATTNKIT_TEST_DEVICE": "cpu"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for name in ("PYTEST_XDIST_WORKER", "ATTNKIT_COMMIT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/perf/test_attention_perf.py",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    command += ["-k", "cpu_smoke and naive and fwd and not causal", "--attnkit-allow-cpu", *args]
    result = subprocess.run(
        command, cwd=repo, env=env, capture_output=True, text=True, timeout=420, check=False
    )
    return result, result.stdout + result.stderr


def _stored_row(repo: Path) -> tuple[subprocess.CompletedProcess, dict, str]:
    verdict = repo / "verdict.json"
    # At 50% a CPU runner's contention stays below the threshold; the planted effects are 10x and 10x.
    result, output = _perf(
        repo, "--benchmark-compare", "--attnkit-slower=0.5", f"--attnkit-verdict-json={verdict}"
    )
    assert verdict.is_file(), output[-4000:]
    data = json.loads(verdict.read_text())
    validate("verdict", data, str(verdict))
    rows = [r for r in data["benchmarks"] if r["name"] == CASE]
    assert len(rows) == 1, f"{data['benchmarks']}\n{output[-3000:]}"
    return result, rows[0], output


def test_a_stored_false_alarm_is_adjudicated_away_and_a_real_slowdown_still_fails(tmp_path):
    repo, commit = _checkout_repo(tmp_path)
    result, output = _perf(repo, "--attnkit-record")
    baseline = next((repo / "baselines").glob("*/baseline.json"), None)
    assert result.returncode == 0 and baseline is not None, output[-3000:]
    recorded = json.loads(baseline.read_text())
    assert recorded["machine_info"]["attnkit"]["commit"] == commit, recorded["machine_info"]["attnkit"]
    # The baseline keeps each host-timed benchmark's host work count, with its environment.
    entry = next(b for b in recorded["benchmarks"] if b["extra_info"]["name"] == CASE)
    counted = entry["extra_info"]["host_count"]
    assert counted["repeatable"] and counted["instructions"] > 0 and counted["environment"]["torch"], counted

    # The baseline's machine ran everything ten times as fast: stored mode reads x10 "slower",
    # confirmed on re-measurement; paired mode against the same commit finds the code unchanged.
    # Ten, not two: a shared CPU runner's own state moves the same code up to 1.8x between runs
    # seconds apart, enough to hide a planted x2 offset.
    offset = json.loads(baseline.read_text())
    for bench in offset["benchmarks"]:
        bench["stats"]["data"] = [s * 0.1 for s in bench["stats"]["data"]]
    baseline.write_text(json.dumps(offset))
    result, row, output = _stored_row(repo)
    assert row["reason"].startswith(f"adjudicated by paired vs {commit[:12]}: "), f"{row}\n{output[-3000:]}"
    assert "stored said x" in row["reason"] and ", slower (" in row["reason"], row["reason"]
    assert row["outcome"] in ("same", "inconclusive"), f"{row['outcome']}: {row['reason']}"
    assert row["evidence"]["adjudication"]["stored"]["ratio"] > 1.5, row["evidence"]["adjudication"]
    assert result.returncode == 0, output[-3000:]
    # The same code counts the same host work in this run as in the baseline's.
    assert row["host"]["count"]["outcome"] == "same", row["host"]

    # A real slowdown since the baseline's commit: 3 ms of sleep in every naive call.
    baseline.write_text(json.dumps(recorded))
    reference = repo / "src" / "attnkit" / "reference.py"
    text = reference.read_text()
    assert NAIVE_DOC_END in text, "naive_attention's docstring moved: update NAIVE_DOC_END"
    reference.write_text(
        text.replace(NAIVE_DOC_END, NAIVE_DOC_END + "    __import__('time').sleep(0.003)\n", 1)
    )
    _commit_all(repo, "a slower naive path")
    result, row, output = _stored_row(repo)
    assert row["outcome"] == "slower", f"{row['outcome']}: {row['reason']}\n{output[-3000:]}"
    assert row["reason"].startswith(f"adjudicated by paired vs {commit[:12]}: "), row["reason"]
    assert row["ratio"] > 2, row
    assert result.returncode == 1, output[-3000:]
    # The sleep is two C calls more per call (an import and the sleep): the count grew.
    count = row["host"]["count"]
    assert count["outcome"] == "grew" and count["head"]["c_calls"] == count["base"]["c_calls"] + 2, count

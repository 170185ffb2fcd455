"""attnkit_perf.commands.bisect: the search over a real git range (built here), with a fake paired
comparison that reads each commit's planted speed, and the command's errors."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

from attnkit_perf.commands.bisect import BisectError, candidates, main, search
from attnkit_perf.decide.gate import Decision

#: A benchmark of the CPU smoke grid: the command checks names against the grid.
BENCHMARK = "fwd[sdpa-fp32-B1-H2-N128-D32-causal]"
THRESHOLD = 0.1


def _git(repo: Path, *args: str) -> str:
    names = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")
    env = {**os.environ, **dict.fromkeys(names, "attnkit")}
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def _repo(tmp_path: Path, speeds: list[float]) -> tuple[Path, list[str]]:
    """A repository whose commit i records ``speeds[i]`` (the time of the benchmark there)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = []
    for i, speed in enumerate(speeds):
        (repo / "speed.txt").write_text(f"{speed}\n")
        _git(repo, "add", "speed.txt")
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {i}: speed {speed}")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, commits


def _fake_compare(repo: Path, calls: list):
    """A paired comparison as the gate would decide a clean measurement: slower at or beyond
    the threshold, same below it; the interval a percent either side."""

    def speed(commit: str) -> float:
        return float(_git(repo, "show", f"{commit}:speed.txt"))

    def compare(base: str, head: str) -> Decision:
        calls.append((base, head))
        ratio = speed(head) / speed(base)
        outcome = "slower" if ratio >= 1 + THRESHOLD else "same"
        return Decision(outcome, ratio=ratio, ci=(ratio * 0.99, ratio * 1.01), reason="fake")

    return compare


@pytest.mark.parametrize("planted", [1, 4, 7, 10])
def test_the_search_finds_a_planted_step_in_few_comparisons(tmp_path, planted):
    speeds = [1.0 if i < planted else 1.3 for i in range(11)]  # GOOD, then 10 candidates
    repo, commits = _repo(tmp_path, speeds)
    calls, printed = [], []
    result = search(
        candidates(repo, commits[0], commits[-1]), commits[0], _fake_compare(repo, calls), printed.append
    )
    assert result.first_bad == commits[planted], f"found {commits.index(result.first_bad)}, planted {planted}"
    most = math.ceil(math.log2(10)) + 2  # BAD itself, the halvings, the parent
    assert len(calls) <= most, f"{len(calls)} comparisons for 10 candidates"
    assert all(base == commits[0] for base, _ in calls[:-1]), "every step compares with GOOD"
    if planted > 1:
        assert calls[-1] == (commits[planted - 1], commits[planted]) and result.parent_step.bad
    assert printed[0].startswith("BAD: ") and "slower x1.3000 [1.2870, 1.3130]" in printed[0], printed
    assert len(printed) == len(calls) and all(" against " in line for line in printed), printed


def test_a_creep_is_found_where_it_first_exceeds_the_threshold_and_said_to_be_one(tmp_path, capsys):
    speeds = [1.03**i for i in range(9)]  # 3% a commit: x1.1 first exceeded at commit 4
    repo, commits = _repo(tmp_path, speeds)
    calls = []

    def factory(repo_, case, thresholds, alpha, budget_s):
        assert case.name == BENCHMARK and thresholds.slower == THRESHOLD, (case.name, thresholds)
        return _fake_compare(repo, calls)

    code = main([commits[0], commits[-1], "-k", BENCHMARK, "--repo", str(repo), "--slower", "0.1"], factory)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"first slower commit: {commits[4]} commit 4" in out, out
    assert "built up over several commits" in out, out


def _error(capsys, repo: Path, *args: str, compare=None) -> str:
    code = main([*args, "--repo", str(repo)], compare or (lambda *a: pytest.fail("no measurement expected")))
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}: {err}"
    return err


def test_the_command_refuses_a_range_it_cannot_bisect(tmp_path, capsys):
    repo, commits = _repo(tmp_path, [1.0, 1.0, 1.3])
    good, bad = commits[0], commits[-1]
    assert "is not an ancestor of BAD" in _error(capsys, repo, bad, good, "-k", BENCHMARK)
    assert "'nope' is not a commit of" in _error(capsys, repo, "nope", bad, "-k", BENCHMARK)
    assert "the same commit" in _error(capsys, repo, bad, bad, "-k", BENCHMARK)


def test_the_command_refuses_an_unknown_benchmark_naming_the_closest(tmp_path, capsys):
    repo, commits = _repo(tmp_path, [1.0, 1.3])
    err = _error(capsys, repo, commits[0], commits[1], "-k", "fwd[sdpa-fp32-B1-H2-N128-D32-causl]")
    assert "no benchmark 'fwd[sdpa-fp32-B1-H2-N128-D32-causl]' in the grid" in err and BENCHMARK in err, err


def test_a_broken_entry_point_is_an_error_naming_it_when_its_benchmark_is_asked_for(
    tmp_path, capsys, monkeypatch
):
    from attnkit import plugins
    from attnkit.plugins import BackendEntryPointError

    broken = BackendEntryPointError("entry point 'broken' of 'toy-dist': importing it failed")
    monkeypatch.setattr(plugins, "_read", True)
    monkeypatch.setattr(plugins, "_broken", {"broken": broken})
    repo, commits = _repo(tmp_path, [1.0, 1.3])
    asked = BENCHMARK.replace(BENCHMARK[BENCHMARK.index("[") : BENCHMARK.index("-")], "[broken")
    err = _error(capsys, repo, commits[0], commits[1], "-k", asked)
    assert err.strip() == f"error: {broken}", err


def test_a_range_whose_bad_end_is_not_slower_has_nothing_to_find(tmp_path, capsys):
    repo, commits = _repo(tmp_path, [1.0, 1.02, 1.05])
    calls = []
    err = _error(
        capsys, repo, commits[0], commits[-1], "-k", BENCHMARK, compare=lambda *a: _fake_compare(repo, calls)
    )
    assert "is not slower than GOOD" in err and "(same)" in err and len(calls) == 1, err


def test_search_raises_when_bad_is_not_slower(tmp_path):
    repo, commits = _repo(tmp_path, [1.0, 1.0])
    with pytest.raises(BisectError, match="no slowdown to bisect"):
        search(commits[1:], commits[0], _fake_compare(repo, []), lambda line: None)

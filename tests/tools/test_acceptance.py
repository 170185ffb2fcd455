"""The GPU acceptance command (.ci/gpu-acceptance.sh) on the CPU: its arguments, its dry run,
and the summary it writes from the files a step leaves (attnkit_tools.gate.acceptance)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from attnkit_perf.formats.verdict import BenchmarkVerdict, VerdictDocument
from attnkit_tools.gate import acceptance

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu-acceptance.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_dry_run_prints_each_steps_commands_and_runs_nothing(tmp_path):
    """The commands as a run would make them (the base is the commit itself, not HEAD, which
    the step's own commit moves), and nothing written under OUT: an earlier run's results stay."""
    earlier = tmp_path / "out" / "aa" / "gate" / "verdict.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}")
    done = _run("--dry-run", str(tmp_path / "out"), "aa", "aa-all", "stored", "change:fwd-workspace")
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert f"env ATTNKIT_SELECT=affected ATTNKIT_BASE={head.strip()} bash .ci/gpu-gate.sh" in text
    assert f"env ATTNKIT_SELECT=all ATTNKIT_BASE={head.strip()} bash .ci/gpu-gate.sh" in text
    assert earlier.read_text() == "{}", "a dry run must not touch an earlier run's results"
    assert "pytest tests/perf -p no:cacheprovider --benchmark-compare" in text
    assert "patch -s -p1 -i " + str(ROOT / "tests/perf/gate_changes/fwd-workspace.patch") in text
    assert "-m attnkit_tools.gate.ab_dobench" in text and "--match triton fwd" in text
    fresh = [line for line in text.splitlines() if line.startswith("+ mkdir -p ") and "/cache-" in line]
    assert len(fresh) == 4 and all("/triton " in line and line.endswith("/inductor") for line in fresh), (
        "every step gets fresh attnkit, Triton and Inductor caches"
    )
    assert not (tmp_path / "out" / "summary.md").exists(), "a dry run writes no summary"
    assert not any((tmp_path / "out").rglob("status")), "a dry run runs no step"


def test_the_default_steps_are_aa_stored_and_one_planted_change(tmp_path):
    done = _run("--dry-run", str(tmp_path))
    assert done.returncode == 0, done.stderr
    steps = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert steps == ["aa", "stored", "change:host-3us"], steps


@pytest.mark.parametrize(
    ("options", "steps", "message"),
    [
        ([], ["aa", "bogus"], "unknown step 'bogus': expected aa, aa-all, stored or change:NAME"),
        (
            [],
            ["change:nope"],
            "change:nope: no tests/perf/gate_changes/nope.patch; there are: decode-tile-64",
        ),
        (["--step-timeout", "soon"], ["aa"], "--step-timeout: expected seconds, got 'soon'"),
        (["--shards", "0"], ["aa"], "--shards: expected a count of GPUs (1 or more), got '0'"),
        (["--side-by-side", "--shards", "2"], ["aa"], "--side-by-side and --shards 2: give one"),
    ],
)
def test_a_bad_argument_is_refused_before_anything_runs(tmp_path, options, steps, message):
    done = _run("--dry-run", *options, str(tmp_path / "out"), *steps)
    assert done.returncode == 2 and message in done.stderr, (done.returncode, done.stderr)
    assert "==" not in done.stdout, "no step may start"


def test_shards_run_side_by_side_each_on_its_gpu_and_cores_comparing_the_same_commits(tmp_path):
    done = _run("--dry-run", "--shards", "2", str(tmp_path / "out"), "aa")
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    for i in (1, 2):
        assert f"+ shard {i}/2: CUDA_VISIBLE_DEVICES={i - 1} taskset -c " in text, text
        assert f"== aa (shard {i}/2) -> " in text and f"/shard-{i}/aa/gate" in text, text
    bases = {
        line.split("ATTNKIT_BASE=")[1].split()[0] for line in text.splitlines() if "ATTNKIT_BASE=" in line
    }
    assert len(bases) == 1, f"every shard compares with one base: {bases}"
    clones = [line for line in text.splitlines() if line.startswith("+ git clone ")]
    assert len(clones) == 2 and len({line.split()[-1] for line in clones}) == 2, "a tree of its own per shard"


def test_steps_run_side_by_side_each_on_its_gpu_and_cores_into_their_usual_folders(tmp_path):
    done = _run("--dry-run", "--side-by-side", str(tmp_path / "out"), "aa", "change:fwd-tiles-d64-h200")
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    for gpu, (step, folder) in enumerate(
        (("aa", "aa"), ("change:fwd-tiles-d64-h200", "change-fwd-tiles-d64-h200"))
    ):
        assert f"+ {step}: CUDA_VISIBLE_DEVICES={gpu} taskset -c " in text, text
        assert f"== {step} -> " in text and f"/OUT/{folder}/gate" in text, text
    assert "shard" not in text, "no step is split"
    clones = [line for line in text.splitlines() if line.startswith("+ git clone ")]
    assert len(clones) == 2 and len({line.split()[-1] for line in clones}) == 2, "a tree of its own per step"


def test_no_output_folder_is_a_usage_error():
    done = _run("--dry-run")
    assert done.returncode == 2 and "usage: bash .ci/gpu-acceptance.sh" in done.stderr


def _junit(path: Path, failed: list[str], passed: int) -> None:
    cases = "".join(f'<testcase classname="m" name="{n}"><failure message="x"/></testcase>' for n in failed)
    cases += "".join(f'<testcase classname="m" name="ok{i}"/>' for i in range(passed))
    path.write_text(
        f'<testsuites><testsuite tests="{passed + len(failed)}" failures="{len(failed)}" errors="0" '
        f'skipped="0">{cases}</testsuite></testsuites>'
    )


def _verdict(path: Path, rows: dict[str, str], complete: bool = True) -> None:
    benchmarks = [{"name": n, "outcome": o, "ratio": 1.0, "reason": f"{o} reason"} for n, o in rows.items()]
    counts = {o: list(rows.values()).count(o) for o in set(rows.values())}
    path.write_text(
        json.dumps(
            {
                "mode": "paired",
                "passed": "slower" not in rows.values(),
                "complete": complete,
                "counts": counts,
                "benchmarks": benchmarks,
            }
        )
    )


def _step(tmp_path: Path, name: str, status: int, junit_failed=(), rows=None, cases="") -> Path:
    folder = tmp_path / name
    (folder / "gate").mkdir(parents=True)
    (folder / "status").write_text(f"{status}\n")
    (folder / "command").write_text("bash .ci/gpu-gate.sh OUT\n")
    (folder / "times").write_text("wall time: 412 s\ncorrectness: 120 s\nperf: 280 s\n")
    _junit(folder / "gate" / "correctness.xml", list(junit_failed), 5)
    _verdict(folder / "gate" / "verdict.json", rows or {"fwd[triton-D64]": "same"})
    if cases:
        (folder / "cases").write_text(cases + "\n")
    return folder


def test_every_false_alarm_of_an_aa_step_is_listed_and_fails_it(tmp_path):
    folder = _step(
        tmp_path,
        "aa",
        1,
        ["test_x[naive]"],
        {"fwd[a]": "same", "fwd[b]": "slower", "loop[c]": "inconclusive"},
    )
    passed, lines = acceptance.summarize(folder)
    text = "\n".join(lines)
    assert not passed
    assert "false alarms: 2" in text, text
    for alarm in ("correctness failed: m::test_x[naive]", "perf slower: fwd[b]"):
        assert alarm in text, text
    # The gate's rule never fails an inconclusive row: it is listed apart, not as an alarm.
    assert "perf inconclusive: loop[c]" not in text and "inconclusive loop[c]" in text, text
    assert "wall time: 412 s" in text and "correctness: 120 s" in text


def test_a_clean_aa_step_passes_and_a_faster_row_is_no_alarm(tmp_path):
    passed, lines = acceptance.summarize(
        _step(tmp_path, "aa", 0, rows={"fwd[a]": "same", "fwd[b]": "faster"})
    )
    assert passed and "false alarms: 0" in "\n".join(lines)


def test_undecided_rows_are_no_alarm_but_are_counted_and_named(tmp_path):
    rows = {"fwd[a]": "same", "fwd[b]": "not-reached", "fwd[c]": "unfinished", "fwd[d]": "inconclusive"}
    passed, lines = acceptance.summarize(_step(tmp_path, "aa", 0, rows=rows))
    text = "\n".join(lines)
    assert passed and "false alarms: 0" in text, text
    assert "undecided (no alarm, no evidence of quiet): 3 of 4 rows" in text, text
    for row in ("not-reached fwd[b]", "unfinished fwd[c]", "inconclusive fwd[d]"):
        assert row in text, text


def test_a_step_stopped_by_its_time_limit_says_so_and_fails(tmp_path):
    folder = _step(tmp_path, "aa-all", 124)
    (folder / "gate" / "verdict.json").unlink()
    passed, lines = acceptance.summarize(folder)
    text = "\n".join(lines)
    assert not passed and "stopped by its time limit" in text, text
    assert "correctness: 5 run" in text and "no verdict.json" in text, text


def test_an_incomplete_verdict_fails_the_step(tmp_path):
    folder = _step(tmp_path, "aa-all", 0)
    _verdict(folder / "gate" / "verdict.json", {"fwd[a]": "same"}, complete=False)
    passed, lines = acceptance.summarize(folder)
    assert not passed and "incomplete" in "\n".join(lines)


def test_a_change_passes_only_when_the_gate_failed_on_a_row_its_cases_name(tmp_path):
    rows = {"fwd[triton-bf16-D64]": "slower", "fwd[sdpa-flash-D64]": "same"}
    caught = _step(tmp_path / "1", "change-fwd-workspace", 1, rows=rows, cases="triton fwd")
    assert acceptance.summarize(caught)[0]
    elsewhere = _step(
        tmp_path / "2", "change-fwd-workspace", 1, rows={"bwd[triton]": "slower"}, cases="triton fwd"
    )
    assert not acceptance.summarize(elsewhere)[0], "a failure on another row is not the change caught"
    missed = _step(
        tmp_path / "3", "change-fwd-workspace", 0, rows={"fwd[triton]": "same"}, cases="triton fwd"
    )
    assert not acceptance.summarize(missed)[0], "a gate that passed missed the change"


def test_the_summary_file_holds_every_steps_verdict(tmp_path):
    steps = [_step(tmp_path, "aa", 0), _step(tmp_path, "stored", 1, rows={"fwd[a]": "missing"})]
    assert acceptance.main([str(tmp_path), *map(str, steps)]) == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "- aa: PASS" in summary and "- stored: FAIL" in summary and "perf missing: fwd[a]" in summary
    out = tmp_path / "not" / "made"  # the summary's folder is made when missing
    assert acceptance.main([str(out), *map(str, steps)]) == 1
    assert (out / "summary.md").read_text() == summary


def _shard_step(
    root: Path, name: str, index: int, rows: dict[str, str], status: int, cases: str = ""
) -> Path:
    """One shard's folder of a step, with a verdict the merge reads (as a shard of 2)."""
    folder = _step(root, name, status, cases=cases)
    provenance = {"gpu_key": "nvidia-h200", "commit": "h" * 40, "source": "s1"}
    VerdictDocument(
        mode="paired",
        base={"label": "base", "provenance": {**provenance, "commit": "b" * 40}},
        head={"label": "head", "provenance": provenance},
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": 1},
        benchmarks=[
            BenchmarkVerdict(
                name=n, group="g", backend="triton", pass_name="fwd", shape={}, outcome=o, reason=f"{o} here"
            )
            for n, o in rows.items()
        ],
        shard={"index": index, "count": 2, "grid": "g1", "rows": len(rows)},
    ).write(folder / "gate" / "verdict.json")
    return folder


def test_a_change_run_as_shards_is_judged_on_their_merged_verdict(tmp_path):
    name = "change-fwd-tiles"
    one = _shard_step(tmp_path / "1", name, 1, {"bwd[triton-D64]": "same"}, 0, cases="triton D64")
    two = _shard_step(tmp_path / "2", name, 2, {"fwd[triton-D64]": "slower"}, 1, cases="triton D64")
    passed, lines = acceptance.summarize(one)
    assert not passed and "shard 1 of 2: its verdict covers its rows only" in "\n".join(lines)
    out = tmp_path / "out"
    out.mkdir()
    assert acceptance.main([str(out), str(one), str(two)]) == 0
    summary = (out / "summary.md").read_text()
    assert f"- {name}-merged: PASS" in summary, summary
    assert "slower fwd[triton-D64]" in summary and "correctness: 10 run" in summary, summary


def test_an_aa_run_as_shards_fails_when_one_shard_did_not_finish(tmp_path):
    one = _shard_step(tmp_path / "1", "aa-all", 1, {"fwd[a]": "same"}, 0)
    two = _shard_step(tmp_path / "2", "aa-all", 2, {"fwd[b]": "same"}, 124)
    doc = VerdictDocument.read(two / "gate" / "verdict.json")
    doc.complete = False
    doc.write(two / "gate" / "verdict.json")
    out = tmp_path / "out"
    out.mkdir()
    assert acceptance.main([str(out), str(one), str(two)]) == 1
    summary = (out / "summary.md").read_text()
    assert "- aa-all-merged: FAIL" in summary and "incomplete" in summary, summary
    whole = _shard_step(tmp_path / "3", "aa-all", 2, {"fwd[b]": "same"}, 0)
    assert acceptance.main([str(out), str(one), str(whole)]) == 0

"""The correctness tests split over runners by what each took on this GPU model
(``baselines/<gpu_key>/test-durations.json``, written by ``python -m attnkit_perf.commands.durations``
from the gate's own output), not by counting every test as one."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch

from attnkit.device import gpu_key
from attnkit_perf.commands.durations import main as durations_main
from attnkit_perf.commands.durations import node_id
from attnkit_perf.formats.durations import build, cost_by_node, durations_path, read_durations
from attnkit_perf.formats.schema import FormatError
from attnkit_perf.formats.verdict import VerdictDocument
from attnkit_perf.run.shards import balance

CPU_KEY = gpu_key(torch.device("cpu"))
#: One test far longer than the others, as the flex hypothesis test is on an H200 (225 s).
TIMES = {
    f"tests/correctness/test_x.py::test_{i}": s for i, s in enumerate([225, 91, 83, 82, 73, 5, 3, 2, 1, 0.5])
}


@pytest.mark.parametrize("count", [2, 3, 4])
def test_the_balanced_split_covers_every_test_once_within_one_test_of_even(count):
    place = balance(TIMES, count, cost_by_node(TIMES))
    assert sorted(place) == sorted(TIMES)
    loads = [sum(s for n, s in TIMES.items() if place[n] == k) for k in range(1, count + 1)]
    assert max(loads) - min(loads) <= max(TIMES.values()), loads


def test_the_balanced_split_is_the_same_whatever_order_the_tests_come_in():
    names = list(TIMES)
    first = balance(names, 2, cost_by_node(TIMES))
    random.Random(1).shuffle(names)
    assert balance(names, 2, cost_by_node(TIMES)) == first


def test_a_test_not_recorded_costs_the_median_and_nothing_recorded_costs_one():
    cost = cost_by_node(TIMES)
    assert cost("tests/correctness/test_x.py::test_new") == statistics.median(TIMES.values())
    assert cost("tests/correctness/test_x.py::test_0") == 225
    assert cost_by_node({})("anything") == 1.0


def test_junit_names_map_back_to_node_ids(tmp_path):
    (tmp_path / "tests" / "correctness").mkdir(parents=True)
    (tmp_path / "tests" / "correctness" / "test_x.py").write_text("")
    assert (
        node_id("tests.correctness.test_x", "test_a[p-1]", tmp_path)
        == "tests/correctness/test_x.py::test_a[p-1]"
    )
    assert (
        node_id("tests.correctness.test_x.TestK", "test_b", tmp_path)
        == "tests/correctness/test_x.py::TestK::test_b"
    )
    with pytest.raises(FormatError, match=r"no module tests/correctness/test_gone\.py"):
        node_id("tests.correctness.test_gone", "test_a", tmp_path)


def _gate_dir(folder: Path, key: str, times: dict[str, float], skipped: tuple[str, ...] = ()) -> Path:
    """A folder as .ci/gpu-gate.sh writes it: its JUnit file and a verdict with provenance."""
    folder.mkdir(parents=True)
    cases = "".join(
        f'<testcase classname="tests.correctness.test_x" name="{name}" time="{s}"/>'
        for name, s in times.items()
    ) + "".join(
        f'<testcase classname="tests.correctness.test_x" name="{name}" time="0.01"><skipped/></testcase>'
        for name in skipped
    )
    (folder / "correctness.xml").write_text(
        f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'
    )
    provenance = {
        "gpu_key": key,
        "driver": "580.159.04",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "commit": "abc",
    }
    VerdictDocument(
        mode="paired",
        base={"label": "base"},
        head={"label": "head", "provenance": provenance},
        thresholds={"slower": 0.02, "run_alpha": 0.01, "memory_rel": 0.01, "memory_abs_bytes": 1},
        benchmarks=[],
    ).write(folder / "verdict.json")
    return folder


def test_the_command_writes_the_shards_runs_as_one_file_with_their_provenance(tmp_path):
    (tmp_path / "tests" / "correctness").mkdir(parents=True)
    (tmp_path / "tests" / "correctness" / "test_x.py").write_text("")
    one = _gate_dir(tmp_path / "shard1", "nvidia-h200", {"test_a": 225.0, "test_b": 1.5}, skipped=("test_s",))
    two = _gate_dir(tmp_path / "shard2", "nvidia-h200", {"test_c": 3.0})
    out = tmp_path / "baselines" / "nvidia-h200" / "test-durations.json"
    assert durations_main([str(one), str(two), "--out", str(out), "--root", str(tmp_path)]) == 0
    assert out == durations_path(tmp_path / "baselines", "nvidia-h200")
    assert read_durations(out, "nvidia-h200") == {
        "tests/correctness/test_x.py::test_a": 225.0,
        "tests/correctness/test_x.py::test_b": 1.5,
        "tests/correctness/test_x.py::test_c": 3.0,
    }, "skipped tests are not timed"
    sources = json.loads(out.read_text())["sources"]
    assert [s["provenance"]["driver"] for s in sources] == ["580.159.04"] * 2 and [
        s["timed"] for s in sources
    ] == [2, 1]
    with pytest.raises(FormatError, match="are for 'nvidia-h200'; this run is 'nvidia-h100'"):
        read_durations(out, "nvidia-h100")


def test_the_command_refuses_a_folder_without_the_gates_files_or_mixed_gpus(tmp_path, capsys):
    (tmp_path / "tests" / "correctness").mkdir(parents=True)
    (tmp_path / "tests" / "correctness" / "test_x.py").write_text("")
    (tmp_path / "empty").mkdir()
    out = str(tmp_path / "d.json")
    assert durations_main([str(tmp_path / "empty"), "--out", out, "--root", str(tmp_path)]) == 2
    assert "no correctness.xml" in capsys.readouterr().err
    a = _gate_dir(tmp_path / "a", "nvidia-h200", {"test_a": 1.0})
    b = _gate_dir(tmp_path / "b", "nvidia-h100", {"test_b": 1.0})
    assert durations_main([str(a), str(b), "--out", out, "--root", str(tmp_path)]) == 2
    assert "different or unknown GPU models" in capsys.readouterr().err


def test_a_negative_duration_is_refused_naming_the_test(tmp_path):
    doc = build([("run", {"gpu_key": "nvidia-h200"}, {"tests/x.py::test_a": 1.0})])
    doc["durations"]["tests/x.py::test_a"] = -1.0
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="less than the minimum of 0"):
        read_durations(path, "nvidia-h200")


SHORT_TESTS = """
import pytest

@pytest.mark.parametrize("i", range(5))
def test_t(i):
    pass
"""


def test_the_runner_splits_by_the_recorded_seconds(pytester, monkeypatch):
    pytester.makepyfile(test_split=SHORT_TESTS)
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    root = pytester.path / "baselines"
    ids = [f"test_split.py::test_t[{i}]" for i in range(5)]
    doc = build([("run", {"gpu_key": CPU_KEY}, dict(zip(ids, [100.0, 1.0, 1.0, 1.0, 1.0], strict=True)))])
    durations_path(root, CPU_KEY).parent.mkdir(parents=True)
    durations_path(root, CPU_KEY).write_text(json.dumps(doc))
    kept = []
    for index in (1, 2):
        result = pytester.runpytest_inprocess(
            "-p",
            "attnkit_perf.plugin",
            f"--attnkit-baseline-dir={root}",
            "-p",
            "no:cacheprovider",
            f"--attnkit-shard={index}/2",
            "--collect-only",
            "-q",
        )
        kept.append({line for line in result.stdout.lines if line.startswith("test_split.py::")})
    assert kept[0] | kept[1] == set(ids) and not kept[0] & kept[1], kept
    assert ["test_split.py::test_t[0]"] in ([sorted(k) for k in kept]), f"the 100 s test alone: {kept}"


LOGGED_TESTS = """
import os

import pytest

@pytest.mark.parametrize("i", range(6))
def test_t(i):
    with open(os.environ["RUN_ORDER_LOG"], "a") as log:
        log.write(f"{i}\\n")
"""


def _run_logged(pytester, monkeypatch, recorded: dict[int, float] | None, *args: str) -> list[int]:
    """The order in which one xdist worker ran ``test_t[0..5]``, with ``recorded`` seconds as
    this machine's test durations (None: no file)."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_order=LOGGED_TESTS)
    log = pytester.path / "order.log"
    log.unlink(missing_ok=True)
    monkeypatch.setenv("RUN_ORDER_LOG", str(log))
    monkeypatch.setenv("ATTNKIT_TEST_DEVICE", "cpu")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    root = pytester.path / "baselines"
    if recorded is not None:  # (a second run in one test replaces the first's file)
        times = {f"test_order.py::test_t[{i}]": s for i, s in recorded.items()}
        durations_path(root, CPU_KEY).parent.mkdir(parents=True, exist_ok=True)
        durations_path(root, CPU_KEY).write_text(json.dumps(build([("run", {"gpu_key": CPU_KEY}, times)])))
    result = pytester.runpytest_subprocess(
        "-p", "attnkit_perf.plugin", f"--attnkit-baseline-dir={root}", "-p", "no:cacheprovider",
        "-n", "1", *args,
    )  # fmt: skip
    result.assert_outcomes(passed=6)
    return [int(line) for line in log.read_text().split()]


def test_workers_take_the_longest_recorded_test_first(pytester, monkeypatch):
    # test_t[4] is the long one, collected late (as the flex test is); unrecorded tests cost the
    # median (2 s), and ties keep the collection's order.
    order = _run_logged(pytester, monkeypatch, {1: 3.0, 2: 1.0, 4: 240.0, 5: 2.0})
    assert order == [4, 1, 0, 3, 5, 2], order


def test_without_recorded_durations_or_under_another_distribution_xdist_keeps_its_order(
    pytester, monkeypatch
):
    assert _run_logged(pytester, monkeypatch, None) == list(range(6))
    order = _run_logged(pytester, monkeypatch, {4: 240.0}, "--dist", "loadfile")
    assert order == list(range(6)), order

"""The one-command baseline refresh (attnkit_tools.gate.baselines): how it shares a machine, how it
joins the parts, and a dry run of the whole path on the CPU smoke grid (recordings split over
two slots, A/A runs merged, pooling, the noise file, schema and coverage checks)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from attnkit_perf.decide.noise import noise_sigmas
from attnkit_perf.formats.baseline import load_baseline
from attnkit_perf.formats.noise import read_noise
from attnkit_tools.gate.baselines import BaselineError, Slot, join_recordings, main, make_slots, split_cores

REPO = Path(__file__).resolve().parents[2]


def test_cores_are_split_into_contiguous_near_equal_shares():
    assert split_cores(list(range(16)), 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert split_cores([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    with pytest.raises(BaselineError, match="4 processes need at least 4 cores"):
        split_cores([0, 1], 4)


def test_one_slot_per_gpu_each_with_its_own_cores():
    slots = make_slots(["0", "1"], None)
    assert [s.gpu for s in slots] == ["0", "1"]
    assert not set(slots[0].cores) & set(slots[1].cores), slots


def test_cpu_slots_name_no_gpu():
    assert all(slot.gpu is None for slot in make_slots(None, 3)) and len(make_slots(None, 3)) == 3
    assert isinstance(make_slots(None, 1)[0], Slot)


def _recording(names, key="cpu", source="s1"):
    return {
        "machine_info": {"attnkit": {"gpu_key": key, "source": source}},
        "benchmarks": [{"fullname": n, "extra_info": {"name": n}} for n in names],
    }


def test_the_parts_of_a_recording_join_side_by_side():
    joined = join_recordings([_recording(["a", "b"]), _recording(["c"])])
    assert [b["fullname"] for b in joined["benchmarks"]] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        ([_recording(["a"]), _recording(["b"], key="h100")], "GPU model"),
        ([_recording(["a"]), _recording(["b"], source="s2")], "code"),
        ([_recording(["a"]), _recording(["a"])], "twice"),
    ],
)
def test_parts_of_different_runs_are_refused(parts, why):
    with pytest.raises(BaselineError, match=why):
        join_recordings(parts)


def test_fewer_than_two_recordings_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["--tests", "tests/perf", "--cpu", "2", "--recordings", "1"])
    assert "at least 2 each" in capsys.readouterr().err


def test_a_dry_run_on_the_cpu_writes_valid_files_covering_what_it_measured(tmp_path, monkeypatch):
    """The whole path on two CPU slots and one row of the smoke grid (so one slot's shard is
    empty, as a narrow selection leaves it), loose thresholds for a shared CPU."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), *sys.path]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    out = tmp_path / "baselines"
    code = main(
        [
            "--tests", "tests/perf", "--cpu", "2", "--work", str(tmp_path / "work"), "--out", str(out), "--",
            "-k", "cpu_smoke and naive and fwd and not causal",
            "--attnkit-budget-s=2", "--attnkit-slower=0.5", "--attnkit-host-slower=0.5",
        ]
    )  # fmt: skip
    logs = "\n".join(p.read_text()[-2000:] for p in sorted((tmp_path / "work").glob("*.log")))
    assert code == 0, logs
    (folder,) = out.iterdir()
    baseline = load_baseline(folder / "baseline.json", folder.name)
    names = {b["extra_info"]["name"] for b in baseline["benchmarks"]}
    assert names == {"fwd[naive-fp32-B1-H2-N128-D32]"}, names
    sds = noise_sigmas(read_noise(folder / "noise-paired.json", folder.name, "paired"))
    # The host metric's wall-time entry only where the A/A runs timed it: unchanged code's host
    # work count decides it without wall time.
    assert names <= set(sds) <= names | {f"{n}@host" for n in names}, sorted(sds)
    spread = json.loads((folder / "noise-stored.json").read_text())
    assert set(spread["benchmarks"]) == names, spread["benchmarks"].keys()


def test_a_refresh_cut_short_resumes_from_its_work_folder_and_refuses_other_code(
    tmp_path, monkeypatch, capsys
):
    """A second run with the same --work keeps the recordings and A/A runs the first one joined
    there and measures only what is missing; a part of other code there is refused by name."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), *sys.path]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    work, out = tmp_path / "work", tmp_path / "baselines"
    args = [
        "--tests", "tests/perf", "--cpu", "1", "--work", str(work), "--out", str(out), "--",
        "-k", "cpu_smoke and naive and fwd and not causal",
        "--attnkit-budget-s=2", "--attnkit-slower=0.5", "--attnkit-host-slower=0.5",
    ]  # fmt: skip
    assert main(args) == 0
    # As if the first run had stopped during its second A/A run.
    (work / "aa-2.json").unlink()
    shutil.rmtree(out)
    capsys.readouterr()
    assert main(args) == 0
    said = capsys.readouterr().out
    for part in ("recording 1: kept", "recording 2: kept", "A/A run 1: kept"):
        assert part in said, said
    assert "A/A run 2: kept" not in said and (work / "aa-2.json").is_file(), said
    (folder,) = out.iterdir()
    assert (folder / "noise-paired.json").is_file() and (folder / "baseline.json").is_file()
    recording = json.loads((work / "recording-1.json").read_text())
    recording["machine_info"]["attnkit"]["source"] = "0123456789abcdef"
    (work / "recording-1.json").write_text(json.dumps(recording))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "recording-1.json measured code 0123456789abcdef" in err and "use another --work" in err, err

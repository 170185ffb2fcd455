"""attnkit_tools.pages.profile: ncu's raw CSV mapped back to the cases and summed per cell (CPU only)."""

from __future__ import annotations

import csv
import json

import pytest

from attnkit_tools.pages import profile

TIME = "gpu__time_duration.sum"
PIPE = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGS = "launch__registers_per_thread"
BARRIER = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
WAIT = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"

#: (case, kernel, us, tensor pipe %, occupancy %, registers, barrier, wait), in launch order.
KERNELS = [
    ("fwd[triton-D128-full-N4096]", "_plain_fwd_kernel", 100.0, 50.0, 12.5, 139, 1.3, 1.2),
    ("fwd[sdpa-cudnn-D128-full-N4096]", "cudnn_fprop", 80.0, 70.0, 14.0, 168, 1.4, 0.9),
    ("bwd[triton-D128-full-N4096]", "_attn_bwd_preprocess", 10.0, 0.0, 90.0, 32, 0.1, 0.2),
    ("bwd[triton-D128-full-N4096]", "_attn_bwd_dkdv_kernel", 300.0, 60.0, 12.3, 255, 2.4, 1.4),
    ("bwd[triton-D128-full-N4096]", "_attn_bwd_dq_kernel", 200.0, 70.0, 12.5, 178, 2.7, 1.3),
    ("bwd[sdpa-cudnn-D128-full-N4096]", "cudnn_bprop", 350.0, 66.0, 15.6, 168, 1.5, 0.9),
    ("bwd[sdpa-cudnn-D128-full-N4096]", "convert_dq", 20.0, 0.0, 84.0, 30, 0.0, 0.1),
]


def _write(tmp_path, kernels, provenance=True):
    counters = tmp_path / "counters.csv"
    with counters.open("w", newline="") as f:
        f.write("==PROF== Connected to process 1\n")  # ncu's own lines are skipped
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["ID", "Kernel Name", TIME, PIPE, OCC, REGS, BARRIER, WAIT])
        writer.writerow(["", "", "usecond", "%", "%", "register/thread", "ratio", "ratio"])
        for i, (_, name, us, pipe, occ, regs, barrier, wait) in enumerate(kernels):
            writer.writerow([i, name, us, pipe, occ, regs, barrier, wait])
    cases = []
    for case, name, *_ in kernels:
        if not cases or cases[-1]["case"] != case:
            cases.append({"case": case, "kernels": []})
        cases[-1]["kernels"].append(name)
    listed = {"provenance": {"gpu_key": "nvidia-h100-80gb-hbm3", "commit": "abc1234"}, "cases": cases}
    cases_json = tmp_path / "cases.json"
    cases_json.write_text(json.dumps(listed if provenance else cases))
    return str(counters), str(cases_json)


def _cell_rows(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0].startswith(("fwd D", "bwd D")):
            rows[cells[0]] = cells
    return rows


def test_each_cell_sums_its_kernels_and_compares_the_paths(tmp_path):
    report = profile.summarize(*_write(tmp_path, KERNELS))
    rows = _cell_rows(report)
    assert set(rows) == {"fwd D128 full N4096", "bwd D128 full N4096"}
    fwd, bwd = rows["fwd D128 full N4096"], rows["bwd D128 full N4096"]
    # times, speed (cuDNN time / Triton time), per matmul, time-weighted tensor pipe
    assert fwd[1:6] == ["100", "80", "0.80", "0.80", "50 / 70"]
    assert bwd[1:3] == ["510", "370"]
    assert bwd[3] == f"{370 / 510:.2f}"
    assert bwd[4] == f"{370 / 510 * 7 / 5:.2f}"  # Triton's backward does 7 matmuls per tile, cuDNN's 5
    assert bwd[5] == f"{(300 * 60 + 200 * 70) / 510:.0f} / {350 * 66 / 370:.0f}"
    # The longest kernel of each path speaks for its occupancy, registers and stalls.
    assert bwd[6:8] == ["12.3 / 15.6", "255 / 168"]
    assert bwd[8].startswith("barrier 2.40, wait 1.40")


def test_the_report_carries_the_provenance_and_every_kernel(tmp_path):
    report = profile.summarize(*_write(tmp_path, KERNELS))
    assert "| gpu_key | nvidia-h100-80gb-hbm3 |" in report
    assert "| commit | abc1234 |" in report
    for case, name, *_ in KERNELS:
        assert f"| {case} | {name} |" in report


def test_a_cases_file_without_provenance_still_reads(tmp_path):
    report = profile.summarize(*_write(tmp_path, KERNELS, provenance=False))
    assert "fwd D128 full N4096" in report


def test_a_kernel_count_that_does_not_match_the_cases_is_refused(tmp_path):
    counters, cases_json = _write(tmp_path, KERNELS)
    path = tmp_path / "cases.json"
    listed = json.loads(path.read_text())
    listed["cases"][0]["kernels"].append("an_extra_kernel")
    path.write_text(json.dumps(listed))
    with pytest.raises(SystemExit, match="cannot be matched"):
        profile.summarize(counters, cases_json)

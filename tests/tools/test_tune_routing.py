"""attnkit_tools.tune.routing: where a Gluon cell is routed, decided on timings of the public call
in alternating rounds (the side processes faked; a side's own timing on the machine's device, at
lengths the CPU's interpreter runs)."""

from __future__ import annotations

import json
import subprocess

import pytest

from attnkit.triton.gluon.config import forward_configs, routed_cells
from attnkit_tools.tune import routing

LENGTHS = (1024, 2048, 4096)


def _rounds(*rows):
    return [dict(zip(LENGTHS, row, strict=True)) for row in rows]


def test_a_cell_is_routed_from_where_it_is_faster_in_every_round_at_that_and_every_longer_length():
    plain = _rounds((1.0, 2.0, 4.0), (1.0, 2.0, 4.0), (1.0, 2.0, 4.0))
    assert (
        routing.routed_from_rounds(_rounds((0.9, 1.9, 3.9), (0.9, 1.9, 3.9), (0.9, 1.9, 3.9)), plain) == 1024
    )
    # Faster at 1024 in every round, but not at 2048 in one: routed from 4096 only.
    assert (
        routing.routed_from_rounds(_rounds((0.9, 1.9, 3.9), (0.9, 2.1, 3.9), (0.9, 1.9, 3.9)), plain) == 4096
    )
    # A tie is not faster.
    assert (
        routing.routed_from_rounds(_rounds((0.9, 1.9, 4.0), (0.9, 1.9, 3.9), (0.9, 1.9, 3.9)), plain) is None
    )


def test_the_rounds_of_the_two_sides_must_pair():
    with pytest.raises(ValueError, match="as many rounds"):
        routing.routed_from_rounds(_rounds((1, 2, 3)), _rounds((1, 2, 3), (1, 2, 3)))


def test_the_trial_table_routes_every_measured_cell_from_the_shortest_length_and_keeps_the_rest():
    table = {
        "families": {"bf16-d64": {"fwd": [64, 64, 4, 3]}},
        "gluon": {
            "forward": {"d128-full": {"old": 1}},
            "backward": {"d64-full": {"kept": 1}},
            "routed": {"forward": {"d128-full": 4096}, "backward": {"d64-full": 4096}},
        },
    }
    forward = {"block_m": 64, "block_n": 128, "stages": 2, "overlap": True, "pingpong": False,
               "persistent": False, "consumer_regs": 240, "producer_regs": 24, "maxnreg": 168}  # fmt: skip
    trial = routing.trial_table(table, {"forward": {"d128-full": forward, "d64-causal": forward}}, 1024)
    assert trial["families"] == table["families"]
    assert routed_cells(trial["gluon"], "forward") == {(128, False): 1024, (64, True): 1024}
    assert routed_cells(trial["gluon"], "backward") == {(64, False): 4096}, "a pass not measured stays"
    assert forward_configs(trial["gluon"])[128, False].block_n == 128
    assert trial["gluon"]["backward"] == {"d64-full": {"kept": 1}}
    assert table["gluon"]["forward"] == {"d128-full": {"old": 1}}, "the table itself is not changed"


def test_a_side_runs_in_a_fresh_process_with_its_switch_and_the_trial_table(monkeypatch):
    calls = []

    def fake_run(command, env, capture_output, text, check, timeout):
        calls.append((command, env))
        return subprocess.CompletedProcess(
            command, 0, stdout='noise\n{"forward": {"d64-full": {"1024": 0.5}}}\n'
        )

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("ATTNKIT_GLUON", "0")  # a caller's switch must not decide the Gluon side
    jobs = [("forward", 64, False, 1024)]
    assert routing.run_side("gluon", jobs, "/t/trial.json") == {"forward": {"d64-full": {1024: 0.5}}}
    routing.run_side("plain", jobs, "/t/trial.json")
    (gluon_command, gluon_env), (_, plain_env) = calls
    assert gluon_command[-5:] == [
        "attnkit_tools.tune.routing",
        "--side",
        json.dumps(jobs),
        "--expect",
        "gluon",
    ]
    assert gluon_env["ATTNKIT_GLUON"] == "1" and plain_env["ATTNKIT_GLUON"] == "0"
    assert gluon_env["ATTNKIT_TRITON_CONFIG"] == plain_env["ATTNKIT_TRITON_CONFIG"] == "/t/trial.json"


def test_a_side_that_fails_names_its_side_and_its_error(monkeypatch):
    outcomes = [(1, "", "CUDA error: out of memory"), (0, "", "")]

    def fake_run(command, env, capture_output, text, check, timeout):
        status, out, err = outcomes.pop(0)
        return subprocess.CompletedProcess(command, status, stdout=out, stderr=err)

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match=r"(?s)plain side.*exit 1.*out of memory"):
        routing.run_side("plain", [("forward", 64, False, 1024)], "/t/trial.json")
    with pytest.raises(RuntimeError, match=r"gluon side.*exit 0, 0 lines out"):
        routing.run_side("gluon", [("forward", 64, False, 1024)], "/t/trial.json")


def test_a_side_times_each_job_through_the_perf_grids_runner(monkeypatch):
    # The side's own measuring on this machine's device, at lengths the CPU's interpreter runs:
    # each job's runner is built and handed to the timer once (timed here by one call of it).
    import torch

    import attnkit_perf.bench as bench

    timed = []

    def one_call(fn, device, budget_s):
        fn()
        timed.append(budget_s)
        return 0.001 * len(timed)

    monkeypatch.setattr(bench, "median_time_s", one_call)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    jobs = [("forward", 128, False, 16), ("backward", 128, True, 16)]
    times = routing.side_times(jobs, budget_s=0.25, device=device, expect="plain")
    assert times == {"forward": {"d128-full": {16: 1.0}}, "backward": {"d128-causal": {16: 2.0}}}
    assert timed == [0.25, 0.25]


def test_a_side_refuses_to_time_a_pass_planned_on_the_other_kernel():
    # N = 16 is below the Gluon size floor (and a CPU runs no Gluon kernel): the Gluon side
    # would time the plain kernel, and the two sides would compare it with itself.
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pytest.raises(
        RuntimeError, match=r"forward d64-full N=16: the gluon side would run the plain kernel"
    ):
        routing.side_times([("forward", 64, False, 16)], device=device, expect="gluon")


def test_a_sides_process_prints_its_times_as_its_last_line(monkeypatch, capsys):
    from attnkit_tools.pages import provenance

    seen = []

    def fake_side_times(jobs, expect):
        seen.append((jobs, expect))
        return {"backward": {"d128-causal": {2048: 1.5}}}

    monkeypatch.setattr(provenance, "require_cuda", lambda tool: None)
    monkeypatch.setattr(routing, "side_times", fake_side_times)
    assert routing.main(["--side", '[["backward", 128, true, 2048]]', "--expect", "gluon"]) == 0
    assert seen == [([("backward", 128, True, 2048)], "gluon")]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == {"backward": {"d128-causal": {"2048": 1.5}}}

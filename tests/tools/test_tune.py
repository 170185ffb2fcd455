"""attnkit_tools.tune.configs's choice among timed candidates (CPU only: no kernel runs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from attnkit.triton.config import KernelConfig
from attnkit.triton.gluon.config import (
    BackwardConfig,
    backward_configs,
    forward_configs,
    packaged_section,
    routed_cells,
)
from attnkit_tools.tune.configs import _label, closest_to_best
from attnkit_tools.tune.configs import main as tune_main
from attnkit_tools.tune.gluon import (
    carried_section,
    chosen_as_routed,
    merge_measured,
    write_families,
)
from attnkit_tools.tune.ranking import backward_batch, time_over_best
from attnkit_tools.tune.routing import routed_from

SEQ_LENS = (1024, 4096, 16384)
SPRINTER = KernelConfig(128, 128, 8, 3)  # fastest at the longest length, poor at the shortest
STEADY = KernelConfig(64, 64, 4, 3)  # a little slower than the best at every length
SLOW = KernelConfig(32, 32, 4, 2)


def _timings(**times) -> dict:
    labels = {"sprinter": SPRINTER, "steady": STEADY, "slow": SLOW}
    return {_label(labels[name]): dict(zip(map(str, SEQ_LENS), t, strict=True)) for name, t in times.items()}


def test_the_config_closest_to_the_best_at_every_length_wins_over_the_fastest_at_one():
    timings = _timings(sprinter=(2.0, 1.0, 10.0), steady=(1.05, 1.05, 10.5), slow=(3.0, 3.0, 30.0))
    assert closest_to_best([SPRINTER, STEADY, SLOW], timings, SEQ_LENS) == STEADY


def test_a_config_best_everywhere_is_chosen_and_none_without_candidates():
    timings = _timings(sprinter=(0.9, 0.9, 9.0), steady=(1.0, 1.0, 10.0), slow=(3.0, 3.0, 30.0))
    assert closest_to_best([SLOW, STEADY, SPRINTER], timings, SEQ_LENS) == SPRINTER
    assert closest_to_best([], {}, SEQ_LENS) is None


def test_a_cell_is_routed_from_where_gluon_stays_faster_to_the_longest_length():
    plain = {1024: 1.0, 2048: 2.0, 4096: 4.0, 8192: 8.0, 16384: 16.0}
    assert routed_from({1024: 1.2, 2048: 1.9, 4096: 4.1, 8192: 7.0, 16384: 15.0}, plain) == 8192
    assert routed_from({n: t * 0.9 for n, t in plain.items()}, plain) == 1024
    assert routed_from({**{n: t * 0.9 for n, t in plain.items()}, 16384: 16.5}, plain) is None


ROUTING_PLAIN = {1024: 1.0, 2048: 2.0, 4096: 4.0, 8192: 8.0, 16384: 16.0}


def test_a_candidate_is_judged_as_routed_not_by_lengths_where_the_plain_kernel_runs():
    steady = {n: 0.98 * t for n, t in ROUTING_PLAIN.items()}  # routed from 1024, 2% ahead
    # Twice the plain time at 1024, where it would not run; 5-10% ahead from 2048 on.
    long = {1024: 2.0, 2048: 1.9, 4096: 3.6, 8192: 7.2, 16384: 14.4}
    candidates = {"steady": steady, "long": long}
    assert chosen_as_routed(candidates, ROUTING_PLAIN) == ("long", 2048)
    own_times = time_over_best(candidates)
    assert min(own_times, key=own_times.__getitem__) == "steady", "the 1024 time would have decided"


def test_candidates_routed_nowhere_fall_back_to_their_own_times():
    candidates = {"slower": {n: 1.2 * t for n, t in ROUTING_PLAIN.items()},
                  "closer": {n: 1.1 * t for n, t in ROUTING_PLAIN.items()}}  # fmt: skip
    assert chosen_as_routed(candidates, ROUTING_PLAIN) == ("closer", None)


def _table(path, gpu_key, section=None):
    table = {"gpu_key": gpu_key, "families": {"16bit-d64-full": {"fwd": {"block_m": 64}}}}
    if section is not None:
        table["gluon"] = section
    path.write_text(json.dumps(table))
    return path


MEASURED_CELL = {"block_m": 64, "block_n": 128, "stages": 2, "overlap": True, "pingpong": False,
                 "persistent": False, "consumer_regs": 240, "producer_regs": 24, "maxnreg": 168}  # fmt: skip


def test_a_carried_over_section_says_where_it_was_measured_and_keeps_the_families(tmp_path):
    section = {"provenance": {"gpu_key": "gpu-a", "commit": "abc"}, "forward": {"d128-full": MEASURED_CELL},
               "routed": {"forward": {"d128-full": 4096}}}  # fmt: skip
    source = _table(tmp_path / "a.json", "gpu-a", section)
    target = _table(tmp_path / "b.json", "gpu-b")
    assert tune_main(["--gluon-carry-over", str(source), "--out", str(target)]) == 0
    written = json.loads(target.read_text())
    assert written["families"] == {"16bit-d64-full": {"fwd": {"block_m": 64}}}
    assert (
        written["gluon"]["forward"] == section["forward"] and written["gluon"]["routed"] == section["routed"]
    )
    note = written["gluon"]["provenance"]["source"]
    assert "carried over from the gpu-a measurement" in note and "not measured on gpu-b" in note
    # Carried again: still the first GPU's measurement, not nested.
    again = _table(tmp_path / "c.json", "gpu-c")
    carry = carried_section(json.loads(target.read_text()), str(target), "gpu-c")
    assert carry["provenance"]["measured"] == {"gpu_key": "gpu-a", "commit": "abc"}, carry
    assert routed_cells(carry) == {(128, False): 4096} and forward_configs(carry)[128, False].block_n == 128
    assert again.exists()


def test_measured_cells_replace_the_carried_ones_and_keep_the_others(tmp_path):
    cells = {"d64-full": MEASURED_CELL, "d128-full": MEASURED_CELL}
    routed = {"forward": {"d64-full": 4096, "d128-full": 4096}}
    measured_on_a = {"provenance": {"gpu_key": "gpu-a"}, "forward": cells, "routed": routed}
    section = carried_section({"gluon": measured_on_a}, "a.json", "gpu-b")
    path = _table(tmp_path / "b.json", "gpu-b", section)
    measured = {"provenance": {"gpu_key": "gpu-b"}, "seq_lens": [4096], "routing_seq_lens": [4096],
                "forward": {"d64-full": {**MEASURED_CELL, "stages": 3}}, "routed": {"forward": {}},
                "timings_ms": {"forward": {"d64-full": {}}}}  # fmt: skip
    merge_measured(str(path), measured)
    written = json.loads(path.read_text())["gluon"]
    assert written["provenance"] == {"gpu_key": "gpu-b"}
    assert written["forward"]["d64-full"]["stages"] == 3 and written["forward"]["d128-full"] == MEASURED_CELL
    assert written["routed"]["forward"] == {"d128-full": 4096}, (
        "a cell measured slower must leave the routing"
    )
    write_families(str(path), {"gpu_key": "gpu-b", "families": {}})
    assert json.loads(path.read_text())["gluon"] == written, "a Triton tuning run dropped the Gluon section"


def test_the_packaged_tables_carry_the_h100_gluon_measurement():
    h100, h200 = (packaged_section(key) for key in ("nvidia-h100-80gb-hbm3", "nvidia-h200"))
    assert forward_configs(h100) == forward_configs(h200) and routed_cells(h100) == routed_cells(h200)
    assert "not measured on nvidia-h200" in h200["provenance"]["source"]
    assert set(forward_configs(h100)) == {(d, c) for d in (64, 128) for c in (False, True)}


def test_a_gluon_candidate_that_fails_to_compile_or_is_wrong_is_recorded_not_timed(monkeypatch):
    from attnkit_tools.tune import gluon as tune_gluon

    def rule(head_dim, causal, cfg):
        if cfg.consumers == 3:
            raise RuntimeError("out of resources: shared memory")
        return "out: 3.1x the yardstick" if cfg.persistent else ""

    def backward_rule(head_dim, causal, cfg):
        return "dq: 2.0x the yardstick" if cfg.gluon_dq and cfg.dq_block_n == 64 else ""

    monkeypatch.setattr(tune_gluon, "outside_tolerance_rule", rule)
    monkeypatch.setattr(tune_gluon, "backward_outside_tolerance_rule", backward_rule)
    warmed = []
    monkeypatch.setattr(tune_gluon, "_warm_up", lambda *job: warmed.append(job))
    jobs = tune_gluon.candidate_jobs([(128, True)], ("forward", "backward"))
    verdicts = tune_gluon.check_all(jobs, workers=1)
    assert warmed == [job for job in jobs if verdicts[job] == ""], "only a usable candidate is warmed up"
    assert verdicts["forward", 128, True, "2wg-s2"] == ""
    assert verdicts["forward", 128, True, "3wg-n128-s3"].startswith("failed: RuntimeError: out of resources")
    assert verdicts["forward", 128, True, "2wg-persistent-s2"] == "wrong: out: 3.1x the yardstick"
    assert verdicts["backward", 128, True, "dkdv+dq"] == "wrong: dq: 2.0x the yardstick"
    assert verdicts["backward", 128, True, "dkdv+dq-n128-split"] == ""


#: The configs the kernel's own A/B runs measured fastest per cell on an H200.
KERNEL_MEASURED = {
    (64, False): BackwardConfig(gluon_dq=False),
    (64, True): BackwardConfig(gluon_dq=False),
    (128, False): BackwardConfig(dq_block_n=128),
    (128, True): BackwardConfig(dq_block_n=128, split_masked=True),
}


@pytest.mark.parametrize(("d", "causal"), list(KERNEL_MEASURED))
def test_the_backward_candidates_hold_the_measured_config_and_its_neighbours(d, causal):
    from attnkit_tools.tune import gluon as tune_gluon

    tried = [tune_gluon.BACKWARD_CANDIDATES[label] for label in tune_gluon.backward_candidates(causal)]
    measured = KERNEL_MEASURED[d, causal]
    assert measured in tried
    assert any(cfg.gluon_dq != measured.gluon_dq for cfg in tried), "no neighbour with the other dQ pass"
    if causal:
        assert any(cfg.split_masked != measured.split_masked for cfg in tried), "split_masked not varied"
    else:
        assert not any(cfg.split_masked for cfg in tried), "split_masked changes nothing without a mask"
    jobs = tune_gluon.candidate_jobs([(d, causal)], ("backward",))
    assert {label for *_, label in jobs} == set(tune_gluon.backward_candidates(causal))
    assert backward_batch(16384) == 2 and backward_batch(8192) == 4


def test_the_recorded_backward_is_written_for_the_h200_only(tmp_path):
    section = {
        "provenance": {"source": "carried", "measured": {"gpu_key": "gpu-a"}},
        "forward": {"d128-full": MEASURED_CELL},
        "routed": {"forward": {"d128-full": 4096}},
    }
    h200 = _table(tmp_path / "h200.json", "nvidia-h200", section)
    assert tune_main(["--gluon-recorded-backward", "--out", str(h200)]) == 0
    written = json.loads(h200.read_text())["gluon"]
    assert written["provenance"] == section["provenance"], "the forward's provenance changed"
    assert forward_configs(written) == forward_configs(section)
    assert routed_cells(written) == {(128, False): 4096}
    assert routed_cells(written, "backward") == dict.fromkeys(KERNEL_MEASURED, 4096)
    assert backward_configs(written) == KERNEL_MEASURED
    recorded = written["provenance_of"]["backward"]
    assert "recorded from the nvidia-h200 measurement" in recorded["source"]
    assert "N=4096/8192/16384" in recorded["measured"]["measured"]
    h100 = _table(tmp_path / "h100.json", "nvidia-h100-80gb-hbm3", section)
    with pytest.raises(SystemExit, match="measured on nvidia-h200, not on nvidia-h100"):
        tune_main(["--gluon-recorded-backward", "--out", str(h100)])
    assert "backward" not in json.loads(h100.read_text())["gluon"]


def test_a_measured_backward_replaces_the_recorded_one_and_its_provenance(tmp_path):
    from attnkit_tools.tune.gluon import recorded_backward

    section = {
        "provenance": {"gpu_key": "nvidia-h200", "commit": "f"},
        "forward": {"d128-full": MEASURED_CELL},
        "routed": {"forward": {"d128-full": 4096}},
    }
    path = _table(tmp_path / "h200.json", "nvidia-h200", section)
    merge_measured(str(path), recorded_backward("nvidia-h200"))
    untuned = BackwardConfig().as_dict()
    measured = {
        "provenance": {"gpu_key": "nvidia-h200", "commit": "g"},
        "routed": {"backward": {"d64-full": 8192}},
        "backward": {"d64-full": untuned, "d64-causal": untuned},
        "timings_ms": {"backward": {"d64-full": {}, "d64-causal": {}}},
    }
    merge_measured(str(path), measured)
    written = json.loads(path.read_text())["gluon"]
    assert routed_cells(written, "backward") == {(64, False): 8192, (128, False): 4096, (128, True): 4096}, (
        "d64-causal measured slower must leave the routing; the unmeasured cells stay"
    )
    assert backward_configs(written)[64, False] == BackwardConfig()
    assert written["provenance"] == section["provenance"], "a backward-only run replaced the forward's"
    assert written["provenance_of"]["backward"] == measured["provenance"]
    # Both passes measured in one run: one provenance for the section.
    both = {**measured, "forward": {}, "routed": {"forward": {}, "backward": {}}, "seq_lens": [4096]}
    merge_measured(str(path), both)
    written = json.loads(path.read_text())["gluon"]
    assert written["provenance"] == measured["provenance"] and "provenance_of" not in written


@pytest.mark.parametrize(
    "argv",
    [
        ["--jobs", "40"],
        ["--gluon", "--cells", "d64-full", "d64-causal", "--jobs", "14"],
        ["--gluon", "--cells", "d128-causal", "--jobs", "14"],
        ["--gluon", "--passes", "forward", "backward", "--cells", "d64-full", "--jobs", "15"],
        ["--gluon", "--passes", "backward", "--cells", "d128-full", "--jobs", "15"],
    ],
)
def test_the_tuning_commands_parse(argv, monkeypatch):
    """The commands a GPU run is given parse (stopped right after parsing, with no GPU)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parsed = real(self, args, namespace)
        raise _Parsed(parsed)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as parsed:
        tune_main(argv)
    assert parsed.value.args[0].jobs == int(argv[-1])


class _Parsed(Exception):
    pass


def test_the_backward_measurement_keeps_the_closest_candidate_and_routes_where_the_public_call_is_faster(
    monkeypatch, tmp_path
):
    """measure_section's backward pass with every GPU call faked (times by candidate and N):
    the wrong candidate is not timed, the one closest to the best at every length is kept, and
    the cell is routed where attention() ran faster with it in every round, not where its
    launcher beat the plain one's."""
    import triton.testing

    import attnkit.triton.gluon as gluon
    import attnkit.triton.gluon.backward_launch as backward_launch
    import attnkit.triton.launch as triton_launch
    import attnkit_perf.bench as bench
    from attnkit_tools.tune import gluon as tune_gluon
    from attnkit_tools.tune import ranking, routing

    lengths = tune_gluon.ROUTING_SEQ_LENS
    plain = dict(zip(lengths, (1.0, 2.0, 4.0, 8.0, 16.0), strict=True))
    by_label = {
        "dkdv": (1.2, 2.2, 3.9, 7.9, 15.9),  # faster from 4096 on, a little
        "dkdv+dq-n128-split": (1.1, 2.1, 3.5, 7.0, 14.0),  # faster from 4096 on, the most
        "dkdv+dq-n128": (0.5, 1.0, 2.0, 4.0, 8.0),  # wrong: never timed
    }
    configs = {tune_gluon.BACKWARD_CANDIDATES[label]: times for label, times in by_label.items()}

    def fake_bench(fn, return_mode):
        assert return_mode == "median"
        n = fn.args[0]  # the fake inputs are their length
        if fn.func is fake_plain_backward:
            return plain[n]
        times = configs.get(fn.args[-1], tuple(9 * t for t in plain.values()))
        return dict(zip(lengths, times, strict=True))[n]

    def fake_plain_backward(*args):
        raise AssertionError("timed, not run")

    batches = []

    def fake_inputs(dtype, head_dim, causal, n, batch=4):
        batches.append((n, batch))
        return n, n, n, n, (head_dim, causal)

    monkeypatch.setattr(gluon, "unavailable_reason", lambda: None)
    monkeypatch.setattr(bench, "provenance", lambda device: {"gpu_key": "fake"})
    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(ranking, "tuning_inputs", fake_inputs)
    monkeypatch.setattr(triton_launch, "launch_setup", lambda problem: None)
    monkeypatch.setattr(triton_launch, "attention_forward", lambda *args: (None, None))
    monkeypatch.setattr(triton_launch, "attention_backward", fake_plain_backward)
    monkeypatch.setattr(backward_launch, "launch", lambda *args: None)
    wrong = {("backward", 128, True, "dkdv+dq-n128"): "wrong: dq: 2.0x the yardstick"}
    monkeypatch.setattr(
        tune_gluon, "check_all", lambda jobs, workers: {job: wrong.get(job, "") for job in jobs}
    )
    # Through attention(): the Gluon side is faster in every round from 8192 on; at 4096 its
    # launcher wins, but the public call is slower in one round of three.
    public = {"plain": (1.0, 2.0, 4.0, 8.0, 16.0), "gluon": (1.5, 2.5, 3.9, 7.5, 15.0)}
    sides = []

    def fake_side(side, jobs, table_path):
        sides.append(side)
        assert {tuple(job) for job in jobs} == {("backward", 128, True, n) for n in lengths}
        trial = json.loads(Path(table_path).read_text())
        assert trial["gluon"]["routed"]["backward"] == {"d128-causal": lengths[0]}
        assert trial["families"] == {"f": 1}, "the plain side runs the table's own families"
        times = dict(zip(lengths, public[side], strict=True))
        if side == "gluon" and len(sides) == 4:
            times[4096] = 4.1
        return {"backward": {"d128-causal": times}}

    monkeypatch.setattr(routing, "run_side", fake_side)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"gpu_key": "fake", "families": {"f": 1}}))
    log = []
    section = tune_gluon.measure_section([4096], log.append, str(table), [(128, True)], passes=("backward",))
    assert "forward" not in section and section["provenance"] == {"gpu_key": "fake"}
    kept = tune_gluon.BACKWARD_CANDIDATES["dkdv+dq-n128-split"]
    assert section["backward"] == {"d128-causal": kept.as_dict()}
    assert sides == ["plain", "gluon"] * routing.ROUNDS
    assert section["routed"] == {"backward": {"d128-causal": 8192}}
    public_call = section["timings_ms"]["backward"]["d128-causal"]["public_call"]
    assert public_call["gluon"]["4096"] == [3.9, 4.1, 3.9] and public_call["plain"]["8192"] == [8.0] * 3
    timings = section["timings_ms"]["backward"]["d128-causal"]
    assert timings["dkdv+dq-n128"] == "wrong: dq: 2.0x the yardstick"
    assert timings["plain"] == {str(n): t for n, t in plain.items()}
    assert timings["dkdv"]["16384"] == 15.9
    assert batches == [(n, 2 if n == 16384 else 4) for n in lengths]


def test_a_gluon_tune_refuses_a_table_without_triton_families_before_it_measures(monkeypatch, tmp_path):
    # Its cells are routed against the plain kernels that table configures (the routing's
    # trial table is a copy of it): without them it would fail after minutes of compiling.
    from attnkit_tools.tune import configs

    monkeypatch.setattr(configs, "require_cuda", lambda tool: None)
    monkeypatch.setattr(configs, "measure_section", lambda *args, **kwargs: pytest.fail("measured"))
    out = tmp_path / "new-gpu.json"
    with pytest.raises(SystemExit, match="holds no Triton table"):
        tune_main(["--gluon", "--out", str(out)])
    out.write_text(json.dumps({"gluon": {}}))
    with pytest.raises(SystemExit, match=r"run python -m attnkit_tools\.tune\.configs first"):
        tune_main(["--gluon", "--out", str(out)])

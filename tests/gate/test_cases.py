"""Benchmark cases as plain data: names, the dict a worker of either side rebuilds them from,
and the execution modes (eager, compiled, graph) of the grid."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attnkit_perf.measure import cases
from attnkit_perf.measure.cases import BenchCase, build_runner, gpu_suite_cases

HOST = BenchCase("triton", "fwd", 1, 8, 8, 128, 64, True)


def test_a_mode_other_than_eager_is_in_the_name_and_the_dict():
    graphed = BenchCase("triton", "fwd", 1, 8, 8, 128, 64, True, mode="graph")
    assert graphed.name == "fwd[triton-bf16-B1-H8-N128-D64-causal-graph]"
    assert graphed.as_dict()["mode"] == "graph"
    assert BenchCase(**graphed.as_dict()) == graphed


def test_an_eager_case_keeps_the_form_older_baselines_and_bases_know():
    """No ``mode`` key for eager: a base checkout from before modes existed builds the case."""
    assert "mode" not in HOST.as_dict()
    assert HOST.name == "fwd[triton-bf16-B1-H8-N128-D64-causal]"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mode": "jit"}, r"mode: expected one of \('eager', 'compiled', 'graph', 'loop'\), got 'jit'"),
        ({"mode": "graph", "pass_name": "bwd"}, r"mode 'graph' captures a forward only; pass_name is 'bwd'"),
    ],
)
def test_a_bad_mode_is_refused_with_its_reason(changes, message):
    with pytest.raises(ValueError, match=message):
        BenchCase(**{**HOST.as_dict(), **changes})


def test_the_grid_times_compiled_training_and_graph_replay_on_the_host_bound_shape():
    names = {c.name for c in gpu_suite_cases() if c.mode in ("compiled", "graph")}
    assert names == {
        "fwd+bwd[triton-bf16-B1-H8-N128-D64-causal-compiled]",
        "fwd[triton-bf16-B1-H8-N128-D64-causal-graph]",
        "fwd[sdpa-bf16-B1-H8-N128-D64-causal-graph]",
    }


def test_the_host_bound_shape_is_timed_as_a_loop_of_calls_with_no_flush():
    """The per-call cost guards: eager calls back to back, as a loop runs them. A flush before each
    call would give the host a head start as long as the flush and hide the cost they guard."""
    loops = [c for c in gpu_suite_cases() if c.mode == "loop"]
    paths = ("triton", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
    small = [c for c in loops if c.seq_len == 128 and c.kv_heads == c.q_heads and c.window is None]
    assert {(c.backend, c.pass_name) for c in small} == {(b, p) for b in paths for p in ("fwd", "fwd+bwd")}
    assert all(not c.flushed and c.host_timed for c in loops)
    assert all(c.flushed for c in gpu_suite_cases() if c.mode != "loop")
    assert loops[0].name == "fwd[triton-bf16-B1-H8-N128-D64-causal-loop]"
    assert not any(c.seq_len == 128 and c.mode == "eager" for c in gpu_suite_cases()), (
        "an eager case on the host-bound shape times only its kernel: the flush hides its host cost"
    )


def test_the_host_metric_covers_a_decode_step_gqa_and_a_window():
    """Host work the N=128 forward does not run (head grouping, a window's band, one query
    against a cache) has a host-timed case of its own, on Triton and an SDPA path."""
    host = [c for c in gpu_suite_cases() if c.host_timed]
    decode = [c for c in host if c.seq_len == 1 and c.keys > 1]
    gqa = [c for c in host if c.kv_heads < c.q_heads and c.seq_len > 1]
    window = [c for c in host if c.window is not None]
    for what, group in (("decode", decode), ("GQA", gqa), ("window", window)):
        backends = {c.backend for c in group}
        assert "triton" in backends and len(backends) >= 2, f"{what}: {sorted(c.name for c in group)}"
    names = [c.name for c in gpu_suite_cases()]
    assert len(names) == len(set(names)), "benchmark names are unique"


def test_a_compiled_case_compiles_fullgraph_before_the_first_timed_call(monkeypatch):
    """The runner is built compiled (fullgraph, so a graph break is an error, not a slowdown)
    and has run once, forward and backward, before it is handed to the timer."""
    compiled_with, calls = [], []

    def fake_compile(fn, **options):
        compiled_with.append(options)

        def counted(*args):
            calls.append(1)
            return fn(*args)

        return counted

    monkeypatch.setattr(torch, "compile", fake_compile)
    case = BenchCase("naive", "fwd+bwd", 1, 2, 2, 16, 8, True, "fp32", mode="compiled")
    runner = build_runner(case, "cpu")
    assert compiled_with == [{"fullgraph": True}]
    assert len(calls) == 1, f"{len(calls)} compiled calls at build, expected the one warm-up"
    dq, dk, dv = runner()
    assert len(calls) == 2 and dq.shape == (1, 2, 16, 8) and dk.shape == dv.shape == (1, 2, 16, 8)


def test_a_graph_case_captures_after_warming_up(monkeypatch):
    """Capture happens once, after the warm-up calls (which compile kernels and fill caches: a
    capture cannot compile); the runner only replays. Recorded with stand-ins for the CUDA
    stream and graph, so it runs on the CPU."""
    events = []

    class FakeGraph:
        def replay(self):
            events.append("replay")

    class Capture:
        def __init__(self, graph):
            pass

        def __enter__(self):
            events.append("capture")

        def __exit__(self, *exc):
            return False

    class FakeStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    original = cases.attnkit.attention
    monkeypatch.setattr(
        cases.attnkit, "attention", lambda *a, **kw: events.append("call") or original(*a, **kw)
    )
    runner = build_runner(BenchCase("naive", "fwd", 1, 2, 2, 16, 8, True, "fp32", mode="graph"), "cpu")
    warmups = ["call"] * cases._CAPTURE_WARMUP_CALLS
    assert events == [*warmups, "capture", "call"], events
    runner()
    assert events[-1] == "replay", events


@pytest.mark.parametrize(
    "case",
    [
        BenchCase("sdpa", "fwd+bwd", 2, 4, 2, 16, 8, True, "fp32", kv_len=24),
        BenchCase("sdpa", "fwd", 1, 2, 2, 32, 8, True, "fp32", window=(4, 0)),
        HOST,
    ],
    ids=lambda c: c.name,
)
def test_a_case_is_the_problem_attnkit_validates(case):
    """The case's shape is attnkit's own AttentionProblem: its inputs validate to the same problem,
    and the derived metrics follow from it (no field restated under another meaning)."""
    from attnkit.inputs import check_inputs

    q, k, v, grad_out = cases.make_inputs(case, "cpu")
    seen = check_inputs(q, k, v, case.causal, None, case.window)
    expected = case.problem
    assert (seen.batch, seen.q_heads, seen.kv_heads, seen.q_len, seen.kv_len, seen.head_dim) == (
        expected.batch,
        expected.q_heads,
        expected.kv_heads,
        expected.q_len,
        expected.kv_len,
        expected.head_dim,
    ), f"inputs {tuple(q.shape)}, {tuple(k.shape)} against {expected}"
    assert (seen.window, seen.dtype, seen.causal) == (expected.window, expected.dtype, expected.causal)
    assert grad_out.shape == (expected.batch, expected.q_heads, expected.q_len, expected.value_dim)
    assert case.kv_bytes == k.nbytes + v.nbytes, (
        f"kv_bytes {case.kv_bytes}, K and V hold {k.nbytes + v.nbytes}"
    )


def test_a_backend_of_the_grid_keeps_its_cases_and_their_names():
    """The stored baselines key on the names: naming a backend of the grid selects its cases."""
    from attnkit_perf.measure.cases import backend_cases, cpu_suite_cases

    assert backend_cases("triton", gpu=True) == [c for c in gpu_suite_cases() if c.backend == "triton"]
    assert backend_cases("naive", gpu=False) == [c for c in cpu_suite_cases() if c.backend == "naive"]


def test_another_backend_is_timed_on_the_grids_standard_shapes():
    from attnkit_perf.measure.cases import backend_cases

    cases = backend_cases("mine", gpu=True)
    names = {c.name for c in cases}
    for name in (
        "fwd[mine-bf16-B4-H16-N4096-D128-causal]",
        "bwd[mine-bf16-B4-H16kv4-N4096-D128-causal]",
        "fwd+bwd[mine-bf16-B4-H16-N4096-D128-causal]",
        "fwd[mine-bf16-B1-H8-N128-D64-causal-loop]",
        "fwd[mine-bf16-B8-H32kv8-N1-M32768-D128-causal]",
        "bwd[mine-bf16-B1-H16-N16384-D128-causal-W1024]",
    ):
        assert name in names, f"{name} not in {sorted(names)}"
    triton_forwards = {
        c.shape_label for c in gpu_suite_cases() if c.backend == "triton" and c.pass_name == "fwd"
    }
    mine_forwards = {c.shape_label for c in cases if c.pass_name == "fwd"}
    assert mine_forwards == {s for s in triton_forwards if not s.endswith("-graph")}, (
        f"the shapes differ from triton's: {sorted(mine_forwards ^ triton_forwards)}"
    )
    assert len(names) == len(cases), "a case is listed twice"
    cpu = backend_cases("mine", gpu=False)
    assert [c.name for c in cpu] == [
        f"{p}[mine-fp32-B1-H2-N128-D32{mask}]" for p in ("fwd", "bwd") for mask in ("-causal", "")
    ], [c.name for c in cpu]


def test_a_forward_only_backend_has_its_forwards_only():
    from attnkit_perf.measure.cases import backend_cases

    for gpu in (True, False):
        everything = backend_cases("mine", gpu=gpu)
        forwards = backend_cases("mine", gpu=gpu, forward_only=True)
        assert forwards == [c for c in everything if c.pass_name == "fwd"] and forwards, forwards

"""``backend="auto"`` reads its GPU model's measured table: the fastest path of a problem's cell
first (per inference or training call), the fallback order the backends declare (their
``auto_rank``) after it and everywhere else."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import attnkit
import attnkit.api
import attnkit.auto
import attnkit.registry
from attnkit.auto import (
    TABLE_ENV,
    TABLE_FORMAT,
    AutoTable,
    auto_order,
    cell_key,
    deterministic_order,
    fallback_order,
    table_path,
)
from attnkit.inputs import check_inputs
from attnkit.reference import naive_attention
from attnkit.registry import Backend

# The table's logic, run with recording paths on CPU tensors: the CPU CI's run decides it.
pytestmark = pytest.mark.device_independent

SEQ_LENS = (1024, 4096)


def problem(n=2048, m=None, d=64, dv=None, causal=True, window=None, dtype=torch.bfloat16):
    q = torch.empty(1, 2, n, d, dtype=dtype, device="meta")
    k = torch.empty(1, 2, n if m is None else m, d, dtype=dtype, device="meta")
    v = torch.empty(1, 2, n if m is None else m, d if dv is None else dv, dtype=dtype, device="meta")
    return check_inputs(q, k, v, causal, None, window)


def cell(d, causal, n, pass_name, **ms):
    return {"head_dim": d, "causal": causal, "seq_len": n, "pass": pass_name, "ms": ms}


def table(*cells):
    return {"format": TABLE_FORMAT, "gpu_key": "test-gpu", "provenance": {}, "cells": list(cells)}


@pytest.mark.parametrize(
    ("kwargs", "training", "expected"),
    [
        ({}, False, (64, True, 1024, "fwd")),
        ({}, True, (64, True, 1024, "fwd+bwd")),
        ({"n": 4096}, False, (64, True, 4096, "fwd")),
        ({"n": 100_000}, False, (64, True, 4096, "fwd")),  # longer than measured: the longest
        ({"n": 512}, False, (64, True, 1024, "fwd")),  # shorter than measured: the shortest
        ({"causal": False, "dtype": torch.float16}, False, (64, False, 1024, "fwd")),
        ({"dtype": torch.float32}, False, None),  # not measured
        ({"m": 4096}, False, None),  # N != M: decode and prefill shapes keep the fallback order
        ({"window": (128, 0)}, False, None),
        ({"dv": 32}, False, None),
    ],
)
def test_a_problem_falls_in_its_measured_cell_or_none(kwargs, training, expected):
    got = cell_key(problem(**kwargs), training, SEQ_LENS)
    assert got == expected, f"{kwargs} training={training}: cell {got}, expected {expected}"


def test_a_table_orders_each_cell_fastest_first_and_drops_paths_that_did_not_run():
    t = AutoTable(table(cell(64, True, 1024, "fwd", a=2.0, b=1.0, c=None, e=3.0)), "t.json")
    assert t.order(problem(n=1024), training=False) == ("b", "a", "e")
    assert t.order(problem(n=1024), training=True) == (), "no training cell: nothing measured"
    assert t.order(problem(n=1024, d=128), training=False) == (), "an unmeasured head dim"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cells": []}, "format 1"),
        ({"format": 99, "cells": []}, "format 1"),
        ([], "got list"),
        (table(cell(64, True, 1024, "bwd", a=1.0)), "pass must be one of"),
    ],
)
def test_a_malformed_table_is_refused_with_its_path(data, message):
    with pytest.raises(ValueError, match=message) as err:
        AutoTable(data, "bad.json")
    assert "bad.json" in str(err.value), str(err.value)


#: The order attnkit's own backends declare (``auto_rank`` in attnkit/builtins.py): the test's
#: expectation (what README.md and docs/API.md promise), not a source anything reads.
BUILT_IN_FALLBACK = ("triton", "sdpa", "tiled", "naive")


def test_without_a_table_auto_keeps_the_fallback_order_the_built_ins_declare(monkeypatch):
    monkeypatch.delenv(TABLE_ENV, raising=False)
    assert table_path(torch.device("cpu")) is None
    assert fallback_order() == BUILT_IN_FALLBACK
    assert auto_order(problem(), training=True) == BUILT_IN_FALLBACK


def test_a_table_keeps_the_fallback_order_after_its_measured_paths():
    t = AutoTable(table(cell(64, True, 1024, "fwd", sdpa=2.0, **{"sdpa-flash": 1.0})), "t.json")
    assert t.paths == {"sdpa", "sdpa-flash"}
    measured = t.order(problem(n=1024), training=False)
    assert (*measured, *(n for n in fallback_order() if n not in measured)) == (
        "sdpa-flash",
        "sdpa",
        "triton",
        "tiled",
        "naive",
    )


def test_a_registered_backend_joins_the_fallback_order_at_its_rank(monkeypatch):
    """Lowest rank first, equal ranks in registration order; a backend without a rank is never
    a fallback. Registering a ranked backend drops the memoised plans: the next ``auto`` call
    tries it at once."""
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    before = attnkit.attention(q, k, v, causal=True)  # memoises auto's plan for this signature
    ran = []

    def first(q, k, v, problem):
        ran.append("first")
        return naive_attention(q, k, v, problem)

    ranks = [("ranked-first", -1), ("ranked-with-sdpa", 20), ("ranked-last", 1000), ("not-ranked", None)]
    try:
        for name, rank in ranks:
            attnkit.register_backend(name, run=first if rank == -1 else naive_attention, auto_rank=rank)
        assert fallback_order() == (
            "ranked-first",
            *BUILT_IN_FALLBACK[:2],
            "ranked-with-sdpa",
            *BUILT_IN_FALLBACK[2:],
            "ranked-last",
        )
        torch.testing.assert_close(attnkit.attention(q, k, v, causal=True), before)
        assert ran == ["first"], "the memoised plan outlived the new fallback"
    finally:
        for name, _ in ranks:
            attnkit.unregister_backend(name)
    assert fallback_order() == BUILT_IN_FALLBACK


@pytest.mark.parametrize("rank", ["1", 1.0, True], ids=["a-str", "a-float", "a-bool"])
def test_an_auto_rank_that_is_not_an_int_is_refused_naming_the_field(rank):
    with pytest.raises(TypeError, match=rf"Backend\('bad'\): auto_rank must be an int or None, got {rank!r}"):
        attnkit.register_backend("bad", run=naive_attention, auto_rank=rank)
    assert "bad" not in attnkit.backend_names(), "nothing was registered"


@pytest.fixture
def spies(monkeypatch, tmp_path):
    """Two registered paths that record which ran, and a table naming the first for inference
    and the second for training, installed through the environment variable."""
    ran = []

    def spy(name):
        def run(q, k, v, p):
            ran.append(name)
            return naive_attention(q, k, v, p)

        return Backend(name, run=run, description="records its calls")

    for name in ("spy-infer", "spy-train"):
        monkeypatch.setitem(attnkit.registry._REGISTRY, name, spy(name))
    path = tmp_path / "table.json"
    path.write_text(
        json.dumps(
            table(
                cell(16, True, 8, "fwd", **{"spy-infer": 1.0, "spy-train": 2.0}),
                cell(16, True, 8, "fwd+bwd", **{"spy-infer": 2.0, "spy-train": 1.0}),
            )
        )
    )
    monkeypatch.setenv(TABLE_ENV, str(path))
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    return ran


def test_auto_runs_the_tables_fastest_path_for_inference_and_for_training(spies):
    q, k, v = (torch.randn(1, 1, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    attnkit.attention(q, k, v, causal=True)
    assert spies == ["spy-infer"], f"inference ran {spies}"
    q.requires_grad_()
    attnkit.attention(q, k, v, causal=True).float().sum().backward()
    assert spies == ["spy-infer", "spy-train"], f"a training call ran {spies[1:]}"
    with torch.no_grad():
        attnkit.attention(q, k, v, causal=True)
    assert spies[-1] == "spy-infer", "under no_grad no backward is recorded: the inference pick"


def test_chosen_backend_names_the_path_that_auto_runs_for_each_kind_of_call(spies):
    q, k, v = (torch.randn(1, 1, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    leaf = q.detach().requires_grad_()
    for inputs, grad, expected in (((q, k, v), True, "spy-infer"), ((leaf, k, v), True, "spy-train"),
                                   ((leaf, k, v), False, "spy-infer")):  # fmt: skip
        with torch.set_grad_enabled(grad):
            chosen = attnkit.chosen_backend(*inputs, causal=True)
            attnkit.attention(*inputs, causal=True)
        assert chosen == expected == spies[-1], f"named {chosen}, ran {spies[-1]}, expected {expected}"


def test_chosen_backend_checks_as_attention_does():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    assert attnkit.chosen_backend(q, k, v, backend="naive") == "naive"
    for call in (attnkit.attention, attnkit.chosen_backend):
        with pytest.raises(ValueError, match="got 'no-such-backend'"):
            call(q, k, v, backend="no-such-backend")
        with pytest.raises(ValueError, match="k"):
            call(q, k[..., :8], v)  # head dims differ: the same input error, before any choice
    empty = torch.randn(1, 2, 0, 16)
    assert attnkit.chosen_backend(empty, k, v) is None, "a zero-size problem runs no backend"
    # The path named for an unmeasured problem (the fallback order) gives auto's bits exactly.
    for grad in (False, True):
        leaf = q.detach().requires_grad_(grad)
        chosen = attnkit.chosen_backend(leaf, k, v, causal=True)
        assert chosen in attnkit.available_backends("cpu"), chosen
        same = attnkit.attention(leaf, k, v, causal=True, backend=chosen)
        assert torch.equal(attnkit.attention(leaf, k, v, causal=True), same), chosen


def test_a_problem_outside_the_table_runs_the_fallback_order(spies):
    q, k, v = (torch.randn(1, 1, 8, 16, dtype=torch.float32) for _ in range(3))
    out = attnkit.attention(q, k, v, causal=True)
    assert spies == [], f"float32 is not measured, yet {spies} ran"
    assert out.shape == (1, 1, 8, 16)


@pytest.mark.parametrize(
    ("warn_only", "expected"),
    [
        (False, ("sdpa-flash", "triton", "sdpa", "sdpa-efficient", "tiled", "naive", "sdpa-math")),
        (True, ("triton", "tiled", "naive", "sdpa-math")),
    ],
    ids=["strict", "warn-only"],
)
@pytest.mark.parametrize("device", ["cpu", "cuda", torch.device("cuda", 1)], ids=str)
def test_deterministic_order_keeps_the_paths_whose_backward_is_deterministic(warn_only, expected, device):
    """cuDNN's backward is never deterministic, nor is a path that declares nothing (flex, a
    plugin); PyTorch's flash and memory-efficient backwards (and its own choice) are only with
    warn_only=False. The same on the CPU and on CUDA, read from each backend's declaration for the
    device's type (no GPU needed: a declaration is data)."""
    order = ("sdpa-cudnn", "sdpa-flash", "triton", "sdpa", "flex", "sdpa-efficient", "tiled", "naive")
    got = deterministic_order((*order, "a-plugin", "sdpa-math"), warn_only, device)
    assert got == expected, f"warn_only={warn_only} on {device}: kept {got}"


def test_deterministic_order_asks_each_backend_for_the_calls_device(monkeypatch):
    """A path declared deterministic on one device type only is kept there and nowhere else."""
    spy = Backend(
        "spy-cpu-only", run=naive_attention, description="declares the CPU only", deterministic=("cpu",)
    )
    monkeypatch.setitem(attnkit.registry._REGISTRY, spy.name, spy)
    for warn_only in (False, True):
        assert deterministic_order((spy.name,), warn_only, torch.device("cpu")) == (spy.name,)
        assert deterministic_order((spy.name,), warn_only, "cuda:0") == (), (
            "kept on a device it does not declare"
        )


@pytest.fixture
def deterministic_mode():
    """Sets torch's deterministic mode for a test: ``deterministic_mode(True, warn_only=...)``;
    the mode found before is restored after it."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_a_training_call_in_deterministic_mode_runs_a_deterministic_path(
    monkeypatch, tmp_path, deterministic_mode
):
    """The table's fastest training path first, unless torch's deterministic mode is on: then
    the fastest one whose backward is deterministic in that mode. Inference calls keep their
    pick (no backward follows)."""
    ran = []
    declared = {
        "spy-fast": {},
        "spy-strict": {"deterministic_when_enforced": True},
        "spy-always": {"deterministic": True},
    }
    for name, traits in declared.items():
        monkeypatch.setitem(
            attnkit.registry._REGISTRY,
            name,
            Backend(
                name,
                run=lambda q, k, v, p, name=name: ran.append(name) or naive_attention(q, k, v, p),
                description="records its calls",
                **traits,
            ),
        )
    path = tmp_path / "table.json"
    times = {"spy-fast": 1.0, "spy-strict": 2.0, "spy-always": 3.0}
    path.write_text(
        json.dumps(table(cell(16, True, 8, "fwd", **times), cell(16, True, 8, "fwd+bwd", **times)))
    )
    monkeypatch.setenv(TABLE_ENV, str(path))
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    q, k, v = (torch.randn(1, 1, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    leaf = q.detach().requires_grad_()

    expected = []
    for mode, training_pick in ((None, "spy-fast"), (False, "spy-strict"), (True, "spy-always")):
        if mode is not None:
            deterministic_mode(True, warn_only=mode)
        assert attnkit.chosen_backend(leaf, k, v, causal=True) == training_pick, f"mode {mode}"
        attnkit.attention(leaf, k, v, causal=True).float().sum().backward()
        attnkit.attention(q, k, v, causal=True)
        expected += [training_pick, "spy-fast"]
        assert ran == expected, f"deterministic mode {mode}: ran {ran[-2:]}, expected {expected[-2:]}"


def test_deterministic_mode_names_why_it_skipped_a_path(monkeypatch, deterministic_mode):
    """When no path with a deterministic backward takes a training call, the error names each
    skipped path and the mode."""
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    for name, backend in list(attnkit.registry._REGISTRY.items()):
        undeclared = dataclasses.replace(backend, deterministic=False, deterministic_when_enforced=False)
        monkeypatch.setitem(attnkit.registry._REGISTRY, name, undeclared)
    deterministic_mode(True)
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    with pytest.raises(
        attnkit.UnsupportedProblemError, match=r"sdpa: its backward is not deterministic on cpu under"
    ):
        attnkit.attention(q, q, q)

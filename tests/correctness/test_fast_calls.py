"""The compiled call memo (:mod:`attnkit.fastpath`): a kept plain SDPA call runs exactly raw
SDPA's ops with the path's kernel, and whatever it does not take (a kernel that declines, a
mode, an operand its layout test does not pass) goes to the prepared run, with the flags put back
and no stray warnings. Which calls it keeps and which operands it passes are the Python memo's
rules: test_fastpath_parity.py. How it is built, found and switched off is tested without the
extension."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, SDPA_PATHS, python_functions_run, skip_if_unavailable
from conftest import SDPA_DTYPE as DTYPE
from torch.nn.attention import sdpa_kernel
from torch.overrides import TorchFunctionMode

import attnkit
import attnkit.api
from attnkit import fastpath
from attnkit.fastpath import loader
from attnkit.prepared import PlainSdpaCall, PreparedRun
from attnkit.sdpa import SDPA_BACKENDS
from attnkit.testing import assert_close_to_reference, compare_to_reference

MEMO = fastpath.memo
needs_memo = pytest.mark.skipif(MEMO is None, reason=f"attnkit.fastpath: {fastpath.status}")


def _operands(shapes, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(DEVICE, DTYPE).requires_grad_(grad) for shape in shapes]


@pytest.fixture
def compiled_memo(monkeypatch):
    """attention() with the compiled memo in front, started empty (and the Python memo too)."""
    if MEMO is None:
        pytest.skip(f"attnkit.fastpath: {fastpath.status}")
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    MEMO.forget()
    yield MEMO
    MEMO.forget()


@pytest.mark.device_independent
@needs_memo
def test_minus_zero_and_zero_scales_are_one_signature(compiled_memo):
    q, k, v = _operands([(1, 2, 8, 16)] * 3)
    for scale in (0.0, -0.0):
        attnkit.attention(q, k, v, scale=scale, backend="naive")
    assert (len(attnkit.api._PLANNED), compiled_memo.size()) == (1, 1)


def _aten_ops(step) -> list[str]:
    """The aten ops ``step`` runs, in order, as the profiler sees them (a dispatch mode would
    make the compiled memo hand the call to the Python run)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return [event.name for event in prof.events() if event.name.startswith("aten::")]


@needs_memo
@pytest.mark.parametrize(
    "shapes",
    [((1, 2, 8, 16),) * 3, ((1, 2, 1, 16), (1, 1, 9, 16), (1, 1, 9, 16))],
    ids=["square", "gqa-decode-step"],
)
@pytest.mark.parametrize("name", SDPA_PATHS)
def test_a_kept_plain_call_runs_exactly_raw_sdpas_ops(compiled_memo, name, shapes):
    """After its first call, a plain problem's call is the compiled memo's own SDPA call: the
    aten ops of raw SDPA with the path's kernel forced, forward and backward (square causal:
    ``is_causal``; one query against more keys: non-causal, ``enable_gqa``)."""
    skip_if_unavailable(name)
    q, k, v = _operands(shapes, grad=True)
    square = shapes[0][2] == shapes[1][2]
    gqa = shapes[0][1] != shapes[1][1]

    def step(attend):
        return lambda: torch.autograd.grad(attend(q, k, v).sum(), (q, k, v))

    kernel = SDPA_BACKENDS[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([kernel]) if kernel is not None else warnings.catch_warnings():
                raw = _aten_ops(
                    step(
                        lambda q, k, v: F.scaled_dot_product_attention(
                            q, k, v, is_causal=square, enable_gqa=gqa
                        )
                    )
                )
        except RuntimeError:
            pytest.skip(
                f"raw SDPA with {name}'s kernel declines: {'; '.join(str(w.message) for w in caught)}"
            )
    attend = step(lambda q, k, v: attnkit.attention(q, k, v, causal=True, backend=name))
    attend()  # the first call: the Python memo's, which makes the entry
    assert compiled_memo.size() == 1
    for call in ("second", "third"):
        assert _aten_ops(attend) == raw, f"{name} ({call} call) ran other ops than raw SDPA"


@needs_memo
@pytest.mark.parametrize("name", SDPA_PATHS)
def test_a_repeated_plain_call_runs_no_python_past_attention(compiled_memo, name):
    """Once kept, a plain problem's call is attention()'s frame and the compiled memo's: no other
    Python function runs (the Python memo's key, the prepared run, the layout rule, the forcer)."""
    skip_if_unavailable(name)
    q, k, v = _operands([(1, 2, 8, 16)] * 3)
    attnkit.attention(q, k, v, causal=True, backend=name)
    entered = python_functions_run(lambda: attnkit.attention(q, k, v, causal=True, backend=name))
    ours = [function for function in entered if function.startswith("attnkit.")]
    assert ours == ["attnkit.api:attention"], f"{name}: a repeated call ran {ours}"


#: Problems of every kind of entry: plain SDPA calls, runs the memo calls (N > M causal, a
#: window, Dv != D), and the other paths.
_PROBLEMS = {
    "square causal": (((2, 4, 8, 16),) * 3, {"causal": True}),
    "decode step, gqa": (((2, 4, 1, 16), (2, 2, 9, 16), (2, 2, 9, 16)), {"causal": True}),
    "more queries than keys": (((1, 2, 9, 16), (1, 2, 5, 16), (1, 2, 5, 16)), {"causal": True}),
    "window": (((1, 2, 8, 16),) * 3, {"window": (2, 1)}),
    "scale": (((1, 2, 8, 16),) * 3, {"scale": 0.125}),
}


@needs_memo
@pytest.mark.parametrize("problem", list(_PROBLEMS.values()), ids=list(_PROBLEMS))
@pytest.mark.parametrize("name", [*SDPA_PATHS, "naive", "tiled", "auto"])
def test_kept_calls_give_the_python_memos_results(compiled_memo, monkeypatch, name, problem):
    """The compiled memo's calls (its own SDPA call, or the run it keeps) return what the Python
    memo's calls return, bitwise (the same kernel on the same operands), and their gradients meet
    the tolerance rule against the oracle."""
    skip_if_unavailable(name)
    shapes, args = problem
    q, k, v = _operands(shapes, seed=5)
    attend = lambda a, b, c: attnkit.attention(a, b, c, backend=name, **args)
    try:
        attend(q, k, v)
    except attnkit.UnsupportedProblemError as err:
        pytest.skip(str(err))
    grad_out = _operands([(*shapes[0][:3], shapes[2][3])], seed=6)[0]
    assert compiled_memo.size() == 1
    ours = attend(q, k, v)
    checks = compare_to_reference(attend, q, k, v, causal=args.get("causal", False), scale=args.get("scale"),
                                  grad_out=grad_out, window=args.get("window"))  # fmt: skip
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)
    assert torch.equal(ours, attend(q, k, v)), (
        f"{name}: the compiled memo's output differs from the Python memo's"
    )
    assert_close_to_reference(f"{name} through the compiled memo", checks)


def _flags() -> tuple[bool, ...]:
    return tuple(
        getattr(torch._C, f"_get_{flag}_sdp_enabled")() for flag in torch.nn.attention._backend_names
    )


@pytest.mark.device_independent
@needs_memo
def test_a_plain_call_sdpa_declines_goes_to_the_run_with_the_flags_back_and_no_warnings(compiled_memo):
    """An entry whose SDPA call raises (here: only the efficient kernel allowed for CPU operands)
    hands the call to its run, which sees the caller's enable-flags and leaves them so; the
    declined call's warnings are not printed (the run gives the reasons)."""
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    spec = PlainSdpaCall(
        kernels=(False, True, False, False, False), is_causal=False, scale=None, enable_gqa=False, layout=None
    )
    seen = []

    def run(q, k, v, problem):
        seen.append((problem, _flags()))
        return q + 1

    prepared = PreparedRun(run, plain_sdpa_call=spec)
    before = _flags()
    assert compiled_memo.remember(q, k, v, False, None, None, "sdpa-x", "problem", prepared)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled_memo.call(q, k, v, False, None, None, "sdpa-x")
    assert torch.equal(out, q + 1)
    assert seen == [("problem", before)], f"the run saw {seen}, not the caller's flags {before}"
    assert _flags() == before
    assert not [str(w.message) for w in caught], "the declined call printed warnings"


@needs_memo
def test_a_kept_plain_call_is_made_without_the_run_unless_the_layout_test_fails(compiled_memo):
    """The entry's SDPA call is made by the compiled memo itself (the run is not called) and
    returns raw SDPA's result; operands the layout test does not pass go to the run."""
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    called = []

    def run(q, k, v, problem):
        called.append(problem)
        return q

    layout = (q.element_size(), 16, 16)  # the layout test applies to any device's operands
    plain = PlainSdpaCall(kernels=None, is_causal=True, scale=None, enable_gqa=False, layout=layout)
    compiled_memo.remember(
        q, k, v, True, None, None, "sdpa", "problem", PreparedRun(run, plain_sdpa_call=plain)
    )
    out = compiled_memo.call(q, k, v, True, None, None, "sdpa")
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert not called, "the run was called for operands the layout test passes"
    shifted = torch.randn(q.numel() + 1)[1:].view(q.shape)  # data pointer 4 bytes off 16
    assert compiled_memo.call(shifted, k, v, True, None, None, "sdpa") is shifted
    assert called == ["problem"]


@pytest.mark.device_independent
@needs_memo
def test_a_run_that_empties_the_memo_mid_call_returns(compiled_memo):
    """An entry's run may call attention() itself and fill the memo until it is cleared: the
    entry being called is held for the call."""
    q = torch.randn(1, 1, 2, 16)

    def run(q, k, v, problem):
        compiled_memo.forget()
        return q * 2

    compiled_memo.remember(q, q, q, False, None, None, "naive", object(), PreparedRun(run))
    del run
    assert torch.equal(compiled_memo.call(q, q, q, False, None, None, "naive"), q * 2)
    assert compiled_memo.size() == 0


@pytest.mark.device_independent
@needs_memo
def test_a_full_memo_is_emptied_before_the_next_entry(compiled_memo):
    """Bounded as the Python memo is: 4096 entries, emptied when full."""
    prepared = PreparedRun(len)
    for n in range(1, 4098):
        x = torch.empty(1, 1, n, 1)
        compiled_memo.remember(x, x, x, False, None, None, "naive", None, prepared)
    assert compiled_memo.size() == 1


@pytest.mark.device_independent
@needs_memo
def test_a_torch_function_mode_sees_every_call(compiled_memo):
    """Under a ``__torch_function__`` mode the compiled memo takes no call: the mode sees the
    Python memo's SDPA call, a repeated one too."""

    class Seen(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    q, k, v = _operands([(1, 2, 8, 16)] * 3)
    attnkit.attention(q, k, v, causal=True, backend="sdpa")
    assert compiled_memo.size() == 1
    for _ in range(2):
        seen = Seen()
        with seen:
            attnkit.attention(q, k, v, causal=True, backend="sdpa")
        assert "scaled_dot_product_attention" in seen.names


@pytest.mark.device_independent
def test_an_unknown_mode_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "always")
    with pytest.raises(
        ValueError, match=r"ATTNKIT_FAST_CALLS: expected one of auto, build, off, got 'always'"
    ):
        loader._load()


@pytest.mark.device_independent
def test_off_loads_nothing(monkeypatch):
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "off")
    assert loader._load() == (None, "off: ATTNKIT_FAST_CALLS=off")


@pytest.mark.device_independent
def test_auto_without_a_build_runs_the_python_memo_and_says_how_to_build(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "auto")
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(tmp_path))
    memo, status = loader._load()
    assert memo is None
    assert "python -m attnkit.fastpath build" in status


@pytest.mark.device_independent
def test_a_build_is_named_for_its_torch_and_its_source(monkeypatch, tmp_path):
    """A build made for another torch or another source is never found."""
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(tmp_path))
    name, directory = loader.build_location()
    assert directory.parent.parent == tmp_path
    assert torch.__version__.replace("+", "_") in directory.parent.name
    edited = tmp_path / "fast_calls.cpp"
    edited.write_text(loader.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(loader, "SOURCE", edited)
    assert loader.build_location()[0] != name


@pytest.mark.device_independent
def test_the_command_says_whether_the_memo_is_in_use(capsys):
    from attnkit.fastpath.__main__ import main

    assert main(["status"]) == 0
    assert capsys.readouterr().out == f"attnkit fast path: {fastpath.status}\n"
    assert main(["rebuild"]) == 2


@pytest.mark.device_independent
@needs_memo
def test_the_build_command_builds_through_the_package(tmp_path):
    """``python -m attnkit.fastpath build`` runs the package's command and builds (here: finds
    this source's build for this torch, which the build tool then has nothing to redo), even
    where loading is switched off."""
    env = {**os.environ, "ATTNKIT_FAST_CALLS": "off", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "attnkit.fastpath", "build"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    directory = loader.build_location()[1]
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert f"attnkit fast path: built in {directory}" in done.stdout, done.stdout[-2000:]


@pytest.mark.device_independent
@needs_memo
def test_a_finished_build_is_loaded_as_it_is(monkeypatch):
    """With a build of this source for this torch in the cache, ``build`` mode loads it without
    running the build tool (which would compile it again for the source at another path: the
    gate's copies of base and head)."""
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "build")
    monkeypatch.setattr(loader, "build", lambda verbose=False: pytest.fail("the build tool ran"))
    memo, status = loader._load()
    assert memo is not None
    assert status.startswith("on: ")


@pytest.mark.device_independent
def test_an_install_without_the_source_runs_the_python_memo(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "auto")
    monkeypatch.setattr(loader, "SOURCE", tmp_path / "fast_calls.cpp")
    assert loader._load() == (None, f"off: {tmp_path / 'fast_calls.cpp'} is not installed")


@pytest.mark.device_independent
def test_a_build_under_way_or_stopped_is_named_with_its_lock(monkeypatch, tmp_path):
    """torch's build tool holds a lock file in the build's directory; one left by a stopped
    build makes every later build wait: the status names it."""
    monkeypatch.setenv("ATTNKIT_FAST_CALLS", "auto")
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(tmp_path))
    name, directory = loader.build_location()
    directory.mkdir(parents=True)
    (directory / f"{name}.so").write_bytes(b"")
    (directory / "lock").write_bytes(b"")
    memo, status = loader._load()
    assert memo is None
    assert status == f"off: a build is under way, or was stopped (then remove {directory / 'lock'})"


@pytest.mark.device_independent
@pytest.mark.parametrize("prepared", ["PreparedRun", "plain function"])
def test_a_backends_prepare_may_return_a_prepared_run_or_a_plain_run(monkeypatch, prepared, memo_in_front):
    """The registry's protocol: ``prepare`` returns a PreparedRun, or a plain run function that
    describes nothing; either runs, first and repeated calls, through either memo."""
    from attnkit import registry

    def run(q, k, v, problem):
        return q * 3

    def prepare(problem):
        return PreparedRun(run) if prepared == "PreparedRun" else run

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_backend("triple", description="q times 3, for a test", run=run, prepare=prepare)
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    q = torch.randn(1, 1, 4, 8)
    for call in ("first", "repeated", "repeated again"):
        out = attnkit.attention(q, q, q, backend="triple")
        assert torch.equal(out, q * 3), f"{prepared}, {call} call: not the prepared run's output"
    if MEMO is not None:
        MEMO.forget()


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((None,), "run: expected a callable"),
        ((len,), "plain_sdpa_call: expected a PlainSdpaCall"),
        ((len,), "native_forward: expected a callable"),
    ],
    ids=["run", "plain_sdpa_call", "native_forward"],
)
def test_a_prepared_run_takes_only_its_typed_fields(args, message):
    field = message.split(":")[0]
    keywords = {} if field == "run" else {field: (None, True, None, False, None)}
    with pytest.raises(TypeError, match=message):
        PreparedRun(*args, **keywords)

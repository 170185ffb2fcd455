"""What an SDPA path adds to PyTorch's own call: for a plain problem, nothing that touches tensors
(the same aten ops, forward and backward); SDPA's global enable-flags left as the caller set
them, whether the forced kernel ran or declined; and the fused-kernel layout rule, which decides
per call on the host whether an operand is copied."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, SDPA_PATHS, RecordOps, skip_if_unavailable
from conftest import SDPA_DTYPE as DTYPE
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
import attnkit.api
from attnkit import UnsupportedProblemError
from attnkit.inputs import check_inputs
from attnkit.sdpa import (
    SDPA_BACKENDS,
    WINDOW_MASK_KERNELS,
    forcing,
    sdpa_device_support,
    sdpa_problem_support,
)
from attnkit.sdpa import calls as sdpa_calls
from attnkit.sdpa import layout as sdpa_layout
from attnkit.sdpa.layout import aligned_for_fused_kernels, layout_memo
from attnkit.sdpa.prepare import kernel_op
from attnkit.testing import assert_close_to_reference, compare_to_reference

FORCED_PATHS = [name for name in SDPA_PATHS if SDPA_BACKENDS[name] is not None]


@pytest.fixture(autouse=True)
def _python_memo_alone(monkeypatch):
    """These tests pin the Python memo's prepared runs, whose repeated calls the compiled memo
    (attnkit.fastpath, tested in test_fast_calls.py) would otherwise make itself; the tests of
    what a caller sees run through both (``memo_in_front``)."""
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)


def _operands(shape=(1, 2, 8, 16)):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen).to(DEVICE, DTYPE).requires_grad_() for _ in range(3)]


def _ops_forward_and_backward(run, q, k, v) -> list[str]:
    recorder = RecordOps()
    with recorder:
        out = run(q, k, v)
        # autograd.grad, not backward: no .grad accumulated, so every call's ops compare alike.
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return recorder.ops


@contextlib.contextmanager
def _enable_flags_restored():
    """Yields the current SDPA enable-flags as a reader; puts them back afterwards, so a test
    that changes them leaves the next test (same xdist worker) the defaults."""
    names = ("flash", "mem_efficient", "math", "cudnn")

    def read():
        return {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in names}

    saved = read()
    try:
        yield read
    finally:
        for name, enabled in saved.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(enabled)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", SDPA_PATHS)
def test_a_plain_call_runs_exactly_pytorchs_own_ops(name, causal):
    """N == M, default scale, contiguous operands: the first call (which records PyTorch's
    warnings) and a repeated one (memoised signature) run the ops of
    ``F.scaled_dot_product_attention`` with the same kernel forced, forward and backward: the
    path adds host work only, no copy, no extra op, no autograd node."""
    skip_if_unavailable(name)
    q, k, v = _operands()
    kernel = SDPA_BACKENDS[name]
    with sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext():
        raw = _ops_forward_and_backward(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v
        )
    for call in ("first", "repeated"):
        ours = _ops_forward_and_backward(
            lambda q, k, v: attnkit.attention(q, k, v, causal=causal, backend=name), q, k, v
        )
        assert ours == raw, f"{name} ({call} call): attnkit ran {ours}, raw SDPA ran {raw}"


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["mha", "gqa"])
@pytest.mark.parametrize("name", SDPA_PATHS)
def test_a_decode_step_runs_exactly_pytorchs_own_non_causal_ops(name, kv_heads):
    """One query against more keys under bottom-right causal sees every key: the first and a
    repeated call run the ops of SDPA's non-causal call (``enable_gqa`` where the heads differ)
    with the same kernel forced, forward and backward."""
    skip_if_unavailable(name)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(shape, generator=gen).to(DEVICE, DTYPE).requires_grad_()
        for shape in ((1, 2, 1, 16), (1, kv_heads, 9, 16), (1, kv_heads, 9, 16))
    )
    kernel = SDPA_BACKENDS[name]
    forced = sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext()
    # A kernel that declines says why only in warnings: kept for the skip, not printed.
    with forced, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            raw = _ops_forward_and_backward(
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != 2), q, k, v
            )
        except RuntimeError:
            reasons = "; ".join(str(w.message) for w in caught)
            pytest.skip(f"raw SDPA with {name}'s kernel declines: {reasons}")
    for call in ("first", "repeated"):
        ours = _ops_forward_and_backward(
            lambda q, k, v: attnkit.attention(q, k, v, causal=True, backend=name), q, k, v
        )
        assert ours == raw, f"{name} ({call} call): attnkit ran {ours}, raw SDPA ran {raw}"


class _RecordCalls(TorchDispatchMode):
    """Every aten op that runs with its arguments other than tensors (flags, scale, dropout)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        plain = [a for a in args if not isinstance(a, torch.Tensor)]
        named = sorted((key, a) for key, a in kwargs.items() if not isinstance(a, torch.Tensor))
        self.calls.append((str(func), plain, named))
        return func(*args, **kwargs)


@pytest.mark.parametrize("needs_grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", FORCED_PATHS)
def test_repeated_forced_calls_call_the_kernels_op_as_sdpa_does(name, causal, needs_grad, monkeypatch):
    """Once a signature's first call went through SDPA, a forced kernel is called as its ATen op
    (no kernel choice, no enable-flags): the repeated calls run the ops raw SDPA runs with the
    kernel forced, arguments other than tensors included (the log-sum-exp flag follows whether
    gradients are needed), forward and backward, with bitwise equal results."""
    skip_if_unavailable(name)
    q, k, v = _operands()
    if kernel_op(name, check_inputs(q, k, v, causal, None)) is None:
        pytest.skip(f"{name} goes through SDPA's choice on {DEVICE.type}")
    for x in (q, k, v):
        x.requires_grad_(needs_grad)
    grad_out = torch.randn_like(q)

    def run(attend):
        recorder = _RecordCalls()
        with recorder:
            out = attend(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v), grad_out) if needs_grad else ()
        return recorder.calls, (out, *grads)

    with sdpa_kernel([SDPA_BACKENDS[name]]):
        raw_calls, raw = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    run(lambda q, k, v: attnkit.attention(q, k, v, causal=causal, backend=name))  # the first call

    def no_sdpa_call(*args, **kwargs):
        raise AssertionError("a repeated call went through SDPA's checked call")

    monkeypatch.setattr(sdpa_calls, "call_sdpa", no_sdpa_call)
    monkeypatch.setattr(F, "scaled_dot_product_attention", no_sdpa_call)
    for call in ("second", "third"):
        calls, ours = run(lambda q, k, v: attnkit.attention(q, k, v, causal=causal, backend=name))
        assert calls == raw_calls, f"{name} ({call} call): attnkit ran {calls}, raw SDPA ran {raw_calls}"
        for what, a, b in zip(("out", "dq", "dk", "dv")[: len(raw)], ours, raw, strict=True):
            assert torch.equal(a, b), f"{name} ({call} call): {what} differs from raw SDPA's"


def _runs_a_checked_op(name: str, problem) -> bool:
    """Whether the prepared run of ``name`` calls a kernel op whose acceptance SDPA checks per
    state (the efficient and cuDNN ops; not math's, which takes every validated operand)."""
    return kernel_op(name, problem) is not None and SDPA_BACKENDS[name] is not SDPBackend.MATH


@pytest.mark.parametrize("name", FORCED_PATHS)
def test_a_new_grad_or_determinism_state_is_checked_by_sdpa_first(name, monkeypatch):
    """SDPA's kernel choice reads more than the operands: whether gradients are needed and
    whether deterministic algorithms are on. For a kernel op called without SDPA's checks, the
    first call of a known signature in a state not seen yet goes through SDPA's checked call
    again; the next in that state does not."""
    skip_if_unavailable(name)
    q, k, v = _operands(shape=(2, 3, 5, 16))  # a signature no other test calls: no state known
    if not _runs_a_checked_op(name, check_inputs(q, k, v, True, None)):
        pytest.skip(f"{name} on {DEVICE.type} calls no kernel op without SDPA's checks")
    attnkit.attention(q, k, v, causal=True, backend=name)  # grad needed, determinism off
    checked = []
    real = sdpa_calls.call_sdpa
    monkeypatch.setattr(sdpa_calls, "call_sdpa", lambda *a, **kw: checked.append(1) or real(*a, **kw))
    attnkit.attention(q, k, v, causal=True, backend=name)
    assert not checked, f"{name}: a call in a known state went through SDPA's checked call"
    with torch.no_grad():
        for _ in range(2):
            attnkit.attention(q, k, v, causal=True, backend=name)
    assert len(checked) == 1, f"{name}: no-grad calls went {len(checked)} times through the checked call"
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        for _ in range(2):
            attnkit.attention(q, k, v, causal=True, backend=name)
    except UnsupportedProblemError:  # a kernel PyTorch declines when determinism is asked for
        pass
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert len(checked) == 2, (
        f"{name}: deterministic calls went {len(checked) - 1} times through the checked call"
    )


@pytest.mark.parametrize("name", SDPA_PATHS)
def test_calls_that_need_no_state_check_never_take_the_checked_call(name, monkeypatch):
    """PyTorch's choice and flash go through SDPA, which checks each call itself, and math's op
    takes every operand attnkit validated: after a signature's first call none of their calls,
    with or without gradients or deterministic algorithms, goes through the checked call
    (warnings recorded), and each equals raw SDPA's with the same kernel, output and gradients."""
    skip_if_unavailable(name)
    q, k, v = _operands(shape=(2, 3, 7, 16))  # a signature no other test calls
    if _runs_a_checked_op(name, check_inputs(q, k, v, True, None)):
        pytest.skip(f"{name} on {DEVICE.type} calls a kernel op SDPA checks per state")

    def checked_call(*args, **kwargs):
        raise AssertionError(f"{name}: a call went through SDPA's checked call")

    with torch.no_grad():
        attnkit.attention(q, k, v, causal=True, backend=name)  # the first call
    forced = SDPA_BACKENDS[name]
    kernels = contextlib.nullcontext if forced is None else lambda: sdpa_kernel([forced])
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        for state in ("grad", "no grad", "deterministic"):
            torch.use_deterministic_algorithms(state == "deterministic", warn_only=True)
            with torch.set_grad_enabled(state != "no grad"):
                with kernels():
                    raw = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                monkeypatch.setattr(sdpa_calls, "call_sdpa", checked_call)
                ours = attnkit.attention(q, k, v, causal=True, backend=name)
                monkeypatch.undo()
            assert torch.equal(ours, raw), f"{name} ({state}): output differs from raw SDPA's"
            if state != "no grad":
                grads = torch.autograd.grad(ours, (q, k, v), torch.ones_like(ours))
                raw_grads = torch.autograd.grad(raw, (q, k, v), torch.ones_like(raw))
                for what, a, b in zip(("dq", "dk", "dv"), grads, raw_grads, strict=True):
                    assert torch.equal(a, b), f"{name} ({state}): {what} differs from raw SDPA's"
    finally:
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.parametrize("name", FORCED_PATHS)
def test_forcing_a_kernel_leaves_the_callers_enable_flags(name, memo_in_front):
    """The caller turned PyTorch's choice down to one kernel (not the forced one); a forced call
    runs its own kernel anyway and leaves the caller's flags as they were."""
    skip_if_unavailable(name)
    q, k, v = _operands()
    forced = SDPA_BACKENDS[name]
    others = [kernel for kernel in SDPA_BACKENDS.values() if kernel not in (None, forced)]
    with _enable_flags_restored() as flags, sdpa_kernel(others[:1]):
        before = flags()
        attnkit.attention(q, k, v, causal=True, backend=name).sum().backward()
        assert flags() == before, f"{name}: enable-flags {before} became {flags()}"


@pytest.mark.parametrize("name", FORCED_PATHS)
def test_a_forcer_enables_exactly_its_kernel_and_puts_every_flag_back(name):
    """During the call a forcer makes, only the forced kernel's enable-flag is on; afterwards every
    flag is as the caller left it, after a call that returned and after one that raised."""
    if forcing.FORCERS is None:
        pytest.skip("this torch's enable-flags are not the five the forcers are written for")
    forced = forcing.FORCERS[name]
    names = torch.nn.attention._backend_names

    def flags():
        return {flag: getattr(torch._C, f"_get_{flag}_sdp_enabled")() for flag in names}

    wanted = {flag: getattr(SDPBackend, member) is SDPA_BACKENDS[name] for flag, member in names.items()}
    with _enable_flags_restored(), sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
        before = flags()
        assert forced(flags) == wanted, f"{name}: the flags during the call are not its kernel's alone"
        assert flags() == before, f"{name}: enable-flags {before} became {flags()}"

        def fails():
            raise RuntimeError("declined")

        with pytest.raises(RuntimeError, match="declined"):
            forced(fails)
        assert flags() == before, f"{name}: enable-flags {before} became {flags()} after a failed call"


@pytest.mark.device_independent
def test_forcers_are_not_made_for_enable_flags_they_were_not_written_for(monkeypatch):
    """The forcers are written out over torch's five enable-flags; with any other set, none is
    made, and forced calls go through ``sdpa_kernel`` instead."""
    four = dict(list(torch.nn.attention._backend_names.items())[:4])
    monkeypatch.setattr(torch.nn.attention, "_backend_names", four)
    assert forcing.kernel_forcers() is None


@pytest.mark.parametrize("name", FORCED_PATHS)
def test_operands_in_a_layout_the_kernel_declines_run_on_a_copy(name, memo_in_front, recwarn):
    """Any strides work on every path: an operand whose last dimension is strided, which the
    fused kernels decline as it is (CPU flash: "last dimension ... stride 1"), is copied to the
    layout they take, on a signature's first call and on repeated ones after a contiguous call;
    the result is the reference's, the enable-flags are the caller's, nothing is printed."""
    skip_if_unavailable(name)
    q, k, v = _operands()
    strided = torch.randn(1, 2, 8, 32, generator=torch.Generator().manual_seed(3)).to(DEVICE, DTYPE)[..., ::2]
    with _enable_flags_restored() as flags:
        before = flags()
        for call in ("first", "after a contiguous call", "repeated"):
            if call == "after a contiguous call":
                attnkit.attention(q, k, v, causal=True, backend=name)
            checks = compare_to_reference(
                lambda a, b, c: attnkit.attention(a, b, c, causal=True, backend=name),
                strided.detach().requires_grad_(), k, v, causal=True, scale=None,
            )  # fmt: skip
            assert_close_to_reference(f"{name}, strided q, {call} call", checks)
            assert flags() == before, f"{call} call: enable-flags {before} became {flags()}"
    printed = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert not printed, f"{name}: a strided call printed {printed}"


@pytest.mark.parametrize("name", FORCED_PATHS)
def test_a_declined_call_prints_no_warnings(name, recwarn, memo_in_front):
    """A kernel that declines a problem (flash: Dv != D) explains why in attnkit's error only:
    PyTorch's reasons, which it gives as warnings, are not printed as well, however often the
    call is repeated."""
    skip_if_unavailable(name)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, d, generator=gen).to(DEVICE, DTYPE) for d in (16, 16, 32))
    declined = 0
    for _ in range(3):
        try:
            attnkit.attention(q, k, v, causal=True, backend=name)
        except UnsupportedProblemError as err:
            assert "Dv=32" in str(err), f"{name}: the error does not name the problem: {err}"
            declined += 1
    if not declined:
        pytest.skip(f"{name} takes Dv != D on {DEVICE.type}: nothing declined")
    assert declined == 3, f"{name}: {declined} of 3 identical calls declined"
    printed = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert not printed, f"{name}: a declined call printed {printed}"


@pytest.mark.device_independent
def test_a_declined_first_call_is_explained_again_when_repeated(memo_in_front):
    """A signature whose first call the kernel declined (CPU flash: Dv != D) is not taken for
    accepted: the same call again gets PyTorch's reasons again, without PyTorch's build paths
    ("Triggered internally at ..."), and the flags are restored both times."""
    if attnkit.unavailable_reason("sdpa-flash", DEVICE) is not None or DEVICE.type != "cpu":
        pytest.skip("CPU flash declines Dv != D; CUDA flash's limits differ by GPU")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 8, d, generator=gen, dtype=DTYPE) for d in (16, 16, 32))
    with _enable_flags_restored() as flags:
        before = flags()
        for call in ("first", "repeated"):
            with pytest.raises(UnsupportedProblemError, match=r"'sdpa-flash' cannot run .*Dv=32") as err:
                attnkit.attention(q, k, v, causal=True, backend="sdpa-flash")
            message = str(err.value)
            assert "Triggered internally" not in message, f"{call} call: PyTorch's build path in {message!r}"
            assert "flash" in message.lower(), f"{call} call: no reason given: {message!r}"
            assert flags() == before, f"{call} call: enable-flags {before} became {flags()}"


def _row_major(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _view(buffer_shape, index=(Ellipsis,), dtype=torch.bfloat16):
    return torch.arange(torch.Size(buffer_shape).numel(), dtype=dtype).view(buffer_shape)[index]


#: (operand, passes untouched). bf16: a 16-byte step is 8 elements. The rule is host arithmetic
#: on pointers and strides, so CPU tensors pin it; only CUDA calls apply it.
_LAYOUTS = {
    "contiguous": (_view((1, 2, 8, 64)), True),
    "head-dim slice of wider rows": (_view((1, 2, 8, 128), (Ellipsis, slice(0, 64))), True),
    "row stride not a 16-byte multiple": (_view((1, 2, 8, 68), (Ellipsis, slice(0, 64))), False),
    # is_contiguous() ignores size-1 dimensions; the efficient backward does not.
    "odd stride in a size-1 dimension": (_view((64,)).as_strided((1, 1, 1, 16), (38, 38, 38, 1)), False),
    "expanded batch (zero stride)": (_view((1, 2, 8, 64)).expand(3, 2, 8, 64), False),
    "data pointer off a 16-byte boundary": (
        _view((1 * 2 * 8 * 64 + 1,), (slice(1, None),)).view(1, 2, 8, 64),
        False,
    ),
    "transposed last dimension": (_view((1, 2, 64, 8)).transpose(-1, -2), False),
    "rows shorter than 16 bytes": (_view((1, 2, 8, 6), (Ellipsis, slice(0, 3))), False),
}


@pytest.mark.device_independent
@pytest.mark.parametrize(("x", "passes"), list(_LAYOUTS.values()), ids=list(_LAYOUTS))
def test_fused_kernel_layout_rule(x, passes):
    """An operand goes to CUDA's fused kernels as it is only when its data pointer, every
    non-last stride (size-1 dimensions' included, none zero) and its rows are whole 16-byte
    steps and its last stride is 1; otherwise it is copied to row-major strides, same values."""
    out = aligned_for_fused_kernels(x, x.element_size(), x.shape[-1])
    if passes:
        assert out is x, f"{tuple(x.shape)} with strides {x.stride()} was copied"
        return
    assert out is not x, f"{tuple(x.shape)} with strides {x.stride()} went to the kernels as it is"
    assert out.stride() == _row_major(x.shape), f"copy has strides {out.stride()}, not row-major"
    assert torch.equal(out, x), "the copy's values differ from the operand's"


@pytest.mark.device_independent
def test_layout_memo_skips_the_rule_only_for_strides_it_passed():
    """The per-problem memo of the layout rule: operands in the layout the rule last passed
    untouched go as they are; the same strides at a pointer off a 16-byte boundary, and strides
    the rule rejects, are still copied; a rejected layout is not remembered."""
    q = _LAYOUTS["contiguous"][0]
    problem = check_inputs(q, q, q, False, None)
    memo = layout_memo()
    for call in ("first", "repeated"):
        out = memo(q, q, q, problem)
        assert all(o is q for o in out), f"{call} call: an aligned operand was copied"
    offset = _LAYOUTS["data pointer off a 16-byte boundary"][0]
    out = memo(offset, offset, offset, problem)
    assert all(o is not offset and torch.equal(o, offset) for o in out), "a misaligned pointer went as it is"
    odd = _LAYOUTS["row stride not a 16-byte multiple"][0]
    for call in ("first", "repeated"):
        out = memo(odd, odd, odd, problem)
        assert all(o is not odd for o in out), f"{call} call: odd row strides went as they are"
    out = memo(q, q, q, problem)
    assert all(o is q for o in out), "the aligned layout is copied after a rejected one"


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the layout rule applies to CUDA operands only")
@pytest.mark.parametrize("layout", [name for name, (_, passes) in _LAYOUTS.items() if not passes])
def test_sdpa_math_takes_every_layout_as_it_is(monkeypatch, layout):
    """Math is composite ATen ops, which take any layout: its calls, first and repeated, hand
    the operands over without the fused-kernel layout rule (no copy, no check), and stay
    within the tolerance rule of the oracle, outputs and gradients."""
    skip_if_unavailable("sdpa-math")
    x = _LAYOUTS[layout][0]
    gen = torch.Generator().manual_seed(1)

    def operand():  # random values in the layout of x: its shape, strides and storage offset
        elements = x.untyped_storage().nbytes() // x.element_size()
        buffer = torch.randn(elements, generator=gen).to(DEVICE, x.dtype)
        return buffer.as_strided(x.shape, x.stride(), x.storage_offset())

    q, k, v = operand(), operand(), operand()
    grad_out = torch.randn(x.shape, generator=gen).to(DEVICE, x.dtype)

    def no_rule(*args):
        raise AssertionError("the fused-kernel layout rule ran for sdpa-math")

    monkeypatch.setattr(sdpa_layout, "fused_layout", no_rule)
    for call in ("first", "repeated"):
        checks = compare_to_reference(
            lambda a, b, c: attnkit.attention(a, b, c, causal=True, backend="sdpa-math"),
            q, k, v, causal=True, scale=None, grad_out=grad_out,
        )  # fmt: skip
        assert_close_to_reference(f"sdpa-math, {layout}, {call} call", checks)


@pytest.mark.device_independent
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_window_on_flash_suggests_only_paths_that_run_on_the_problems_device(device):
    """Flash takes no mask, so no window: the paths its error suggests instead are exactly the
    SDPA paths that take a window and can run on the problem's device (no CUDA kernel for a CPU
    problem)."""
    q = torch.empty(1, 2, 8, 16)
    problem = dataclasses.replace(check_inputs(q, q, q, False, None, (2, 0)), device=torch.device(device))
    reason = sdpa_problem_support("sdpa-flash", problem)
    suggested = set(re.search(r"use ([\w\-, ]+)\)", reason).group(1).split(", "))
    runnable = {
        name
        for name, kernel in SDPA_BACKENDS.items()
        if kernel in WINDOW_MASK_KERNELS and sdpa_device_support(name, problem.device) is None
    }
    assert suggested == runnable, f"on {device} suggested {sorted(suggested)}, expected {sorted(runnable)}"
    assert "sdpa-math" in suggested, reason
    if device == "cpu":
        assert not suggested & {"sdpa-efficient", "sdpa-cudnn"}, (
            f"CUDA kernels suggested on the CPU: {reason}"
        )

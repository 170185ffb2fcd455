"""The direct launch path of the Triton kernels (attnkit.triton.fast_launch).

On the CPU the path is inactive (the kernels run in Triton's interpreter, or not at all), so
these tests check its logic: that its key never merges two calls Triton specialises apart
(against Triton's own specialisation code, run on CPU tensors), and that every fallback takes
Triton's normal path (with a fake compiled kernel). The GPU tests compare the direct path's
outputs bitwise with the normal path's over layouts that change the specialisation.
"""

from __future__ import annotations

import dataclasses
import itertools
import types

import pytest
import torch
from conftest import DEVICE, python_functions_run

import attnkit
import attnkit.api
from attnkit import fastpath
from attnkit.prepared import NativeLaunch, NativeProgram, PreparedRun
from attnkit.triton.native_launch import native_launch, native_layout

triton = pytest.importorskip("triton")

from attnkit.triton import fast_launch  # noqa: E402
from attnkit.triton import runtime as triton_runtime  # noqa: E402
from attnkit.triton.backward_kernels import (  # noqa: E402
    _attn_bwd_dkdv_kernel,
    _attn_bwd_dq_kernel,
    _attn_bwd_preprocess,
)
from attnkit.triton.decode_kernels import _decode_combine_kernel, _decode_split_kernel  # noqa: E402
from attnkit.triton.fast_launch import KernelLaunch, launch_key  # noqa: E402
from attnkit.triton.forward_kernels import _plain_fwd_kernel  # noqa: E402

ON_GPU = DEVICE.type == "cuda"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="the direct launch path runs on CUDA only")


# ---------------------------------------------------------------------------------------------
# Layouts that change what Triton specialises on: base alignment, stride divisibility by 16,
# strides equal to 1 outside the last dim, zero strides.


def _layout(name: str, shape, dtype, device, gen) -> torch.Tensor:
    b, h, s, x = shape

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    if name == "contiguous":
        return randn(b, h, s, x)
    if name == "bnhd":  # (B, N, H, D) storage, transposed
        return randn(b, s, h, x).transpose(1, 2)
    if name == "offset":  # base one element past a 16-byte boundary (2 bytes for 16-bit)
        return randn(b * h * s * x + 1)[1:].view(b, h, s, x)
    if name == "rows_not_16":  # row stride x + 8: 16-byte multiple in 16-bit, not divisible by 16
        return randn(b, h, s, x + 8)[..., :x]
    if name == "unit_strides":  # size-1 dims whose strides are 1 (a value Triton makes constant)
        return randn(b, s, x, h).permute(0, 3, 1, 2) if h == 1 else randn(b, h, s, x)
    if name == "expanded":  # stride 0 over the batch
        return randn(1, h, s, x).expand(b, h, s, x)
    raise ValueError(name)


LAYOUTS = ("contiguous", "bnhd", "offset", "rows_not_16", "unit_strides", "expanded")


def _jit_function(kernel):
    """A compiled-mode JITFunction of ``kernel`` (the interpreter's kernels keep their options)."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    options = kernel.kwargs
    return JITFunction(
        kernel.fn,
        do_not_specialize=options.get("do_not_specialize"),
        do_not_specialize_on_alignment=options.get("do_not_specialize_on_alignment"),
    )


def _triton_specialisation(kernel, backend=None):
    """Triton's own argument binder and specialisation for ``kernel``: a function of the
    call's arguments returning what Triton keys its compiled kernels on."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    jit = _jit_function(kernel)
    binder = create_function_from_signature(jit.signature, jit.params, backend or BaseBackend)
    return lambda *args, **kwargs: str(binder(*args, **kwargs)[1])


#: Runtime ints after the 16 strides (sizes, offsets), read from the kernel's signature so
#: that arguments added to the kernel need no change here.
_FORWARD_INTS = sum(not p.is_constexpr for p in _jit_function(_plain_fwd_kernel).params) - 5 - 16 - 1


def _forward_args(q, k, v, out, lse, sizes=(33, 40, 2, 1, 2, 7), scale=0.125):
    sizes = (*sizes, *(3,) * _FORWARD_INTS)[:_FORWARD_INTS]
    return (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *sizes, scale)


def _forward_arg_sets(device):
    """Forward-kernel argument tuples over layouts, sizes of 1 and past int32."""
    gen = torch.Generator().manual_seed(0)
    sets = []
    for layout_q, layout_kv in itertools.product(
        LAYOUTS, ("contiguous", "offset", "rows_not_16", "expanded")
    ):
        for dtype in (torch.bfloat16, torch.float32):
            q = _layout(layout_q, (2, 1, 5, 16), dtype, device, gen)
            k = _layout(layout_kv, (2, 1, 7, 16), dtype, device, gen)
            v = _layout(layout_kv, (2, 1, 7, 16), dtype, device, gen)
            out = torch.empty(2, 1, 5, 16, dtype=dtype, device=device)
            lse = torch.empty(2, 1, 5, device=device)
            sets.append(_forward_args(q, k, v, out, lse))
    q, k, v, out, lse = sets[0][:5]
    sets += [
        _forward_args(q, k, v, out, lse, sizes=(1,) * _FORWARD_INTS),  # do_not_specialize ints of 1
        _forward_args(q, k, v, out, lse, sizes=(2**31 + 5, 40, 2, 1, 2, 7)),  # int64 q_len
        _forward_args(q, k, v, out, lse, scale=1.0),
        _forward_args(q, k, v, out, lse, sizes=(33, 40, 2, 1, 2, 16)),
    ]
    return sets


_FORWARD_CONSTANTS = dict(
    HEAD_DIM=16, HEAD_PAD=16, VALUE_DIM=16, VALUE_PAD=16, BLOCK_M=16, BLOCK_N=16, CAUSAL=True,
    WINDOW=False, DOT_PRECISION="ieee", TMA=False, NEGATE_Q=False, STORE_LSE=True,
)  # fmt: skip
_FORWARD_PARAMS = _jit_function(_plain_fwd_kernel).params
FORWARD_CONSTEXPRS = {p.name: _FORWARD_CONSTANTS.get(p.name, 16) for p in _FORWARD_PARAMS if p.is_constexpr}


def _assert_key_refines_triton(kernel, arg_sets, kwargs, backend=None):
    """Equal :func:`launch_key` implies equal Triton specialisation, over every pair."""
    triton_key = _triton_specialisation(kernel, backend)
    groups: dict[tuple, set[str]] = {}
    for args in arg_sets:
        groups.setdefault(launch_key(args), set()).add(triton_key(*args, **kwargs))
    merged = {key: specs for key, specs in groups.items() if len(specs) > 1}
    assert not merged, f"one launch key covers {len(next(iter(merged.values())))} Triton specialisations"
    distinct = {next(iter(specs)) for specs in groups.values()}
    assert len(distinct) > 4, "the argument sets should exercise several Triton specialisations"


@pytest.mark.device_independent
def test_launch_key_never_merges_what_triton_specialises_apart():
    """The forward kernel over layouts (misaligned bases, strides not divisible by 16, strides
    of 1 in size-1 dims, zero strides), dtypes, do_not_specialize ints of 1 and past int32."""
    _assert_key_refines_triton(_plain_fwd_kernel, _forward_arg_sets("cpu"), FORWARD_CONSTEXPRS)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "kernel", [_attn_bwd_preprocess, _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _decode_split_kernel,
               _decode_combine_kernel],
    ids=lambda k: k.fn.__name__,
)  # fmt: skip
def test_launch_key_refines_triton_for_every_kernel(kernel):
    """Generic over the signature: each kernel's parameters, filled with tensors of several
    alignments and ints around 1 and 16, keyed against Triton's specialisation."""
    jit = _jit_function(kernel)
    constexprs = {p.name: 16 for p in jit.params if p.is_constexpr}
    gen = torch.Generator().manual_seed(1)
    aligned = torch.randn(64, generator=gen)
    candidates = {
        "tensor": [aligned, aligned[1:], aligned.to(torch.bfloat16)[1:], aligned.to(torch.int32)],
        "int": [1, 16, 17, 0, 2**33],
        "float": [0.5, 1.0],
    }
    runtime_params = [p for p in jit.params if not p.is_constexpr]
    kinds = [
        "tensor" if p.name[0].isupper() else "float" if "scale" in p.name else "int" for p in runtime_params
    ]
    arg_sets = []
    for position, kind in enumerate(kinds):
        for value in candidates[kind]:
            args = [candidates[k][0] for k in kinds]
            args[position] = value
            arg_sets.append(tuple(args))
    _assert_key_refines_triton(kernel, arg_sets, constexprs)


@pytest.mark.device_independent
def test_launch_key_is_equal_for_equal_layouts_and_differs_otherwise():
    gen = torch.Generator().manual_seed(2)
    args = _forward_arg_sets("cpu")[0]
    same_layout = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args)
    assert launch_key(args) == launch_key(same_layout), "new data in the same layout must hit"
    q = args[0]
    misaligned = _layout("offset", tuple(q.shape), q.dtype, "cpu", gen)
    assert launch_key((misaligned, *args[1:])) != launch_key(args), "base alignment not keyed"
    assert launch_key((*args[:-2], 1, args[-1])) != launch_key((*args[:-2], 2, args[-1])), "value 1 not keyed"
    assert launch_key((16,)) != launch_key((17,)), "divisibility by 16 not keyed"
    assert len({launch_key((1,)), launch_key((1.0,)), launch_key((True,))}) == 3, "i32, fp32 and u1 merged"
    assert launch_key((q,)) != launch_key((q.to(torch.float16),)), "dtype not keyed"


# ---------------------------------------------------------------------------------------------
# Fallbacks, with a fake Triton: a kernel whose normal launch and direct launch are recorded.


class _HookChain:
    def __init__(self, calls=()):
        self.calls = list(calls)


class _FakeCompiled:
    def __init__(self, log):
        self.function = "function-handle"
        self.packed_metadata = (4, 1, 0)
        self.run = lambda *args: log.append(("direct", args))


class _FakeKernel:
    """Parameters X (pointer), n (int), BLOCK (constexpr); records each normal launch."""

    def __init__(self, log, compiled=None):
        self.log = log
        self.params = [
            types.SimpleNamespace(name="X", is_constexpr=False),
            types.SimpleNamespace(name="n", is_constexpr=False),
            types.SimpleNamespace(name="BLOCK", is_constexpr=True),
        ]
        self.pre_run_hooks = []
        self.used_global_vals = {}
        self.debug = None
        self.compiled = compiled or _FakeCompiled(log)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("normal", args, kwargs))
            return self.compiled

        return launch


class _OtherKernel(_FakeKernel):
    pass


def _fake_runtime(**runtime_knobs):
    knobs = types.SimpleNamespace(
        runtime=types.SimpleNamespace(
            **{
                "launch_enter_hook": _HookChain(),
                "launch_exit_hook": _HookChain(),
                "debug": False,
                **runtime_knobs,
            }
        ),
        compilation=types.SimpleNamespace(instrumentation_mode=""),
    )
    return triton_runtime.TritonRuntime(knobs, lambda: 0, lambda device: 1234, _FakeKernel, None)


@pytest.fixture
def fake(monkeypatch):
    """(log, kernel, launch): a fake kernel behind a KernelLaunch, the fake runtime active."""
    monkeypatch.setattr(fast_launch, "_runtime", _fake_runtime())
    log = []
    kernel = _FakeKernel(log)
    return log, kernel, KernelLaunch(kernel, BLOCK=32, num_warps=4)


def _kinds(log):
    return [entry[0] for entry in log]


@pytest.mark.device_independent
def test_second_launch_with_the_same_key_is_direct_with_triton_arguments(fake):
    log, _, launch = fake
    x = torch.zeros(8)
    launch((3,), x, 5)
    launch((3, 2), x.clone(), 5)
    assert _kinds(log) == ["normal", "direct"]
    assert log[0][2] == {"BLOCK": 32, "num_warps": 4}
    # grid (3, 2, 1), stream, function, packed metadata, no launch metadata or hooks, then
    # every parameter in signature order (the constexpr after the call's arguments).
    assert log[1][1][:9] == (3, 2, 1, 1234, "function-handle", (4, 1, 0), None, None, None)
    assert log[1][1][10:] == (5, 32)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "change",
    ["misaligned pointer", "value 1", "divisible by 16", "dtype", "device", "debug knob"],
)
def test_a_new_specialisation_takes_the_normal_path(fake, monkeypatch, change):
    log, _, launch = fake
    x = torch.zeros(16)
    launch((1,), x, 5)
    args = {
        "misaligned pointer": (x[1:], 5),
        "value 1": (x, 1),
        "divisible by 16": (x, 32),
        "dtype": (x.half(), 5),
        "device": (x, 5),
        "debug knob": (x, 5),
    }[change]
    if change == "device":
        monkeypatch.setattr(
            fast_launch, "_runtime", dataclasses.replace(fast_launch._runtime, current_device=lambda: 1)
        )
    if change == "debug knob":
        fast_launch._runtime.knobs.runtime.debug = True
    launch((1,), *args)
    launch((1,), *args)
    assert _kinds(log) == ["normal", "normal", "direct"], f"{change}: not keyed"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "hook", [lambda metadata: None, _HookChain([lambda metadata: None])], ids=["callable", "hook-chain"]
)
@pytest.mark.parametrize("which", ["launch_enter_hook", "launch_exit_hook"])
def test_launch_hooks_keep_every_launch_on_the_normal_path(fake, hook, which):
    log, _, launch = fake
    x = torch.zeros(8)
    launch((1,), x, 5)
    setattr(fast_launch._runtime.knobs.runtime, which, hook)
    launch((1,), x, 5)
    assert _kinds(log) == ["normal", "normal"]


@pytest.mark.device_independent
def test_pre_run_hooks_and_rebound_globals_take_the_normal_path(fake):
    log, kernel, launch = fake
    x = torch.zeros(8)
    scope = {"LOG2E": 1.4}
    kernel.used_global_vals = {("LOG2E", id(scope)): (1.4, scope)}
    launch((1,), x, 5)
    launch((1,), x, 5)
    scope["LOG2E"] = 2.0  # Triton's normal path raises on this; it must get the chance
    launch((1,), x, 5)
    kernel.pre_run_hooks.append(lambda *args, **kwargs: None)
    launch((1,), x, 5)
    assert _kinds(log) == ["normal", "direct", "normal", "normal"]


@pytest.mark.device_independent
def test_missing_internals_take_the_normal_path(monkeypatch):
    x = torch.zeros(8)
    log = []
    # no runtime (API missing, unverified triton, no CUDA, the interpreter)
    monkeypatch.setattr(fast_launch, "_runtime", None)
    launch = KernelLaunch(_FakeKernel(log), BLOCK=32)
    launch((1,), x, 5)
    launch((1,), x, 5)
    # a compiled object without a function handle (an async-compile future, another version)
    monkeypatch.setattr(fast_launch, "_runtime", _fake_runtime())
    compiled = types.SimpleNamespace(run=lambda *a: log.append(("direct", a)), packed_metadata=None)
    launch = KernelLaunch(_FakeKernel(log, compiled), BLOCK=32)
    launch((1,), x, 5)
    launch((1,), x, 5)
    # an argument it does not key (a tuple), a constexpr passed positionally, a callable grid
    launch = KernelLaunch(_FakeKernel(log), BLOCK=32)
    launch((1,), x, (5,))
    launch((1,), x, (5,))
    launch = KernelLaunch(_FakeKernel(log))
    launch((1,), x, 5, 32)
    launch((1,), x, 5, 32)
    launch = KernelLaunch(_FakeKernel(log), BLOCK=32)
    launch(lambda meta: (1,), x, 5)
    launch(lambda meta: (1,), x, 5)
    # a kernel that is not the runtime's JITFunction type (an interpreted kernel, an autotuner)
    launch = KernelLaunch(_OtherKernel(log), BLOCK=32)
    launch((1,), x, 5)
    launch((1,), x, 5)
    assert _kinds(log) == ["normal"] * 12


@pytest.mark.device_independent
def test_a_bound_launch_passes_its_tensors_then_the_bound_arguments(fake):
    log, _, launch = fake
    x = torch.zeros(8)
    launch((3, 2), x, 5)
    bound = launch.bind((3, 2), (x, 5), 1)
    assert bound is not None, "a launch with an entry could not be bound"
    launch((3, 2), x, 5)  # the direct launch, to compare with
    y = torch.zeros(8)
    assert bound(y) is True
    assert _kinds(log) == ["normal", "direct", "direct"]
    direct, bound_args = log[1][1], log[2][1]
    assert bound_args[:9] == direct[:9], "grid, stream, function, metadata or hooks differ"
    assert bound_args[9] is y and bound_args[10:] == direct[10:] == (5, 32)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    "change",
    ["misaligned pointer", "dtype", "device", "debug knob", "launch hook", "kernel debug", "pre-run hook",
     "rebound global", "runtime replaced"],
)  # fmt: skip
def test_a_bound_launch_declines_a_call_its_key_would_not_match(fake, monkeypatch, change):
    """Whatever a direct launch keys on besides the bound arguments: the call launches nothing
    and says so (the caller then takes its normal path)."""
    log, kernel, launch = fake
    x = torch.zeros(16)
    scope = {"LOG2E": 1.4}
    kernel.used_global_vals = {("LOG2E", id(scope)): (1.4, scope)}
    launch((1,), x, 5)
    bound = launch.bind((1,), (x, 5), 1)
    assert bound(x) is True
    tensor = {"misaligned pointer": x[1:], "dtype": x.half()}.get(change, x)
    runtime = fast_launch._runtime
    if change == "device":
        object.__setattr__(runtime, "current_device", lambda: 1)
    elif change == "debug knob":
        runtime.knobs.runtime.debug = True
    elif change == "launch hook":
        runtime.knobs.runtime.launch_enter_hook = lambda metadata: None
    elif change == "kernel debug":
        kernel.debug = True
    elif change == "pre-run hook":
        kernel.pre_run_hooks.append(lambda *args, **kwargs: None)
    elif change == "rebound global":
        scope["LOG2E"] = 2.0
    elif change == "runtime replaced":
        monkeypatch.setattr(fast_launch, "_runtime", None)
    assert bound(tensor) is False, f"{change}: the bound launch ran"
    assert _kinds(log) == ["normal", "direct"]


@pytest.mark.device_independent
def test_bind_declines_what_is_not_launched_directly(fake, monkeypatch):
    _, kernel, launch = fake
    x = torch.zeros(8)
    assert launch.bind((1,), (x, 5), 1) is None, "bound before any launch made an entry"
    launch((1,), x, 5)
    assert launch.bind((1,), (x, 6), 1) is None, "bound to arguments no launch was made with"
    assert launch.bind((1,), (x, 5), 2) is None, "bound an int as a leading tensor"
    assert launch.bind(lambda meta: (1,), (x, 5), 1) is None, "bound a callable grid"
    with_descriptors = KernelLaunch(kernel, tensor_descriptors={0: (8,)}, BLOCK=32)
    assert with_descriptors.bind((1,), (x, 5), 1) is None, "bound a launch with tensor descriptors"
    monkeypatch.setattr(fast_launch, "_runtime", None)
    assert launch.bind((1,), (x, 5), 1) is None, "bound without a runtime"


@pytest.mark.device_independent
def test_forward_only_launches_a_layout_bound_after_its_first_call(fake):
    """LaunchSetup.forward_only with its forward launch on the fake runtime (a fake kernel with
    the forward's parameters): a layout's first call launches through KernelLaunch, the next
    through the bound launch with the same fixed arguments and a fresh output; a misaligned
    operand of that layout, and another layout, go back to KernelLaunch."""
    from attnkit.inputs import check_inputs
    from attnkit.triton.launch import LaunchSetup

    log, kernel, _ = fake
    kernel.params = _FORWARD_PARAMS
    q, k, v = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    setup = LaunchSetup.build(check_inputs(q, k, v, True, None))
    setup.launches["fwd_out"] = KernelLaunch(kernel, **setup.kernel_kwargs["fwd"], TMA=False, STORE_LSE=False)
    first, second = setup.forward_only(q, k, v), setup.forward_only(q, k, v)
    assert _kinds(log) == ["normal", "direct"]
    normal_args, bound_args = log[0][1], log[1][1][9:]
    assert normal_args[3] is first and normal_args[4] is first, "out (and the unused lse pointer)"
    assert bound_args[:3] == (q, k, v) and bound_args[3] is second and bound_args[4] is second
    assert second is not first
    assert bound_args[5 : len(normal_args)] == normal_args[5:], "the bound arguments differ"
    keywords = setup.launches["fwd_out"].kwargs
    constexprs = tuple(keywords[p.name] for p in _FORWARD_PARAMS[len(normal_args) :])
    assert bound_args[len(normal_args) :] == constexprs
    misaligned = torch.randn(q.numel() + 1)[1:].view(q.shape)
    setup.forward_only(misaligned, k, v)
    setup.forward_only(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)
    assert _kinds(log) == ["normal", "direct", "normal", "normal"]


@pytest.mark.device_independent
def test_find_runtime_declines_without_cuda_or_when_disabled(monkeypatch):
    if not torch.cuda.is_available():
        assert triton_runtime.find_runtime() is None, "a CPU-only machine has no direct launch path"
    monkeypatch.setenv(triton_runtime.DISABLE_ENV, "0")
    assert triton_runtime.find_runtime() is None, f"{triton_runtime.DISABLE_ENV}=0 must disable the path"


def _closure_like_triton36(launcher, tensordesc_indices, tensordesc_meta):
    """A launcher object shaped as triton 3.6's ``CudaLauncher``: ``launch`` is the closure
    ``wrap_handle_tensordesc`` returns, over the raw launcher and the descriptors' metadata."""

    def inner(*args):
        return launcher, tensordesc_indices, tensordesc_meta

    return types.SimpleNamespace(
        launch=inner, global_scratch_size=0, profile_scratch_size=0,
        launch_cooperative_grid=False, launch_pdl=True,
    )  # fmt: skip


@pytest.mark.device_independent
def test_descriptor_expansion_follows_triton36_make_tensordesc_arg():
    """The direct launch's TMA path, without a GPU: the plan read from a 3.6-shaped launcher
    (positions, swizzle, element size, dtype code through Triton's device-to-host table, box),
    and each descriptor tensor expanded in place to (encoded map, *shape, *strides) with the
    encoder called as Triton calls it; a launcher of another shape, scratch memory, or a
    descriptor Triton did not lower to TMA gives no plan (the compiled launcher expands)."""
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [1, 1, 64, 64], "fp4_padded": False}
    runtime = triton_runtime.TritonRuntime(
        knobs=None, current_device=None, current_stream=None, jit_function=object, descriptor=None,
        fill_tma=object(), tma_dtype_codes={9: 8},
    )  # fmt: skip
    raw = object.__new__(type("Raw", (), {"__call__": lambda self, *a: None}))
    launcher = _closure_like_triton36(raw, {1, 3}, [meta, dict(meta, swizzle=2)])
    got = fast_launch._raw_descriptor_launch(launcher, [1, 3], runtime)
    assert got is not None, "a 3.6-shaped launcher gave no plan"
    assert got[0] is raw and got[1] == (False, True)
    assert got[2] == ((1, 3, 2, 8, [1, 1, 64, 64]), (3, 2, 2, 8, [1, 1, 64, 64]))
    for bad in (
        _closure_like_triton36(raw, {1, 2}, [meta, meta]),  # other positions
        _closure_like_triton36(raw, {1, 3}, [meta, None]),  # one descriptor not lowered to TMA
        _closure_like_triton36(raw, {1, 3}, [meta, dict(meta, fp4_padded=True)]),
        types.SimpleNamespace(**{**vars(launcher), "global_scratch_size": 128}),
        types.SimpleNamespace(launch=lambda *a: None),  # no closure: another Triton
    ):
        assert fast_launch._raw_descriptor_launch(bad, [1, 3], runtime) is None

    calls = []

    def fill(*args):
        calls.append(args)
        return f"map{len(calls)}"

    k, v = torch.zeros(2, 3, 40, 16)[..., :8], torch.zeros(2, 3, 40, 8)
    expanded = fast_launch._expand_descriptors(("q", k, "o", v, 7), got[2], fill)
    assert expanded == ["q", "map1", 2, 3, 40, 8, *k.stride(), "o", "map2", 2, 3, 40, 8, *v.stride(), 7]
    assert calls == [
        (k.data_ptr(), 3, 2, 8, [1, 1, 64, 64], k.shape, k.stride(), 0),
        (v.data_ptr(), 2, 2, 8, [1, 1, 64, 64], v.shape, v.stride(), 0),
    ]


# ---------------------------------------------------------------------------------------------
# On the GPU: the direct path is taken, and gives the normal path's results bit for bit.


def _verified_triton() -> bool:
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    return version in triton_runtime.VERIFIED_TRITON


@gpu_only
def test_direct_path_is_active_on_this_gpu():
    if not _verified_triton():
        pytest.skip(f"triton {triton.__version__} is not a verified version: the normal path runs")
    assert triton_runtime.find_runtime() is not None, "CUDA with a verified triton: the direct path runs"


@gpu_only
def test_launch_key_refines_triton_with_the_cuda_backend():
    from triton.compiler import make_backend
    from triton.runtime.driver import driver

    backend = make_backend(driver.active.get_current_target())
    _assert_key_refines_triton(_plain_fwd_kernel, _forward_arg_sets(DEVICE), FORWARD_CONSTEXPRS, backend)


def _run(problem_tensors, causal, backward):
    q, k, v, grad = problem_tensors
    q, k, v = (x.detach().requires_grad_(backward) for x in (q, k, v))
    out = attnkit.attention(q, k, v, causal=causal, backend="triton")
    if not backward:
        return (out,)
    out.backward(grad)
    return out, q.grad, k.grad, v.grad


def _count_normal_launches(monkeypatch):
    """Counts launches through ``JITFunction.run`` (the normal path) of every attnkit kernel."""
    counts = {"normal": 0}
    for kernel in (_plain_fwd_kernel, _attn_bwd_preprocess, _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel,
                   _decode_split_kernel, _decode_combine_kernel):  # fmt: skip
        run = kernel.run

        def counting(*args, _run=run, **kwargs):
            counts["normal"] += 1
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counting, raising=False)
    return counts


GPU_CASES = [
    # (B, Hq, Hkv, N, M, D), layout, dtype, causal
    *[((2, 4, 2, 77, 130, 64), layout, torch.bfloat16, True) for layout in LAYOUTS],
    ((1, 1, 1, 1, 1, 64), "unit_strides", torch.float16, True),  # size-1 dims, strides of 1
    ((2, 1, 1, 40, 40, 32), "unit_strides", torch.float32, False),
    ((1, 8, 8, 128, 128, 64), "contiguous", torch.bfloat16, True),  # the shape
    ((2, 8, 2, 1, 1000, 128), "contiguous", torch.bfloat16, True),  # split-KV decode
    ((2, 8, 2, 1, 1000, 128), "offset", torch.bfloat16, True),  # decode reads unaligned bases
    ((2, 8, 2, 3, 700, 64), "rows_not_16", torch.float16, False),
    # 2**24 score pairs: on Hopper every kernel but the preprocess reads its streamed pair
    # through TMA descriptors, which the direct path encodes itself (triton 3.6).
    ((1, 4, 2, 2048, 2048, 64), "contiguous", torch.bfloat16, True),
    ((1, 4, 2, 2048, 2048, 64), "bnhd", torch.float16, False),
]


@gpu_only
@pytest.mark.parametrize(("dims", "layout", "dtype", "causal"), GPU_CASES, ids=str)
def test_direct_launches_match_normal_launches_bitwise(monkeypatch, dims, layout, dtype, causal):
    b, hq, hkv, n, m, d = dims
    gen = torch.Generator().manual_seed(3)
    tensors = (
        _layout(layout, (b, hq, n, d), dtype, DEVICE, gen),
        _layout(layout, (b, hkv, m, d), dtype, DEVICE, gen),
        _layout(layout, (b, hkv, m, d), dtype, DEVICE, gen),
        _layout("contiguous", (b, hq, n, d), dtype, DEVICE, gen),
    )
    backward = n > 1 or m < 1000  # the decode shapes check the split-KV forward alone
    monkeypatch.setattr(fast_launch, "_runtime", None)
    normal = _run(tensors, causal, backward)
    monkeypatch.setattr(fast_launch, "_runtime", fast_launch._MISSING)
    counts = _count_normal_launches(monkeypatch)
    _run(tensors, causal, backward)  # fills the direct path's entries (normal launches)
    first = counts["normal"]
    direct = _run(tensors, causal, backward)
    torch.cuda.synchronize()
    if _verified_triton():
        assert counts["normal"] == first, (
            f"{counts['normal'] - first} launches of the repeated call took the normal path"
        )
    for name, a, b_ in zip(("out", "dq", "dk", "dv"), normal, direct, strict=False):
        assert torch.equal(a, b_), (
            f"{name}: direct launch differs from normal launch (max {(a - b_).abs().max()})"
        )


#: (B, Hq, Hkv, N, M, D), layout: the regular forward in every layout, the split-KV one (which
#: reads unaligned bases in place) in two.
BOUND_CASES = [((2, 4, 2, 77, 130, 64), layout) for layout in LAYOUTS] + [
    ((2, 8, 2, 1, 1000, 128), layout) for layout in ("contiguous", "offset")
]


@gpu_only
@pytest.mark.parametrize(("dims", "layout"), BOUND_CASES, ids=str)
def test_bound_forward_launches_match_normal_launches_bitwise(monkeypatch, dims, layout):
    """Calls without gradients: from a layout's second direct call on, the forward launches
    bound (no launch through ``JITFunction.run``, every launch a ``BoundLaunch``), bit for bit
    as the normal path. The regular forward copies a misaligned base first: never bound."""
    if not _verified_triton():
        pytest.skip(f"triton {triton.__version__} is not a verified version: the normal path runs")
    monkeypatch.setattr(attnkit.api, "_compiled_memo", None)  # its native launches: tested below
    gen = torch.Generator().manual_seed(5)
    b, hq, hkv, n, m, d = dims
    q = _layout(layout, (b, hq, n, d), torch.bfloat16, DEVICE, gen)
    k = _layout(layout, (b, hkv, m, d), torch.bfloat16, DEVICE, gen)
    v = _layout(layout, (b, hkv, m, d), torch.bfloat16, DEVICE, gen)
    tensors = (q, k, v, None)
    monkeypatch.setattr(fast_launch, "_runtime", None)
    (normal,) = _run(tensors, True, False)
    monkeypatch.setattr(fast_launch, "_runtime", fast_launch._MISSING)
    counts = _count_normal_launches(monkeypatch)
    _run(tensors, True, False)  # the direct path's entries, then the binding
    first = counts["normal"]
    launched = []
    bound_call = fast_launch.BoundLaunch.__call__

    def counted(self, *tensors):
        launched.append(bound_call(self, *tensors))
        return launched[-1]

    monkeypatch.setattr(fast_launch.BoundLaunch, "__call__", counted)
    bound = [_run(tensors, True, False)[0] for _ in range(2)]
    torch.cuda.synchronize()
    assert counts["normal"] == first, f"{counts['normal'] - first} repeated launches took the normal path"
    split_kv = n == 1
    if layout == "offset" and not split_kv:
        assert True not in launched, "a misaligned layout was launched bound"
    else:
        expected = [True] * (4 if split_kv else 2)  # split-KV: the split and the combine
        assert launched == expected, f"{layout}: bound launches returned {launched}, expected {expected}"
    for out in bound:
        assert torch.equal(out, normal), f"bound launch differs (max {(out - normal).abs().max()})"


# ---------------------------------------------------------------------------------------------
# Native launches: a bound launch described as data (NativeLaunch, attnkit.triton.native_launch) for
# the compiled fast path, which makes it from C++. On the CPU: what the description holds, and how
# the compiled memo keeps, checks and declines programs. On the GPU: that the programs it runs
# give the bound path's results bit for bit, run no Python but the readiness checks, and replay
# in a CUDA graph.

MEMO = fastpath.memo
needs_memo = pytest.mark.skipif(MEMO is None, reason=f"attnkit.fastpath: {fastpath.status}")


def _bound(types, leading_key, tail, *, native=True, pdl=False):
    """A BoundLaunch of a compiled kernel with signature ``types`` (no runtime behind it)."""
    entry = fast_launch._Entry(
        launcher=None,
        function=77,
        packed_metadata=(4, 1, 1024),
        constexprs=(),
        kernel_globals=(),
        native_layout=(tuple(types), 4, 1024, pdl, False) if native else None,
    )
    return fast_launch.BoundLaunch(
        entry=entry, runtime=None, device=0, options=(), debug=None, kernel=None,
        leading_key=leading_key, launch_head=(6, 2, 1), launch_tail=tail,
    )  # fmt: skip


_ALIGNED_BF16, _UNALIGNED_FP32 = (torch.bfloat16, True), (torch.float32, False)


@pytest.mark.device_independent
def test_a_native_launch_packs_the_parameters_triton36_passes():
    """Pointers from the call's tensor slots, each scalar the compiled signature keeps with its
    kind, none of the parameters Triton made constant, then the two (null) scratch pointers."""
    # X, Y (pointers), a stride equal to 1 (specialised to a constant), n (i32), big (i64),
    # scale (fp32), BLOCK (a declared constexpr, bound as a keyword value)
    types = ("*bf16", "*fp32", "constexpr", "i32", "i64", "fp32", "constexpr")
    bound = _bound(types, (_ALIGNED_BF16, _UNALIGNED_FP32), (1, 7, 2**40, 0.5, 64), pdl=True)
    launch = native_launch(bound, (0, 3))
    assert launch.params == (
        ("tensor", 0, True), ("tensor", 3, False), ("i32", 7), ("i64", 2**40), ("fp32", 0.5),
        ("ptr", 0), ("ptr", 0),
    )  # fmt: skip
    assert (launch.function, launch.grid, launch.block, launch.shared) == (77, (6, 2, 1), 128, 1024)
    assert (launch.pdl, launch.cooperative) == (True, False)
    assert launch.ready == bound.ready


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("types", "tail", "slots", "native"),
    [
        (("*bf16", "i32"), (5,), (0,), False),  # not compiled by triton 3.6's launcher
        (("i32", "i32"), (5,), (0,), True),  # a leading argument the kernel does not take as a pointer
        (("*bf16", "i1"), (True,), (0,), True),  # a kind it does not pack
        (("*bf16", "i32"), (0.5,), (0,), True),  # a value of another type than its kind's
        (("*bf16", "i32"), (5,), (0, 1), True),  # slots for more tensors than are bound
        (("*bf16", "i32", "i32"), (5,), (0,), True),  # a signature longer than the arguments
    ],
    ids=["not-native", "leading-int", "unknown-kind", "mistyped", "slots", "signature"],
)
def test_a_launch_native_cannot_describe_is_none(types, tail, slots, native):
    assert native_launch(_bound(types, (_ALIGNED_BF16,), tail, native=native), slots) is None


def _compiled(**metadata):
    fields = dict(num_ctas=1, global_scratch_size=0, profile_scratch_size=0, num_warps=4, shared=64,
                  launch_pdl=True, launch_cooperative_grid=False) | metadata  # fmt: skip
    return types.SimpleNamespace(
        metadata=types.SimpleNamespace(**fields),
        packed_metadata=(fields["num_warps"], fields["num_ctas"], fields["shared"]),
        src=types.SimpleNamespace(signature={"X": "*bf16", "n": "i32", "BLOCK": "constexpr"}),
    )


@pytest.mark.device_independent
def test_native_layout_is_read_only_from_a_plain_triton36_launch():
    assert native_layout(_compiled(), True) == (
        ("*bf16", "i32", "constexpr"),
        4,
        64,
        True,
        False,
    )
    assert native_layout(_compiled(), False) is None, "another triton's launcher"
    for unlike in ({"num_ctas": 2}, {"global_scratch_size": 128}, {"profile_scratch_size": 8}):
        assert native_layout(_compiled(**unlike), True) is None, f"described with {unlike}"
    mismatched = _compiled()
    mismatched.packed_metadata = (4, 1, 64, 1)  # another launcher metadata than triton 3.6 packs
    assert native_layout(mismatched, True) is None


def _program(q, ready, **launch):
    fields = dict(ready=ready, function=1, grid=(1, 1, 1), block=32, shared=0, pdl=False, cooperative=False,
                  params=(("tensor", 3, True), ("i32", 5), ("fp32", 0.5), ("ptr", 0))) | launch  # fmt: skip
    return NativeProgram(
        device=0,
        allocations=((tuple(q.shape), q.dtype),),
        launches=(NativeLaunch(**fields),),
        result=3,
    )


@pytest.fixture
def compiled_memo(monkeypatch):
    if MEMO is None:
        pytest.skip(f"attnkit.fastpath: {fastpath.status}")
    MEMO.forget()
    yield MEMO
    MEMO.forget()


@pytest.mark.device_independent
@needs_memo
@pytest.mark.parametrize(
    "program",
    [
        ("device", (), (), 3),
        (0, (((2, 2), "float32"),), (), 3),  # a dtype that is not a torch.dtype
        (0, (), (), 3),  # a result slot past the tensors
        (0, (), ((print, 1, (1, 1), 32, 0, False, False, ()),), 0),  # a grid of two extents
        (0, (), ((print, 1, (1, 1, 1), 32, 0, False, False, (("tensor", 3, True),)),), 0),  # no slot 3
        (0, (), ((print, 1, (1, 1, 1), 32, 0, False, False, (("i32", 2**31),)),), 0),  # not an i32
        (0, (), ((print, 1, (1, 1, 1), 32, 0, False, False, (("i8", 1),)),), 0),  # a kind it has not
        (0, (), ((None, 1, (1, 1, 1), 32, 0, False, False, ()),), 0),  # ready not callable
    ],
    ids=["device", "dtype", "result", "grid", "slot", "i32-range", "kind", "ready"],
)
def test_a_malformed_native_program_is_an_error_when_it_is_kept(compiled_memo, program):
    q = torch.randn(1, 1, 2, 16)

    def run(q, k, v, problem):
        return q

    prepared = PreparedRun(run, native_forward=lambda q, k, v: program)
    with pytest.raises(TypeError, match=r"^native program: "):
        compiled_memo.remember(q, q, q, False, None, None, "triton", "problem", prepared)


@pytest.mark.device_independent
@needs_memo
def test_native_programs_are_asked_for_calls_without_gradients_and_declined_off_cuda(compiled_memo):
    """The memo asks a prepared run's ``native_forward`` for each call the run made without gradients;
    it never runs a program for CPU operands (nor asks it whether it is ready); a call with
    gradients neither asks nor runs one."""
    asked, ready_asked, ran = [], [], []
    x = torch.randn(1, 2, 8, 16)

    def run(q, k, v, problem):
        ran.append(problem)
        return q * 2

    prepared = PreparedRun(
        run,
        native_forward=lambda q, k, v: asked.append(q.stride()) or _program(q, lambda: ready_asked.append(1)),
    )
    compiled_memo.remember(x, x, x, True, None, None, "triton", "problem", prepared)
    assert asked == [x.stride()], "the program was not asked for when the entry was made"
    for _ in range(2):
        assert torch.equal(compiled_memo.call(x, x, x, True, None, None, "triton"), x * 2)
    assert (len(ran), len(asked), ready_asked) == (2, 3, []), (
        "a program ran, or was not asked for, on the CPU"
    )
    graded = x.clone().requires_grad_()
    compiled_memo.call(graded, graded, graded, True, None, None, "triton")
    assert (len(ran), len(asked)) == (3, 3), "a call with gradients asked for a program"


# On the GPU.


def _skip_without_native_launches():
    if not getattr(triton_runtime.find_runtime(), "native_launches", False):
        pytest.skip(f"triton {triton.__version__}: no native launches (triton 3.6's launcher only)")


def _triton_calls(q, k, v, **kwargs):
    return lambda: attnkit.attention(q, k, v, backend="triton", **kwargs)


#: What a native call runs in Python: attention()'s frame and the readiness checks.
_NATIVE_CALL = {
    "attnkit.api:attention",
    "attnkit.triton.fast_launch:ready",
    *(f"attnkit.triton.runtime:{name}" for name in ("options", "_hook_active")),
    "attnkit.triton.fast_launch:globals_unchanged",
    "attnkit.triton.fast_launch:<genexpr>",  # globals_unchanged's
}
_PYTHON_RUN = "attnkit.flash_autograd:flash_attention"

NATIVE_CASES = [
    *[((2, 4, 2, 77, 130, 64), layout, True) for layout in LAYOUTS],
    ((1, 8, 8, 128, 128, 64), "contiguous", True),  # the per-call table's small shape
    ((1, 8, 8, 128, 128, 64), "contiguous", False),
    ((2, 8, 2, 1, 1000, 128), "contiguous", True),  # split-KV decode: split and combine (PDL)
    ((2, 8, 2, 1, 1000, 128), "offset", True),
]


@gpu_only
@needs_memo
@pytest.mark.parametrize(("dims", "layout", "causal"), NATIVE_CASES, ids=str)
def test_native_launches_match_bound_launches_bitwise(monkeypatch, dims, layout, causal):
    """A repeated call without gradients runs the layout's native program: no Python but
    attention()'s frame and the launches' readiness checks (no prepared run, no launcher), and
    the bound path's output bit for bit. A layout the regular forward copies first (a
    misaligned base) is never bound, so never native, and still right."""
    _skip_without_native_launches()
    gen = torch.Generator().manual_seed(7)
    b, hq, hkv, n, m, d = dims
    q = _layout(layout, (b, hq, n, d), torch.bfloat16, DEVICE, gen)
    k = _layout(layout, (b, hkv, m, d), torch.bfloat16, DEVICE, gen)
    v = _layout(layout, (b, hkv, m, d), torch.bfloat16, DEVICE, gen)
    attend = _triton_calls(q, k, v, causal=causal)
    with monkeypatch.context() as python_memo:
        python_memo.setattr(attnkit.api, "_compiled_memo", None)
        bound = [attend() for _ in range(3)][-1]
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    MEMO.forget()
    attend()  # the Python memo's call, which keeps the entry and the layout's program
    outputs = []
    entered = python_functions_run(lambda: outputs.append(attend()))
    ours = {f for f in entered if f.startswith("attnkit.")}
    if layout == "offset" and n > 1:
        assert _PYTHON_RUN in ours, f"{layout}: a copied layout's call did not take the Python run"
    else:
        assert "attnkit.triton.fast_launch:ready" in ours and ours <= _NATIVE_CALL, (
            f"{layout}: a repeated call ran {sorted(ours - _NATIVE_CALL)}"
        )
    torch.cuda.synchronize()
    assert torch.equal(outputs[0], bound), f"native launch differs (max {(outputs[0] - bound).abs().max()})"


@gpu_only
@needs_memo
@pytest.mark.usefixtures("no_dead_cuda_graphs")
@pytest.mark.parametrize(
    "dims", [(1, 8, 8, 128, 128, 64), (2, 8, 2, 1, 1000, 128)], ids=["forward", "decode"]
)
def test_native_launches_are_captured_and_replayed_in_a_cuda_graph(monkeypatch, dims):
    """The launches go on the current stream: captured in a CUDA graph, whose replay computes
    the output of new inputs copied into the captured ones."""
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    outputs = []
    b, hq, hkv, n, m, d = dims
    q, k, v = (
        torch.randn(b, h, s, d, device=DEVICE, dtype=torch.bfloat16) for h, s in ((hq, n), (hkv, m), (hkv, m))
    )
    attend = _triton_calls(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            attend()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        entered = python_functions_run(lambda: outputs.append(attend()))
    captured = outputs[0]
    if getattr(triton_runtime.find_runtime(), "native_launches", False):
        assert _PYTHON_RUN not in entered, "the captured call did not take the native launches"
    q.copy_(torch.randn_like(q))
    graph.replay()
    with monkeypatch.context() as python_memo:
        python_memo.setattr(attnkit.api, "_compiled_memo", None)
        expected = attend()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected), "the replayed graph did not compute the new inputs' output"


@gpu_only
@needs_memo
def test_a_launch_hook_sends_native_calls_back_to_the_launcher(monkeypatch):
    """A launch hook added after a layout's program was kept (a profiler starting) sees every
    launch; once it is removed, repeated calls are native again."""
    from triton import knobs

    _skip_without_native_launches()
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    q, k, v = (torch.randn(1, 8, 128, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    attend = _triton_calls(q, k, v, causal=True)
    attend(), attend()
    seen = []

    def hook(metadata):
        seen.append(metadata)

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        attend(), attend()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 2, f"the hook saw {len(seen)} of 2 launches"
    attend()  # the first call after: the Python run, which binds again
    assert _PYTHON_RUN not in python_functions_run(attend), "the native launches did not resume"


@gpu_only
@needs_memo
def test_calls_with_gradients_take_the_autograd_path(monkeypatch):
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    q, k, v = (torch.randn(1, 8, 128, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    attend = _triton_calls(q, k, v, causal=True)
    attend(), attend()  # kept, with a program for the layout
    q.requires_grad_()
    out = attend()
    assert out.grad_fn is not None, "a call with gradients was run without its autograd node"
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()

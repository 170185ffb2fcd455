"""The Triton path: parity with the float64 oracle on shapes that cross its block edges,
bitwise-deterministic gradients, and clear errors for configs and inputs it does not take.

Shapes stay tiny (N, M <= 48, D <= 80): on the CPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE

import attnkit
from attnkit import UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor

_UNAVAILABLE = (
    "triton is not installed"
    if "triton" not in attnkit.backend_names()
    else attnkit.unavailable_reason("triton", DEVICE)
)
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"triton on {DEVICE}: {_UNAVAILABLE}")

from attnkit.flash_autograd import flash_attention  # noqa: E402
from attnkit.triton import AttentionConfig, KernelConfig, TritonImplementation, triton_attention  # noqa: E402
from attnkit.triton.config import FP32_TILE_VOLUME, default_config, family_key, padded_dim  # noqa: E402
from attnkit.triton.launch import LaunchSetup, aligned_copy, attention_forward  # noqa: E402

#: The TMA-descriptor paths run on Hopper and in the interpreter, nowhere else.
_TMA_UNAVAILABLE = torch.device(DEVICE).type == "cuda" and torch.cuda.get_device_capability(DEVICE)[0] != 9


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int = 1
    q_heads: int = 2
    kv_heads: int = 2
    q_len: int = 33
    kv_len: int = 33
    head_dim: int = 32
    value_dim: int = 32
    causal: bool = True
    dtype: torch.dtype = torch.float32
    scale: float | None = None
    layout: str = "contiguous"
    window: tuple[int, int] | None = None

    def tensors(self, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        common = {"dtype": self.dtype, "device": DEVICE, "generator": gen, "layout": self.layout}
        q = make_tensor((self.batch, self.q_heads, self.q_len, self.head_dim), **common)
        k = make_tensor((self.batch, self.kv_heads, self.kv_len, self.head_dim), **common)
        v = make_tensor((self.batch, self.kv_heads, self.kv_len, self.value_dim), **common)
        grad_out = torch.randn(self.batch, self.q_heads, self.q_len, self.value_dim, generator=gen)
        return q, k, v, grad_out.to(device=DEVICE, dtype=self.dtype)


CASES = {
    "n1": Case(q_len=1, kv_len=1, head_dim=16, value_dim=16),
    "decode-n1": Case(q_len=1, kv_len=45, head_dim=40, value_dim=40, dtype=torch.bfloat16),
    "n-gt-m-causal": Case(q_len=45, kv_len=13, head_dim=24, value_dim=24),
    "n-lt-m-causal": Case(q_len=13, kv_len=45, dtype=torch.float16),
    "n-ne-m-full": Case(q_len=29, kv_len=47, causal=False, dtype=torch.bfloat16),
    "gqa": Case(q_heads=4, kv_heads=2, q_len=40, kv_len=37, dtype=torch.bfloat16),
    "mqa": Case(batch=2, q_heads=3, kv_heads=1, q_len=17, kv_len=17, causal=False),
    "d24": Case(head_dim=24, value_dim=24, q_len=31, kv_len=31, dtype=torch.float16),
    "d40-dv24": Case(head_dim=40, value_dim=24, q_len=19, kv_len=35),
    "d80": Case(head_dim=80, value_dim=80, q_len=21, kv_len=21, dtype=torch.bfloat16),
    "bnhd": Case(layout="bnhd", q_len=27, kv_len=33, causal=False),
    "strided": Case(layout="strided", q_len=33, kv_len=27, dtype=torch.float16),
    "expanded": Case(layout="expanded", batch=2, q_len=23, kv_len=23),
    "scale-zero": Case(scale=0.0, q_len=7, kv_len=19),
    "negative-scale": Case(scale=-0.3, q_len=18, kv_len=18, dtype=torch.bfloat16),
    # Windows (the interpreter's tiles are 32 x 16, 16 x 32): band edges inside blocks, a band
    # narrower than a block, left-only, right-only, N != M, rows that see no key.
    "window-causal": Case(q_len=47, kv_len=47, window=(9, -1), dtype=torch.bfloat16),
    "window-narrow": Case(q_len=40, kv_len=40, causal=False, window=(1, 2)),
    "window-left-only-n-lt-m": Case(q_len=21, kv_len=46, causal=False, window=(5, -1), dtype=torch.float16),
    "window-right-only-n-gt-m": Case(q_len=46, kv_len=21, causal=False, window=(-1, 0)),
    "window-gqa-causal-n-lt-m": Case(q_heads=4, kv_heads=1, q_len=19, kv_len=44, window=(20, 0)),
}


def _run(case: Case, config: AttentionConfig | None = None):
    def fn(q, k, v):
        if config is None:
            return attention(
                q, k, v, causal=case.causal, scale=case.scale, window=case.window, backend="triton"
            )
        problem = check_inputs(q, k, v, case.causal, case.scale, case.window)
        return triton_attention(q, k, v, problem, config)

    return fn


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name):
    case = CASES[name]
    q, k, v, grad_out = case.tensors()
    checks = compare_to_reference(
        _run(case), q, k, v, causal=case.causal, scale=case.scale, grad_out=grad_out, window=case.window
    )
    assert_close_to_reference(f"triton {name}: {case}", checks)


@pytest.mark.parametrize("name", list(CASES))
def test_a_call_without_gradients_matches_the_forward_of_one_with_them(name):
    """No backward follows a call without gradients, so the path runs its forward without the
    log-sum-exp (:meth:`LaunchSetup.forward_only`; from the second call of a layout on, a
    bound launch on the GPU). Its output is the forward's with gradients, bit for bit."""
    case = CASES[name]
    q, k, v, _ = case.tensors()
    run = _run(case)
    with_gradients = run(*(x.detach().requires_grad_() for x in (q, k, v))).detach()
    with torch.no_grad():
        outputs = [run(q, k, v) for _ in range(3)]
    for call, out in enumerate(outputs):
        assert torch.equal(out, with_gradients), (
            f"call {call} without gradients differs from the forward with them: max "
            f"{(out.float() - with_gradients.float()).abs().max()} ({case})"
        )


@pytest.mark.skipif(_TMA_UNAVAILABLE, reason="TMA descriptors need a Hopper GPU or the interpreter")
@pytest.mark.parametrize(
    "name",
    [
        "n-gt-m-causal",
        "n-lt-m-causal",
        "gqa",
        "d40-dv24",
        "bnhd",
        "negative-scale",
        "window-causal",
        "window-narrow",
    ],
)
def test_tma_matches_reference(name):
    """Every kernel with its streamed tensors through TMA descriptors (forward and dQ: K and V;
    dK/dV: Q and dO), outputs and gradients: keys, queries and head dims that end inside a
    block rely on the descriptors' zero fill instead of masks, and rows that see no key keep
    lse = +inf."""
    case = CASES[name]
    q, k, v, grad_out = case.tensors()
    setup = LaunchSetup.build(check_inputs(q, k, v, case.causal, case.scale, case.window))
    checks = compare_to_reference(
        lambda a, b, c: flash_attention(TritonImplementation(tma=True), a, b, c, setup.problem),
        q,
        k,
        v,
        causal=case.causal,
        scale=case.scale,
        window=case.window,
        grad_out=grad_out,
    )
    assert_close_to_reference(f"triton via TMA {name}: {case}", checks)
    unseen = torch.isinf(attention_forward(q, k, v, setup, tma=True)[1])
    expected = torch.isinf(attention_forward(q, k, v, setup, tma=False)[1])
    assert torch.equal(unseen, expected), (
        f"lse = +inf on {unseen.sum().item()} rows via TMA, {expected.sum().item()} via pointers"
    )


@pytest.mark.parametrize(
    "config",
    [
        AttentionConfig(KernelConfig(16, 32), KernelConfig(32, 16), KernelConfig(16, 16)),
        AttentionConfig(KernelConfig(64, 16), KernelConfig(16, 64), KernelConfig(64, 32)),
    ],
    ids=["bm16-bn32", "bm64-bn16"],
)
@pytest.mark.parametrize("window", [None, (13, -1), (3, 20)], ids=["no-window", "window-left", "window-both"])
def test_explicit_config_matches_reference(config, window):
    """Other tile shapes move the causal diagonal, the window's edges and the ragged ends to
    other loop phases."""
    case = Case(q_heads=4, kv_heads=2, q_len=37, kv_len=45, head_dim=40, value_dim=24, window=window)
    q, k, v, grad_out = case.tensors(seed=1)
    checks = compare_to_reference(
        _run(case, config), q, k, v, causal=case.causal, scale=case.scale, grad_out=grad_out, window=window
    )
    assert_close_to_reference(f"triton with {config}", checks)


@pytest.mark.parametrize(
    ("causal", "window"), [(True, None), (False, None), (False, (7, 5))], ids=["causal", "full", "window"]
)
def test_backward_is_bitwise_deterministic(causal, window):
    case = Case(q_heads=4, kv_heads=2, q_len=47, kv_len=41, causal=causal, dtype=torch.bfloat16)
    q, k, v, grad_out = case.tensors(seed=2)
    runs = []
    for _ in range(2):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = attention(*leaves, causal=causal, window=window, backend="triton")
        runs.append([out, *torch.autograd.grad(out, leaves, grad_out)])
    for name, first, second in zip(("out", "dq", "dk", "dv"), *runs, strict=True):
        differing = (first != second).sum().item()
        assert differing == 0, f"{name}: {differing} elements differ between two identical runs"


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_m": 8, "block_n": 64}, "block_m"),
        ({"block_m": 64, "block_n": 96}, "block_n"),
        ({"block_m": 64, "block_n": 64, "num_warps": 3}, "num_warps"),
        ({"block_m": 64, "block_n": 64, "num_stages": 0}, "num_stages"),
    ],
)
def test_bad_kernel_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KernelConfig(**kwargs)


@pytest.mark.device_independent
def test_config_table_entry_round_trips_and_rejects_missing_kernels():
    config = default_config(torch.bfloat16, 128, 128)
    assert AttentionConfig.from_dict(config.as_dict()) == config
    with pytest.raises(ValueError, match="dq"):
        AttentionConfig.from_dict({"fwd": config.as_dict()["fwd"], "dkdv": config.as_dict()["dkdv"]})
    assert family_key(torch.bfloat16, 80, 80, True) == "16bit-d128-causal"
    assert [padded_dim(d) for d in (1, 16, 24, 80, 256)] == [16, 16, 32, 128, 256]


@pytest.mark.device_independent
@pytest.mark.parametrize("dim", [16, 40, 64, 128, 256])
def test_float32_default_tiles_keep_the_unrolled_dot_small(dim):
    """float32 dots unroll into per-thread FMAs whose ptxas time grows with the tile: the
    default float32 tiles stay under the cap, 16-bit tiles (tensor cores) are not capped."""
    fp32 = default_config(torch.float32, dim, dim)
    for name, cfg in fp32.as_dict().items():
        volume = cfg["block_m"] * cfg["block_n"] * padded_dim(dim)
        assert volume <= FP32_TILE_VOLUME, f"float32 {name} tiles {cfg} unroll {volume} multiply-adds"
    bf16 = default_config(torch.bfloat16, dim, dim).fwd
    assert bf16.block_m * bf16.block_n >= fp32.fwd.block_m * fp32.fwd.block_n
    if dim >= 40:
        assert bf16.block_m * bf16.block_n > fp32.fwd.block_m * fp32.fwd.block_n, (bf16, fp32.fwd)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("dtype", "head_dim", "message"),
    [(torch.float64, 32, "float64"), (torch.float32, 264, "head_dim 264")],
)
def test_unsupported_problem_is_rejected_before_launch(dtype, head_dim, message):
    gen = torch.Generator().manual_seed(0)
    q = make_tensor((1, 1, 4, head_dim), dtype=dtype, device=DEVICE, generator=gen)
    with pytest.raises(UnsupportedProblemError, match=message):
        attention(q, q, q, backend="triton")


@pytest.mark.device_independent
@pytest.mark.parametrize("variable", [None, "1"], ids=["unset", "set-after-import"])
def test_cpu_without_interpreted_kernels_says_what_is_missing(monkeypatch, variable):
    """Kernels compiled for a GPU (TRITON_INTERPRET unset at import) cannot run on the CPU,
    whatever the variable says now; the reason says what to do."""
    monkeypatch.setattr(attnkit.triton.router, "_KERNELS_INTERPRETED", False)
    if variable is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", variable)
    reason = attnkit.unavailable_reason("triton", "cpu")
    assert reason is not None and "TRITON_INTERPRET=1" in reason, f"unhelpful reason: {reason!r}"
    assert "triton" not in attnkit.available_backends("cpu"), "listed triton although it cannot run"


@pytest.mark.device_independent
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("dim", [3, 17, 59, 111])
def test_aligned_copy_pads_rows_to_16_bytes(dtype, dim):
    """What the GPU launch copies an unaligned operand to: the same values, every outer stride a
    multiple of 16 bytes even when a row of D values is not (59 fp16 values are 118 bytes)."""
    x = torch.randn(2, 3, 10, dim).to(dtype)[:, :, ::2]
    y = aligned_copy(x)
    assert torch.equal(y, x), "aligned_copy changed values"
    strides = [s * y.element_size() for s in y.stride()[:-1]]
    assert y.stride(-1) == 1 and all(s % 16 == 0 for s in strides), f"byte strides {strides} for D={dim}"


def test_window_bounds_are_runtime_ints_and_the_flag_a_constexpr():
    """A new window value must not compile new kernels (its offsets are never specialised),
    and no window compiles the kernels without any lower-edge code (WINDOW=False)."""
    from attnkit.triton.forward_kernels import DYNAMIC_INTS

    assert {"causal_offset", "lower_offset"} <= set(DYNAMIC_INTS)
    q = torch.empty(1, 2, 64, 32, device="meta", dtype=torch.float16)
    plain = LaunchSetup.build(dataclasses.replace(check_inputs(q, q, q, True, None), device=DEVICE))
    windowed = LaunchSetup.build(
        dataclasses.replace(check_inputs(q, q, q, True, None, (16, 0)), device=DEVICE)
    )
    assert plain.kernel_kwargs["fwd"]["WINDOW"] is False and windowed.kernel_kwargs["fwd"]["WINDOW"] is True
    assert windowed.sizes[-1] == -16, f"lower offset of window (16, 0) is {windowed.sizes[-1]}, not -16"

"""The Gluon Hopper forward: inputs it declines (everywhere), and on an sm_90 GPU its output
and log-sum-exp under the tolerance rule. The log-sum-exp is checked the way a training call
uses it: attnkit's Triton backward runs from the Gluon forward's (o, lse), and the gradients
must pass the rule too."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import DEVICE

import attnkit.gluon as gluon
from attnkit import UnsupportedProblemError
from attnkit.flash_autograd import flash_attention
from attnkit.gluon.config import get_config
from attnkit.inputs import check_inputs
from attnkit.testing import assert_close_to_reference, compare_to_reference, make_tensor

pytestmark = pytest.mark.skipif(gluon.forward is None, reason=f"attnkit.gluon: {gluon.unavailable_reason()}")

_GPU_REASON = (
    gluon.unavailable_reason() if DEVICE.type == "cuda" else f"needs an sm_90 GPU; tests run on {DEVICE}"
)
needs_hopper = pytest.mark.skipif(_GPU_REASON is not None, reason=f"Gluon Hopper forward: {_GPU_REASON}")


def _qkv(b=1, h=2, n=128, m=128, d=64, dtype=torch.bfloat16, device=DEVICE):
    return (torch.randn(b, h, rows, d, dtype=dtype, device=device) for rows in (n, m, m))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"dtype": torch.float32}, UnsupportedProblemError, "float16 or bfloat16"),
        ({"d": 96}, UnsupportedProblemError, "head_dim 96"),
        ({"kv_heads": 1}, UnsupportedProblemError, "no GQA"),
        ({"transpose": True}, UnsupportedProblemError, "contiguous"),
        ({"scale": -0.1}, UnsupportedProblemError, "scale must be"),
        ({"scale": math.nan}, UnsupportedProblemError, "scale must be"),
        ({"causal": 1}, TypeError, "causal"),
        ({"shape": (2, 128, 64)}, ValueError, "4 dims"),
    ],
)
def test_declines_before_any_kernel(change, error, message):
    q, k, v = _qkv(d=change.get("d", 64), dtype=change.get("dtype", torch.bfloat16), device="cpu")
    if "kv_heads" in change:
        k, v = k[:, :1].contiguous(), v[:, :1].contiguous()
    if change.get("transpose"):
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if "shape" in change:
        q = q.reshape(change["shape"])
    with pytest.raises(error, match=message):
        gluon.forward(q, k, v, change.get("causal", False), change.get("scale", 0.125))


def test_declines_the_cpu():
    with pytest.raises(UnsupportedProblemError, match="runs on CUDA"):
        gluon.forward(*_qkv(device="cpu"), causal=False, scale=0.125)


class _GluonForwardTritonBackward:
    """The Gluon forward under attnkit's shared autograd function, with the Triton backward."""

    op_name = None

    def __init__(self, config):
        from attnkit.triton import TritonImplementation

        self.triton = TritonImplementation()
        self.config = config

    def forward(self, q, k, v, problem):
        return gluon.forward(q, k, v, problem.causal, problem.scale, config=self.config)

    def backward(self, grad_out, q, k, v, out, lse, problem):
        return self.triton.backward(grad_out, q, k, v, out, lse, problem)


#: The shipped configs, and the options a config may switch on (each runs other code).
VARIANTS = {"shipped": {}, "pingpong": {"pingpong": True}, "persistent": {"persistent": True}}


@needs_hopper
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("b", "h", "n", "m", "d", "causal", "magnitude"),
    [
        (1, 2, 128, 128, 64, False, "unit"),
        (2, 3, 1000, 1000, 128, True, "unit"),  # ragged: the last tiles run past the rows
        (2, 3, 1000, 1000, 64, False, "unit"),
        (1, 2, 300, 700, 128, True, "unit"),  # M > N: bottom-right diagonal
        (1, 2, 700, 300, 64, True, "unit"),  # N > M: the first 400 rows see no key
        (1, 2, 1, 257, 128, False, "unit"),
        (1, 1, 4099, 4099, 128, True, "unit"),
        (1, 2, 512, 512, 128, True, "large"),  # large logits: a missing max-shift overflows
        (1, 2, 512, 640, 64, False, "outliers"),
    ],
)
def test_matches_the_oracle_with_the_triton_backward(b, h, n, m, d, causal, magnitude, dtype, variant):
    gen = torch.Generator().manual_seed(0)
    shape_q, shape_kv = (b, h, n, d), (b, h, m, d)
    q = make_tensor(shape_q, dtype=dtype, device=DEVICE, generator=gen, magnitude=magnitude)
    k, v = (make_tensor(shape_kv, dtype=dtype, device=DEVICE, generator=gen) for _ in range(2))
    grad_out = make_tensor(shape_q, dtype=dtype, device=DEVICE, generator=gen)
    scale = 1.0 / math.sqrt(d)
    impl = _GluonForwardTritonBackward(dataclasses.replace(get_config(d), **VARIANTS[variant]))

    def run(q_, k_, v_):
        return flash_attention(impl, q_, k_, v_, check_inputs(q_, k_, v_, causal, scale))

    checks = compare_to_reference(run, q, k, v, causal=causal, scale=scale, grad_out=grad_out)
    assert_close_to_reference(
        f"gluon {variant} B={b} H={h} N={n} M={m} D={d} causal={causal} {dtype}", checks
    )


@needs_hopper
def test_lse_is_natural_log_with_inf_for_rows_that_see_nothing():
    torch.manual_seed(0)
    q, k, v = _qkv(n=300, m=100, d=64)
    _, lse = gluon.forward(q, k, v, True, 0.125)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    rows, cols = torch.arange(300, device=DEVICE)[:, None], torch.arange(100, device=DEVICE)[None, :]
    expected = s.masked_fill(cols > rows - 200, -math.inf).logsumexp(-1)
    expected = torch.where(torch.isneginf(expected), math.inf, expected)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 300)
    assert torch.isinf(lse[..., :200]).all(), "rows before the diagonal must store +inf"
    err = (lse[..., 200:].double() - expected[..., 200:]).abs().max().item()
    assert err <= 1e-4, f"log-sum-exp differs from the float64 one by {err:.2e} (natural log expected)"

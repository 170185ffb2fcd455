"""The output's form and NaN propagation: what a caller of the backend relies on beyond the
numbers."""

from __future__ import annotations

import pytest
import torch

from attnkit import attention
from attnkit.suite.checks import sized_for, skip_if_declined
from attnkit.testing.edge_cases import edge

_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", ["contiguous", "bnhd", "strided"])
def test_output_has_the_callers_dtype_device_and_shape(attnkit_backend, attnkit_device, dtype, layout):
    """(B, Hq, N, Dv) in q's dtype on q's device, for GQA with M != N, D != Dv, any layout."""
    case = edge(batch=2, q_heads=4, kv_heads=2, q_len=7, kv_len=11, head_dim=16, value_dim=24, dtype=dtype,
                q_layout=layout, kv_layout=layout)  # fmt: skip
    case = sized_for(attnkit_backend, case, attnkit_device)
    q, k, v, _ = case.tensors(attnkit_device)
    out = skip_if_declined(
        attnkit_backend, lambda: attention(q, k, v, **case.kwargs, backend=attnkit_backend)
    )
    p = case.problem
    got = (tuple(out.shape), out.dtype, out.device)
    expected = ((p.batch, p.q_heads, p.q_len, p.value_dim), dtype, q.device)
    assert got == expected, f"{attnkit_backend} returned {got}, expected {expected} for {case}"


@pytest.mark.parametrize(("q_len", "kv_len"), [(6, 9), (9, 9)], ids=["fewer-queries", "square"])
def test_nan_in_a_query_row_reaches_that_row_only(attnkit_backend, attnkit_device, q_len, kv_len):
    """Causal, a NaN in query row 2 of head 1: output row 2 of head 1 is NaN, every other row
    finite (a kernel must not hide a NaN, nor spread it to rows it does not reach)."""
    case = edge(q_len=q_len, kv_len=kv_len, head_dim=16, causal=True)
    q, k, v, _ = case.tensors(attnkit_device)
    q[0, 1, 2, 5] = float("nan")
    out = skip_if_declined(
        attnkit_backend, lambda: attention(q, k, v, **case.kwargs, backend=attnkit_backend)
    )
    others = torch.cat([out[0, 1, :2], out[0, 1, 3:], out[0, 0]])
    # Booleans, not tensor expressions: a failure then prints no tensor (pytest explains the latter).
    others_finite = bool(torch.isfinite(others).all())
    assert others_finite, f"{attnkit_backend}: a NaN in one query row reached other rows"
    row = out[0, 1, 2]
    row_nan = bool(row.isnan().all())
    assert row_nan, (
        f"{attnkit_backend}: {int((~row.isnan()).sum())} of the {row.numel()} values of the row whose "
        "query holds a NaN are not NaN"
    )


def test_nan_in_a_key_reaches_the_rows_that_see_it(attnkit_backend, attnkit_device):
    """Causal N = M, a NaN in key 4: rows 4.. see it and are NaN (whether rows 0..3, which do
    not see it, stay finite is not required: a mask applied by adding -inf to the scores, as
    PyTorch's SDPA math kernel does, gives NaN there too)."""
    case = edge(q_len=9, kv_len=9, head_dim=16, causal=True)
    q, k, v, _ = case.tensors(attnkit_device)
    k[0, :, 4, 3] = float("nan")
    out = skip_if_declined(
        attnkit_backend, lambda: attention(q, k, v, **case.kwargs, backend=attnkit_backend)
    )
    seen_nan = bool(out[:, :, 4:].isnan().all())
    assert seen_nan, f"{attnkit_backend}: rows that see a NaN key are not all NaN"

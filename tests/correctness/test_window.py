"""The sliding window's plumbing: normalisation in the one validated problem, the tiled path's
loop bounds against the oracle's visibility matrix, and the paths that decline windows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import MultiHeadAttention, UnsupportedProblemError, attention
from attnkit.inputs import check_inputs
from attnkit.kvcache import attention_with_kvcache
from attnkit.reference import reference_attention, visibility
from attnkit.testing.strategies import windows
from attnkit.tiled import key_range_for_rows, row_range_for_keys


def _problem(q_len, kv_len, causal=False, window=None, q_heads=2, kv_heads=2):
    q = torch.empty(1, q_heads, q_len, 16, device="meta")
    k = torch.empty(1, kv_heads, kv_len, 16, device="meta")
    return check_inputs(q, k, k, causal, None, window)


@pytest.mark.device_independent
@pytest.mark.parametrize(
    ("q_len", "kv_len", "causal", "window", "expected"),
    [
        (8, 8, False, (7, 7), (None, None)),  # covers every key: no window
        (8, 8, False, (6, 7), (6, None)),
        (4, 9, False, (8, 3), (None, None)),  # left >= M - 1, right >= N - 1 with N != M
        (4, 9, False, (7, 2), (7, 2)),
        (8, 8, True, (3, 0), (3, None)),  # with causal the right side never hides more
        (8, 8, True, (-1, 0), (None, None)),
        (5, 5, False, (-1, -1), (None, None)),
    ],
)
def test_window_is_normalised(q_len, kv_len, causal, window, expected):
    problem = _problem(q_len, kv_len, causal, window)
    assert (problem.window_left, problem.window_right) == expected
    if expected == (None, None):
        assert problem == _problem(q_len, kv_len, causal), "a window that hides nothing is not no window"
        assert "window" not in problem.describe()
    else:
        assert f"window={problem.window}" in problem.describe()
        assert check_inputs(*(torch.empty(1, 2, n, 16, device="meta") for n in (q_len, kv_len, kv_len)),
                            causal, None, problem.window) == problem  # fmt: skip


@pytest.mark.device_independent
@given(
    q_len=st.integers(1, 40),
    kv_len=st.integers(1, 40),
    causal=st.booleans(),
    block=st.sampled_from([1, 3, 8, 16]),
    data=st.data(),
)
def test_tiled_loop_bounds_cover_exactly_the_visible_blocks(q_len, kv_len, causal, block, data):
    """Each block of rows loops over a key range holding every key its rows see and starting and
    ending on a visible key (nothing wholly outside the band); the same for key blocks' rows."""
    problem = _problem(q_len, kv_len, causal, data.draw(windows(q_len, kv_len)))
    visible = visibility(problem, torch.device("cpu"))
    for row0 in range(0, q_len, block):
        cols = visible[row0 : row0 + block].any(dim=0).nonzero().flatten().tolist()
        start, end = key_range_for_rows(problem, row0, min(row0 + block, q_len))
        assert (start, end) == ((cols[0], cols[-1] + 1) if cols else (start, start)), (problem, row0)
    for key0 in range(0, kv_len, block):
        rows = visible[:, key0 : key0 + block].any(dim=1).nonzero().flatten().tolist()
        start, end = row_range_for_keys(problem, key0, min(key0 + block, kv_len))
        assert (start, end) == ((rows[0], rows[-1] + 1) if rows else (start, start)), (problem, key0)


def test_split_kv_decode_declines_windows_and_the_plain_forward_runs():
    pytest.importorskip("triton")
    from attnkit.triton.decode import use_split_kv

    assert use_split_kv(_problem(1, 4096, True, q_heads=8, kv_heads=2))
    assert not use_split_kv(_problem(1, 4096, True, (256, -1), q_heads=8, kv_heads=2))


@pytest.mark.device_independent
def test_kvcache_rejects_a_window_before_any_compute():
    q = torch.randn(1, 2, 1, 16)
    cache = torch.zeros(1, 2, 8, 16)
    with pytest.raises(UnsupportedProblemError, match=r"window: attention_with_kvcache takes no sliding"):
        attention_with_kvcache(q, cache, cache, 4, window=(2, 0))


@pytest.mark.device_independent
def test_module_passes_its_window():
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, causal=True, window=(3, -1), backend="naive").double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    q, k, v = (
        proj(x).view(2, 10, 4, 8).transpose(1, 2) for proj in (layer.q_proj, layer.k_proj, layer.v_proj)
    )
    out = reference_attention(q, k, v, causal=True, window=(3, -1))
    expected = layer.out_proj(out.transpose(1, 2).reshape(2, 10, 32))
    assert torch.allclose(layer(x), expected), "MultiHeadAttention ignored its window"
    assert not torch.allclose(layer(x), MultiHeadAttention(32, 4, causal=True, backend="naive").double()(x))


@pytest.mark.device_independent
def test_window_changes_the_result_where_it_hides_keys():
    """Guard against a window silently ignored: (2, 0) hides keys that causal alone shows."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 12, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    windowed = attention(q, k, v, causal=True, window=(2, 0), backend="tiled")
    assert torch.allclose(windowed, reference_attention(q, k, v, causal=True, window=(2, 0)))
    assert not torch.allclose(windowed[:, :, 3:], attention(q, k, v, causal=True, backend="tiled")[:, :, 3:])

"""attention_with_kvcache dispatches through the registry: its ``auto`` is attention's choice for
the problem (the measured table where there is one), and a backend reads the cache in place
through the ``cache_forward`` it declares, or takes the gathered route."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import api, registry
from attnkit.kvcache_inputs import CacheProblem

#: Dispatch is decided before any kernel runs, on CPU tensors here.
pytestmark = pytest.mark.device_independent


@pytest.fixture
def registry_copy(monkeypatch):
    """Backends registered by a test stay in it; every memoised plan is dropped after."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    yield
    api._forget_plans()


def _cache(batch=2, kv_heads=2, capacity=16, dim=8):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 4, 1, dim, generator=gen)
    k_cache = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    v_cache = torch.randn(batch, kv_heads, capacity, dim, generator=gen)
    return q, k_cache, v_cache, torch.tensor([5, 9])


def _plain(q, k, v, *, causal, scale, window):
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return ((q @ k.transpose(-1, -2)) * scale).softmax(-1) @ v


def test_a_backends_cache_forward_reads_the_cache_and_none_takes_the_gathered_route(registry_copy):
    seen = []

    def reads_in_place(q, k_cache, v_cache, cache, block_table):
        seen.append(cache)
        return torch.full((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[-1]), 7.0)

    attnkit.register_backend("in-place", _plain, cache_forward=reads_in_place)
    q, k_cache, v_cache, lengths = _cache()
    out = attnkit.attention_with_kvcache(q, k_cache, v_cache, lengths, backend="in-place")
    assert torch.equal(out, torch.full_like(out, 7.0))
    assert isinstance(seen[0], CacheProblem) and seen[0].lengths.tolist() == [5, 9]

    attnkit.register_backend("in-place", _plain, cache_forward=lambda *args: None, replace=True)
    gathered = attnkit.attention_with_kvcache(q, k_cache, v_cache, lengths, backend="in-place")
    expected = attnkit.attention_with_kvcache(q, k_cache, v_cache, lengths, backend="naive")
    torch.testing.assert_close(gathered, expected)


def test_auto_is_the_choice_attention_makes_for_the_problem(registry_copy, monkeypatch):
    picked = []

    def recording(q, k_cache, v_cache, cache, block_table):
        picked.append("first")
        return None

    attnkit.register_backend("first", _plain, cache_forward=recording)
    attnkit.register_backend("second", _plain, supports=lambda p: "declines everything")
    # The measured order of this problem, as a GPU model's table would give it.
    monkeypatch.setattr(api, "auto_order", lambda problem, training: ("second", "first", "naive"))
    q, k_cache, v_cache, lengths = _cache()
    attnkit.attention_with_kvcache(q, k_cache, v_cache, lengths)
    assert picked == ["first"]
    assert api.choose_backend("auto", attnkit.inputs.check_inputs(q, q, q, False, None, None)) == "first"


def test_no_backend_taking_the_problem_names_every_reason(registry_copy, monkeypatch):
    attnkit.register_backend("second", _plain, supports=lambda p: "declines everything")
    monkeypatch.setattr(api, "auto_order", lambda problem, training: ("second",))
    q, k_cache, v_cache, lengths = _cache()
    with pytest.raises(attnkit.UnsupportedProblemError, match="second: declines everything"):
        attnkit.attention_with_kvcache(q, k_cache, v_cache, lengths)


def test_a_cache_forward_that_is_not_callable_is_refused_at_registration(registry_copy):
    with pytest.raises(TypeError, match="cache_forward must be callable"):
        attnkit.register_backend("bad", _plain, cache_forward="fast")

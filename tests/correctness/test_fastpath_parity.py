"""One parity test per rule that exists both in Python and in the compiled fast path's C++
(``attnkit/fastpath/csrc/fast_calls.cpp``), each running both over one table of cases:

* which calls have a memo key: :func:`attnkit.attention`'s conditions against ``make_key``;
* the fused-kernel layout rule: :func:`attnkit.sdpa.layout.aligned_for_fused_kernels` against
  ``layout_passes``;
* whether a call records a backward: :func:`attnkit.flash_autograd.flash_attention` against
  ``needs_grad``.

The C++ side is the extension built for this torch (``ATTNKIT_FAST_CALLS=build``); without it
these tests are skipped with the loader's reason.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnkit
import attnkit.api
from attnkit import fastpath
from attnkit.flash_autograd import PATHS, flash_attention
from attnkit.inputs import check_inputs, records_backward
from attnkit.sdpa.layout import aligned_for_fused_kernels

MEMO = fastpath.memo
# Host-side rules (keys, layouts, grad recording) on both sides: the CPU CI's run decides them.
pytestmark = [
    pytest.mark.skipif(MEMO is None, reason=f"attnkit.fastpath: {fastpath.status}"),
    pytest.mark.device_independent,
]


class _TensorSubclass(torch.Tensor):
    pass


class _BackendName(str):
    pass


class _Scale(float):
    pass


#: attention()'s keyword arguments (backend "naive" unless given), and whether the call has a
#: memo key. Every call here runs; the memos keep an entry after a call that ran.
_KEY_CASES = {
    "defaults": ({}, True),
    "causal": ({"causal": True}, True),
    "causal as a NumPy bool": ({"causal": np.bool_(True)}, False),
    "scale within 1": ({"scale": 0.25}, True),
    "scale exactly 1": ({"scale": 1.0}, True),
    "scale exactly -1": ({"scale": -1.0}, True),
    "negative scale": ({"scale": -0.5}, True),
    "zero scale": ({"scale": 0.0}, True),
    "minus zero scale": ({"scale": -0.0}, True),
    "scale above 1 (checked against the data)": ({"scale": 2.0}, False),
    "scale just above 1": ({"scale": float(np.nextafter(1.0, 2.0))}, False),
    "int scale": ({"scale": 1}, False),
    "float subclass scale": ({"scale": _Scale(0.5)}, False),
    "NumPy float scale": ({"scale": np.float64(0.5)}, False),
    "window": ({"window": (2, 0)}, True),
    "unbounded window side": ({"window": (-1, 3)}, True),
    "window at the int64 bound": ({"window": (2**63 - 1, 0)}, True),
    "window past the int64 bound": ({"window": (2**63, 0)}, False),
    "window of a NumPy int and an int": ({"window": (np.int64(2), 0)}, False),
    "window as a list": ({"window": [2, 0]}, False),
    "backend auto": ({"backend": "auto"}, True),
    "backend named by a str subclass": ({"backend": _BackendName("naive")}, False),
}


@pytest.fixture
def both_memos(monkeypatch):
    """attention() with the compiled memo in front, both memos started empty."""
    monkeypatch.setattr(attnkit.api, "_compiled_memo", MEMO)
    monkeypatch.setattr(attnkit.api, "_PLANNED", {})
    MEMO.forget()
    yield MEMO
    MEMO.forget()


@pytest.mark.parametrize(("args", "has_key"), list(_KEY_CASES.values()), ids=list(_KEY_CASES))
def test_both_memos_key_the_same_calls(both_memos, args, has_key):
    q, k, v = (torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    attnkit.attention(q, k, v, **{"backend": "naive", **args})
    kept = (len(attnkit.api._PLANNED), both_memos.size())
    assert kept == (int(has_key), int(has_key)), (
        f"{args}: the Python memo kept {kept[0]} entries, the compiled memo {kept[1]}; "
        f"both should keep {int(has_key)}"
    )


def test_tensor_subclasses_are_the_one_difference_in_keys(both_memos):
    """A subclass may override ``__torch_function__``: the Python memo reads its shapes through
    it and keeps it, the compiled one keeps exact tensors only (and so never bypasses the
    subclass's calls). A difference on purpose, in the safe direction."""
    q, k, v = (torch.randn(1, 2, 8, 16).as_subclass(_TensorSubclass) for _ in range(3))
    attnkit.attention(q, k, v, backend="naive")
    assert (len(attnkit.api._PLANNED), both_memos.size()) == (1, 0)


@st.composite
def _strided_operands(draw):
    """A 4-D view of a buffer with drawn sizes, strides (zero and size-1 dimensions' odd ones
    included) and storage offset, of a 2-, 4- or 8-byte dtype."""
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32, torch.float64]))
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=4, max_size=4)))
    last = draw(st.sampled_from([1, 1, 1, 2]))
    strides = [last]
    for size in reversed(shape[1:]):
        choice = draw(st.sampled_from(["packed", "padded", "odd", "zero"]))
        step = strides[-1] * size
        strides.append({"packed": step, "padded": step + 8, "odd": step + 3, "zero": 0}[choice])
    strides = tuple(reversed(strides))
    offset = draw(st.sampled_from([0, 0, 1, 8, 16]))
    extent = offset + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True)) + 1
    buffer = torch.zeros(extent + 16, dtype=dtype)
    return buffer.as_strided(shape, strides, offset)


@given(x=_strided_operands())
def test_both_layout_rules_pass_the_same_operands_as_they_are(x):
    """The Python rule decides which operands reach the fused kernels as they are; the compiled
    test takes exactly those, except rows no layout aligns, which it leaves to the Python rule
    (that one may pass them as they are, after ``contiguous()``)."""
    item, last_dim = x.element_size(), x.shape[-1]
    passes = aligned_for_fused_kernels(x, item, last_dim) is x
    compiled = MEMO.layout_passes(x, item, last_dim)
    expected = passes and (last_dim * item) % 16 == 0
    assert compiled == expected, (
        f"strides {x.stride()}, offset {x.storage_offset()}, {x.dtype}: the Python rule "
        f"{'passes' if passes else 'copies'} it, the compiled test {'passes' if compiled else 'does not'}"
    )


#: Grad modes a call may run under.
_GRAD_MODES = {
    "grad enabled": lambda: torch.enable_grad(),
    "no_grad": lambda: torch.no_grad(),
    "inference_mode": lambda: torch.inference_mode(),
}


@pytest.mark.parametrize("mode", list(_GRAD_MODES))
@pytest.mark.parametrize("requires", list(itertools.product([False, True], repeat=3)), ids=str)
def test_both_sides_record_a_backward_for_the_same_calls(mode, requires):
    """A call records a backward iff grad mode is on and q, k or v requires grad: the Python
    path then applies the autograd function instead of the forward-only run, and the compiled
    memo then makes no native forward."""
    q, k, v = (torch.randn(1, 1, 4, 8).requires_grad_(r) for r in requires)
    problem = check_inputs(q, k, v, False, None)
    forward_only = torch.zeros(1)  # what the forward-only run returns: no backward recorded
    with _GRAD_MODES[mode]():
        out = flash_attention(PATHS["tiled"](), q, k, v, problem, forward_only=lambda *_: forward_only)
        compiled = MEMO.records_backward(q, k, v)
        rule = records_backward(q, k, v)
    python = out is not forward_only
    expected = mode == "grad enabled" and any(requires)
    assert (python, compiled, rule) == (expected, expected, expected), (
        f"{mode}, requires_grad {requires}: Python records a backward: {python}, C++: {compiled}, "
        f"records_backward: {rule}; expected {expected}"
    )

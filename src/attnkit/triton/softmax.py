"""The online-softmax step of the Triton forwards (the fused forward of
:mod:`attnkit.triton.forward_kernels` and the split-KV forward of
:mod:`attnkit.triton.decode_kernels`), written once. The Gluon kernels have their own, in their
language (:func:`attnkit.triton.gluon.hopper_forward._softmax_step`).

Scores live in the log2 domain: ``qk_scale = scale * log2(e)``, so the weights are ``exp2``. A
row with nothing visible so far keeps max = -inf and sum = 0; its ``exp2`` terms are taken
against 0 instead of -inf, so no ``-inf - -inf = NaN`` appears, and the max itself stays -inf
until a key is seen (a max of 0 kept from an empty block would underflow the row's later terms).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _online_softmax_step(qk, qk_scale, visible, m_i, l_i, MASKED: tl.constexpr):
    """One key block of the online softmax over raw scores ``qk`` (rows, keys).

    Returns ``(p, alpha, m_new, l_new)``: ``p`` the block's unnormalised weights, ``alpha`` the
    factor that rescales what the rows accumulated before, and the rows' new running max (log2
    domain) and sum. MASKED: only the ``visible`` (rows, keys) scores count, any ``qk_scale``;
    otherwise every score counts and ``qk_scale >= 0``, so the row max of the scaled scores is
    the scaled row max, scaling and shifting a score is one FMA, and every row has a finite max
    (``visible`` goes unused)."""
    if MASKED:
        s = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new

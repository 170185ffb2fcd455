"""Attention calls that broke, or would break, real attention kernels: the suite runs every
backend on each (:data:`EDGE_CASES`), and a kernel's own tests can pin them with ``@example``."""

from __future__ import annotations

import torch

from attnkit.testing.strategies import AttentionCase


def edge(**overrides) -> AttentionCase:
    """A case from a base (B=1, Hq=Hkv=2, N=M=16, D=Dv=32, causal, float32, contiguous, unit
    values, seed 0) and the given overrides (:meth:`AttentionCase.make`'s arguments)."""
    base = dict(batch=1, q_heads=2, kv_heads=2, q_len=16, kv_len=16, head_dim=32, value_dim=32, causal=True)
    return AttentionCase.make(**{**base, **overrides})


#: Found on the H100 by the thorough profile (torch 2.11): a one-key window over 64 keys, 66
#: float16 queries with large logits (|q| ~ 30). cuDNN's backward returned NaN in dq on every
#: run; sdpa-cudnn declines it, sdpa leaves cuDNN out of PyTorch's choice.
CUDNN_MASKED_FLOAT16 = AttentionCase.make(
    q_len=66, kv_len=64, head_dim=16, dtype=torch.float16, magnitude="large", window=(0, 0)
)


#: Cases that broke, or would break, real attention kernels; every backend runs each one.
EDGE_CASES = {
    "single-token": edge(q_len=1, kv_len=1, head_dim=16, value_dim=16),
    "decode-gqa": edge(q_len=1, kv_len=37, q_heads=4, kv_heads=1, head_dim=40, value_dim=40),
    "rows-see-no-key": edge(q_len=37, kv_len=13, head_dim=24, value_dim=40, dtype=torch.bfloat16),
    "block-edge-fp16": edge(q_len=64, kv_len=64, head_dim=64, value_dim=64, dtype=torch.float16),
    "just-past-blocks": edge(
        q_len=65, kv_len=129, causal=False, head_dim=80, value_dim=80, dtype=torch.bfloat16
    ),
    "scale-zero": edge(q_len=7, kv_len=19, scale=0.0),
    "negative-scale": edge(q_len=9, kv_len=9, scale=-0.3, dtype=torch.float16),
    "mqa": edge(q_heads=4, kv_heads=1, q_len=33, kv_len=33, dtype=torch.bfloat16),
    "large-logits": edge(q_len=48, kv_len=48, magnitude="large", dtype=torch.bfloat16),
    "outliers": edge(
        q_len=31, kv_len=47, head_dim=96, value_dim=96, magnitude="outliers", dtype=torch.float16
    ),
    "head-dim-256": edge(q_len=17, kv_len=17, head_dim=256, value_dim=256),
    "strided-layouts": edge(q_len=29, kv_len=41, q_layout="bnhd", kv_layout="strided", causal=False),
    "expanded-kv": edge(batch=2, q_len=23, kv_len=23, kv_layout="expanded", dtype=torch.bfloat16),
    "float64": edge(q_len=50, kv_len=70, q_heads=3, kv_heads=1, dtype=torch.float64),
    # Drawn by the dev profile: float64 scores at this scale are normal numbers, so dq and dk
    # are ~1e-205, not 0 (the SDPA path once zeroed q below float32's smallest normal).
    "tiny-scale-float64": edge(q_len=9, kv_len=12, dtype=torch.float64, scale=7.8e-207),
    # Drawn by the thorough profile on the CPU: a float32-subnormal scale with large operands
    # gives dk ~3e-37, a normal number (the SDPA path once zeroed q below float32's smallest
    # normal and returned dk = 0).
    "subnormal-scale-bf16": edge(
        q_len=2,
        kv_len=2,
        head_dim=3,
        value_dim=3,
        causal=False,
        dtype=torch.bfloat16,
        scale=6.786719798781322e-39,
        magnitude="large",
    ),
    # Found on the H100 by the ci profile (as a windowed problem): cuDNN's backward (torch 2.11)
    # returned inf gradients at a float32-subnormal scale.
    "subnormal-scale-bf16-d32": edge(
        batch=5,
        q_len=62,
        kv_len=25,
        head_dim=32,
        value_dim=16,
        causal=False,
        dtype=torch.bfloat16,
        scale=2.4784527358487718e-42,
        magnitude="outliers",
    ),
    # Found on the H100 by the ci profile: Triton's compiled forward read out of bounds (wrong
    # rows, or an illegal memory access) with a value tile narrower than the key tile; the Triton
    # path widens Dv to D's tile (attnkit.triton.padding), every path must be right.
    "narrow-value-tile-fp16": edge(
        batch=4,
        q_heads=2,
        kv_heads=1,
        q_len=1,
        kv_len=46,
        head_dim=40,
        value_dim=24,
        causal=False,
        dtype=torch.float16,
        scale=-0.18456691482860818,
        q_layout="expanded",
        kv_layout="strided",
        magnitude="large",
    ),
    # Found on the H100 by the thorough profile: cuDNN (torch 2.11) crashed the process with a
    # segmentation fault on operands expanded along the batch (stride 0).
    "expanded-batch-dv24": edge(
        batch=3,
        q_len=3,
        kv_len=3,
        head_dim=96,
        value_dim=24,
        causal=False,
        dtype=torch.float16,
        q_layout="expanded",
        kv_layout="expanded",
    ),
    # Found on the H100 by the thorough profile: the memory-efficient backward (torch 2.11) had
    # "no kernel found to launch" for a single-row key whose size-1 dimensions keep odd strides.
    "single-row-odd-strides": edge(
        q_len=1,
        kv_len=1,
        q_heads=1,
        kv_heads=1,
        head_dim=16,
        value_dim=16,
        causal=False,
        dtype=torch.float16,
        scale=-0.25,
        kv_layout="strided",
    ),
    # Found on the H100 by the thorough profile: a scale this small puts fp16 gradients below
    # fp16's smallest normal number, where roundings are absolute (the rule's floor).
    "subnormal-fp16-gradients": edge(
        q_len=7,
        kv_len=7,
        q_heads=1,
        kv_heads=1,
        head_dim=16,
        value_dim=16,
        causal=False,
        dtype=torch.float16,
        scale=2.6442243881016228e-06,
    ),
    "expanded-batch-gqa": edge(
        batch=2,
        q_heads=3,
        kv_heads=3,
        q_len=3,
        kv_len=37,
        head_dim=16,
        value_dim=96,
        causal=False,
        dtype=torch.float16,
        q_layout="expanded",
        kv_layout="expanded",
    ),
    # Head dims that are not multiples of 8: rows of 118/222/34 bytes in fp16/bf16.
    "head-dim-59": edge(q_len=45, kv_len=67, head_dim=59, value_dim=59, dtype=torch.float16),
    "head-dim-111-dv-17": edge(
        q_len=33, kv_len=40, head_dim=111, value_dim=17, dtype=torch.bfloat16, kv_layout="bnhd"
    ),
    "head-dim-3": edge(q_len=20, kv_len=20, head_dim=3, value_dim=3, dtype=torch.float16, causal=False),
    # Found on the H100: 76-byte rows of a Dv=16 V made triton 3.6's causal forward fault.
    "unaligned-rows-dv16": edge(
        batch=3,
        kv_heads=1,
        q_len=128,
        kv_len=128,
        head_dim=96,
        value_dim=16,
        dtype=torch.float16,
        kv_layout="strided",
        magnitude="outliers",
        seed=9191,
    ),
    # Found on the H100 by the thorough profile: cuDNN's masked float16 backward gave NaN dq.
    "window-one-key-fp16-large-logits": CUDNN_MASKED_FLOAT16,
    # Sliding windows: each edge of the band inside a block, N != M offsets, rows that see no key.
    "window-causal-left": edge(q_len=45, kv_len=45, window=(6, -1), dtype=torch.bfloat16),
    "window-zero-n-gt-m": edge(q_len=40, kv_len=23, causal=False, window=(0, 0)),
    "window-right-only-n-lt-m": edge(q_len=19, kv_len=44, causal=False, window=(-1, 3), dtype=torch.float16),
    "window-asymmetric-gqa": edge(
        q_heads=4, kv_heads=2, q_len=37, kv_len=41, causal=False, window=(9, 2), head_dim=40, value_dim=24
    ),
}

"""Host-time anatomy of single calls on a GPU host (issue 11), B1 H8 N128 D64 bf16 causal, grad
mode on, no operand requiring grad. Every row: calls alternating one by one with a partner
(A B, then B A), 3000 of each, the median per-call difference with its 95% interval.

    PYTHONPATH=src python scratch/s17_host2.py --out host2.json
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnkit.sdpa as S
from attnkit import attention
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--calls", type=int, default=3000)
args = ap.parse_args()
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
rows = []


def interleaved(a, b, n=args.calls):
    pc = time.perf_counter_ns
    da, db = np.empty(n), np.empty(n)
    for _ in range(100):
        a(), b()
    torch.cuda.synchronize()
    for i in range(n):
        if i & 1:
            t0 = pc(); b(); t1 = pc(); a(); t2 = pc()
            db[i], da[i] = t1 - t0, t2 - t1
        else:
            t0 = pc(); a(); t1 = pc(); b(); t2 = pc()
            da[i], db[i] = t1 - t0, t2 - t1
    torch.cuda.synchronize()
    return da / 1e3, db / 1e3


def row(name, a, b, ctx=None):
    if ctx is None:
        ia, ib = interleaved(a, b)
    else:
        with ctx():
            ia, ib = interleaved(a, b)
    d = ia - ib
    low, high = median_interval(d, confidence=0.95)
    r = {"row": name, "a": float(np.median(ia)), "b": float(np.median(ib)), "extra": float(np.median(d)), "low": low, "high": high}
    rows.append(r)
    print(f"{name:60s} {r['a']:8.2f} vs {r['b']:8.2f}  {r['extra']:+7.2f} [{low:+7.2f}, {high:+7.2f}]", flush=True)


raw = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
table = {i: (i, str(i)) for i in range(64)}
shape = q.shape


def pyload():  # pure Python of a few microseconds (attnkit-like tuples and lookups), no torch op
    hit = 0
    for i in range(12):
        key = (shape, shape, shape, i, 2, 3, 4, 5, 6, True, None, None, "triton")
        hit += table.get(hash(key) % 64, (0,))[0]
        t = (i, 2, 3)
        hit += t in {t} and isinstance(key, tuple) and type(key) is tuple
    return hit


row("pyload alone vs nothing", pyload, lambda: None)
row("pyload then raw sdpa vs raw sdpa", lambda: (pyload(), raw()), raw)
row("raw sdpa, all kwargs vs raw sdpa", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True, scale=None, enable_gqa=True), raw)
row("attnkit sdpa vs raw sdpa", lambda: attention(q, k, v, causal=True, backend="sdpa"), raw)
for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
    ctx = lambda kernel=kernel: sdpa_kernel([kernel])
    if kernel in S._KERNEL_OPS:
        op = S._KERNEL_OPS[kernel][0]
        row(f"{name}: op direct vs raw forced", lambda op=op: op(q, k, v, False, True, None), raw, ctx)
    toggles = S._SWITCHES[1][f"sdpa-{name}"]
    row(f"{name}: flags + sdpa vs raw forced", lambda t=toggles: S._with_flags(t, q, k, v, None, True, None), raw, ctx)
    row(f"{name}: attnkit vs raw forced", lambda b=f"sdpa-{name}": attention(q, k, v, causal=True, backend=b), raw, ctx)
shp = (1, 8, 128, 64)
row("torch.empty(*shape, dtype, device) vs nothing", lambda: torch.empty(*shp, dtype=torch.bfloat16, device=dev), lambda: None)
row("torch.empty(shape, dtype, device) vs nothing", lambda: torch.empty(shp, dtype=torch.bfloat16, device=dev), lambda: None)
row("q.new_empty(shape) vs nothing", lambda: q.new_empty(shp), lambda: None)
row("torch.empty_like(q) vs nothing", lambda: torch.empty_like(q), lambda: None)
row("attnkit triton vs raw sdpa", lambda: attention(q, k, v, causal=True, backend="triton"), raw)
with torch.no_grad():
    row("no_grad: attnkit triton vs raw sdpa", lambda: attention(q, k, v, causal=True, backend="triton"), raw)
json.dump(rows, open(args.out, "w"), indent=1)

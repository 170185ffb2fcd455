"""The floor of a Python layer over SDPA on the H100 host, with and without gradients (issue 11):
how much a one-line wrapper, a memo lookup, and attnkit's call each add to raw SDPA.
B1 H8 N128 D64 bf16 causal; call by call, A B / B A, forward and backward timed apart.

    PYTHONPATH=src python scratch/s18_floor.py --out floor.json
"""
import argparse, json, time, contextlib
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from attnkit import attention
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser(); ap.add_argument("--out", required=True); ap.add_argument("--calls", type=int, default=2000)
args = ap.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
gen = torch.Generator(device=dev).manual_seed(0)
clock = time.perf_counter_ns
sdpa = F.scaled_dot_product_attention

def raw(q, k, v):
    return sdpa(q, k, v, is_causal=True)

def wrapper(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
    return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)

MEMO = {}
def memo(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
    if torch.compiler.is_compiling():
        return None
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, window, backend)
    run = MEMO.get(key)
    if run is None:
        run = MEMO[key] = lambda q, k, v: sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    return run(q, k, v)

def step(fn, q, k, v, g):
    def s():
        t0 = clock(); out = fn(q, k, v); t1 = clock()
        if g is None:
            return t1 - t0, 0
        out.backward(g); t2 = clock()
        return t1 - t0, t2 - t1
    return s

def pair(a, b, n):
    ta = np.empty((n, 2)); tb = np.empty((n, 2))
    for _ in range(30): a(); b()
    sync()
    for i in range(n):
        if (i + i // 32) % 2 == 0:
            ta[i] = a(); tb[i] = b()
        else:
            tb[i] = b(); ta[i] = a()
        if i % 32 == 31: sync()
    sync()
    return ta / 1e3, tb / 1e3

def summ(x):
    lo, hi = median_interval(x, confidence=0.95); return [round(float(np.median(x)), 2), round(lo, 2), round(hi, 2)]

rows = []
def run(label, fa, fb, grad, ctx=None):
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_(grad) for _ in range(3))
    g = torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen) if grad else None
    with (ctx() if ctx else contextlib.nullcontext()):
        ta, tb = pair(step(fa, q, k, v, g), step(fb, q, k, v, g), args.calls)
    r = {"row": label, "grad": grad, "fwd_extra": summ(ta[:, 0] - tb[:, 0]), "a_fwd": summ(ta[:, 0]), "b_fwd": summ(tb[:, 0])}
    if grad:
        r |= {"bwd_extra": summ(ta[:, 1] - tb[:, 1]), "total_extra": summ(ta.sum(1) - tb.sum(1)), "b_bwd": summ(tb[:, 1])}
    rows.append(r); print(json.dumps(r), flush=True)

for grad in (False, True):
    run("A/A raw", raw, lambda q, k, v: raw(q, k, v), grad)
    run("one-line wrapper (kwargs, enable_gqa) vs raw", lambda q, k, v: wrapper(q, k, v, causal=True, backend="sdpa"), raw, grad)
    run("memo lookup (attnkit's key) + closure vs raw", lambda q, k, v: memo(q, k, v, causal=True, backend="sdpa"), raw, grad)
    run("attnkit sdpa vs raw", lambda q, k, v: attention(q, k, v, causal=True, backend="sdpa"), raw, grad)
    if dev.type == "cuda":
        run("attnkit sdpa-efficient vs raw-efficient", lambda q, k, v: attention(q, k, v, causal=True, backend="sdpa-efficient"), raw, grad,
            lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]))
t = []
for _ in range(7):
    s = clock(); x = 0
    for i in range(10000): x += i
    t.append((clock() - s) / 1e3)
rows.append({"row": "pure-python 10000-add loop us (least of 7)", "value": min(t)})
json.dump({"calls": args.calls, "rows": rows}, open(args.out, "w"), indent=1)

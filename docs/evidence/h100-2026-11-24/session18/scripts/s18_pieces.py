"""Which part of attnkit's sdpa call costs what on the H100 host (issue 11): each piece alone
(loops), and each piece timed together with raw SDPA after it, paired call by call with raw
SDPA alone (what the piece adds to a call, its effect on the op included).
B1 H8 N128 D64 bf16 causal, CUDA tensors, no grad and grad.

    PYTHONPATH=src python scratch/s18_pieces.py --out pieces.json
"""
import argparse, json, time
import numpy as np
import torch
import torch.nn.functional as F
from attnkit import attention, sdpa as S
from attnkit.inputs import check_inputs
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser(); ap.add_argument("--out", required=True); ap.add_argument("--calls", type=int, default=2000)
args = ap.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
gen = torch.Generator(device=dev).manual_seed(0)
clock = time.perf_counter_ns
sdpa = F.scaled_dot_product_attention
rows = []

def loop_ns(fn, n=20000, r=7):
    best = []
    for _ in range(r):
        s = clock()
        for _ in range(n): fn()
        best.append((clock() - s) / n)
    return round(min(best), 1)

def pair(a, b, n):
    ta = np.empty(n); tb = np.empty(n)
    for _ in range(30): a(); b()
    sync()
    for i in range(n):
        if (i + i // 32) % 2 == 0:
            t0 = clock(); a(); t1 = clock(); b(); t2 = clock(); ta[i], tb[i] = t1 - t0, t2 - t1
        else:
            t0 = clock(); b(); t1 = clock(); a(); t2 = clock(); tb[i], ta[i] = t1 - t0, t2 - t1
        if i % 32 == 31: sync()
    sync()
    return ta / 1e3, tb / 1e3

def summ(x):
    lo, hi = median_interval(x, confidence=0.95); return [round(float(np.median(x)), 2), round(lo, 2), round(hi, 2)]

for grad in (False, True):
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_(grad) for _ in range(3))
    problem = check_inputs(q, k, v, True, None, None)
    memo = S._LayoutMemo(); memo(q, k, v, problem)
    det = torch.are_deterministic_algorithms_enabled
    accepted = {(grad, False)}
    def state():
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return (needs_grad, det()) in accepted
    pieces = {
        "nothing": lambda: None,
        "3 stride()": lambda: (q.stride(), k.stride(), v.stride()),
        "3 data_ptr()": lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr()),
        "3 shape": lambda: (q.shape, k.shape, v.shape),
        "3 device": lambda: (q.device, k.device, v.device),
        "3 dtype": lambda: (q.dtype, k.dtype, v.dtype),
        "grad state + deterministic + set lookup": state,
        "layout memo": lambda: memo(q, k, v, problem),
        "key tuple + hash": lambda: hash((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa")),
    }
    tag = "grad" if grad else "nograd"
    for name, fn in pieces.items():
        rows.append({"row": f"{tag} alone ns: {name}", "value": loop_ns(fn)}); print(json.dumps(rows[-1]), flush=True)
    raw = lambda: sdpa(q, k, v, is_causal=True)
    for name in ("nothing", "3 stride()", "3 data_ptr()", "grad state + deterministic + set lookup", "layout memo", "key tuple + hash"):
        fn = pieces[name]
        ta, tb = pair(lambda: (fn(), raw()), raw, args.calls)
        rows.append({"row": f"{tag} paired: {name} then raw vs raw", "extra": summ(ta - tb), "b": summ(tb)}); print(json.dumps(rows[-1]), flush=True)
    ta, tb = pair(lambda: attention(q, k, v, causal=True, backend="sdpa"), raw, args.calls)
    rows.append({"row": f"{tag} paired: attnkit sdpa vs raw", "extra": summ(ta - tb), "b": summ(tb)}); print(json.dumps(rows[-1]), flush=True)
    saved = S._LayoutMemo.__call__
    S._LayoutMemo.__call__ = lambda self, q, k, v, problem: (q, k, v)
    try:
        ta, tb = pair(lambda: attention(q, k, v, causal=True, backend="sdpa"), raw, args.calls)
    finally:
        S._LayoutMemo.__call__ = saved
    rows.append({"row": f"{tag} paired: attnkit sdpa, layout memo a no-op, vs raw", "extra": summ(ta - tb), "b": summ(tb)}); print(json.dumps(rows[-1]), flush=True)
t = []
for _ in range(7):
    s = clock(); x = 0
    for i in range(10000): x += i
    t.append((clock() - s) / 1e3)
rows.append({"row": "pure-python 10000-add loop us (least of 7)", "value": min(t)})
json.dump({"calls": args.calls, "rows": rows}, open(args.out, "w"), indent=1)

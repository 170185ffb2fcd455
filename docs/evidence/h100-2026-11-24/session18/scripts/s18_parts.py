"""Where attnkit's forward extra over the forced raw SDPA kernel goes on the H100 host, with
and without gradients (issue 11). B1 H8 N128 D64 bf16 causal; call by call, A B / B A, device
synchronised every 32 pairs (untimed). Each row: A's forward host time minus B's.

    PYTHONPATH=src python scratch/s18_parts.py --out parts.json
"""
import argparse, json, time, contextlib
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attnkit
from attnkit import attention, api, sdpa as S
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser(); ap.add_argument("--out", required=True); ap.add_argument("--calls", type=int, default=2000)
args = ap.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
gen = torch.Generator(device=dev).manual_seed(0)
clock = time.perf_counter_ns
KERNELS = {"sdpa": None, "sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
           "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-math": SDPBackend.MATH}
if dev.type == "cpu":
    KERNELS = {k: v for k, v in KERNELS.items() if k in ("sdpa", "sdpa-flash", "sdpa-math")}

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

rows = []
def row(label, a, b, ctx=None):
    with (ctx() if ctx else contextlib.nullcontext()):
        ta, tb = pair(a, b, args.calls)
    r = {"row": label, "a": summ(ta), "b": summ(tb), "extra": summ(ta - tb)}
    rows.append(r); print(json.dumps(r), flush=True)

@contextlib.contextmanager
def stubbed(name, q, k, v, out):
    """attnkit's call for `name` with the SDPA call / kernel op replaced by returning `out`
    (a plan made for the stubs; the module's SDPA call stubbed while in the block)."""
    saved = (S._scaled_dot_product, dict(S._KERNEL_OPS))
    S._scaled_dot_product = lambda *a: out
    for key, (op, aten, cpu) in saved[1].items():
        S._KERNEL_OPS[key] = (lambda *a: out, aten, cpu)
    api._PLANNED.clear()
    fn = lambda: attention(q, k, v, causal=True, backend=name)
    try:
        for _ in range(3): fn()  # past the first-call (warnings-recording) path
        yield fn
    finally:
        S._scaled_dot_product = saved[0]
        S._KERNEL_OPS.clear(); S._KERNEL_OPS.update(saved[1])
        api._PLANNED.clear()

for grad in (False, True):
    tag = "grad" if grad else "nograd"
    q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_(grad) for _ in range(3))
    for name, kernel in KERNELS.items():
        ctx = (lambda kernel=kernel: sdpa_kernel([kernel])) if kernel is not None else None
        raw = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = raw()
        row(f"{tag} {name}: attnkit vs raw", lambda: attention(q, k, v, causal=True, backend=name), raw, ctx)
        with stubbed(name, q, k, v, out) as ak_python:
            row(f"{tag} {name}: attnkit Python (op stubbed) then raw vs raw", lambda: (ak_python(), raw()), raw, ctx)
            row(f"{tag} {name}: attnkit Python (op stubbed) vs nothing", ak_python, lambda: None, ctx)
        if name == "sdpa":
            row(f"{tag} sdpa: F.sdpa with attnkit's kwargs vs raw", lambda: S._scaled_dot_product(q, k, v, None, True, None), raw)
        else:
            toggles = S._SWITCHES[1][name]
            row(f"{tag} {name}: flags + F.sdpa vs raw", lambda: S._with_flags(toggles, q, k, v, None, True, None), raw, ctx)
            if kernel in S._KERNEL_OPS:
                op = S._KERNEL_OPS[kernel][0]
                row(f"{tag} {name}: kernel op vs raw", lambda: op(q, k, v, grad, True, None), raw, ctx)
# host Python speed yardstick
t = []
for _ in range(7):
    s = clock(); x = 0
    for i in range(10000): x += i
    t.append((clock() - s) / 1e3)
rows.append({"row": "pure-python 10000-add loop us (least of 7)", "value": min(t)})
json.dump({"calls": args.calls, "rows": rows}, open(args.out, "w"), indent=1)

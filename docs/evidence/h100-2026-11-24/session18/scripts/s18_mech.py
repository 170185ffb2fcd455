"""Why attnkit's forward+backward extra over raw SDPA is larger than its forward extra on the
H100 host (issue 11). B1 H8 N128 D64 bf16 causal. Call by call, A B / B A alternating, each
call's forward and backward timed apart; device synchronised every 32 pairs (untimed).

    PYTHONPATH=src python scratch/s18_mech.py --out mech.json
"""
import argparse, json, time, contextlib
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attnkit
from attnkit import attention
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser(); ap.add_argument("--out", required=True); ap.add_argument("--calls", type=int, default=2000)
args = ap.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if dev.type == "cpu": torch.cuda.synchronize = lambda *a: None
gen = torch.Generator(device=dev).manual_seed(0)
def mk(bwd, shape=(1, 8, 128, 64)):
    q, k, v = (torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_(bwd) for _ in range(3))
    g = torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=gen)
    return q, k, v, g
clock = time.perf_counter_ns

def spin(us):
    end = clock() + int(us * 1000)
    while clock() < end:
        pass

raw = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
def ak(name):
    return lambda q, k, v: attention(q, k, v, causal=True, backend=name)

def step(fn, q, k, v, g, pre=None, mid=None):
    """One call: (fwd ns, bwd ns); `pre` / `mid` run untimed before the forward / between."""
    def s():
        if pre: pre()
        t0 = clock(); out = fn(q, k, v); t1 = clock()
        if g is None:
            return t1 - t0, 0
        if mid: mid()
        t2 = clock(); out.backward(g); t3 = clock()
        return t1 - t0, t3 - t2
    return s

def pair(a, b, n):
    ta = np.empty((n, 2)); tb = np.empty((n, 2))
    for _ in range(30): a(); b()
    torch.cuda.synchronize()
    for i in range(n):
        if (i + i // 32) % 2 == 0:
            ta[i] = a(); tb[i] = b()
        else:
            tb[i] = b(); ta[i] = a()
        if i % 32 == 31: torch.cuda.synchronize()
    torch.cuda.synchronize()
    return ta / 1e3, tb / 1e3

def summ(x):
    lo, hi = median_interval(x, confidence=0.95); return [round(float(np.median(x)), 2), round(lo, 2), round(hi, 2)]

results = []
def run(label, a, b, ctx=None, bwd=True):
    with (ctx() if ctx else contextlib.nullcontext()):
        ta, tb = pair(a, b, args.calls)
    r = {"row": label, "a_fwd": summ(ta[:, 0]), "b_fwd": summ(tb[:, 0]), "fwd_extra": summ(ta[:, 0] - tb[:, 0])}
    if bwd:
        r |= {"a_bwd": summ(ta[:, 1]), "b_bwd": summ(tb[:, 1]), "bwd_extra": summ(ta[:, 1] - tb[:, 1]),
              "total_extra": summ(ta.sum(1) - tb.sum(1))}
    results.append(r); print(json.dumps(r), flush=True)

q, k, v, g = mk(True)
stubbed_attnkit = None
flash = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
eff = lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])
run("fb: A/A raw", step(raw, q, k, v, g), step(lambda *a: raw(*a), q, k, v, g))
run("fb: attnkit sdpa vs raw", step(ak("sdpa"), q, k, v, g), step(raw, q, k, v, g))
run("fb: attnkit sdpa-efficient vs raw-efficient", step(ak("sdpa-efficient"), q, k, v, g), step(raw, q, k, v, g), eff)
run("fb: attnkit sdpa-flash vs raw-flash", step(ak("sdpa-flash"), q, k, v, g), step(raw, q, k, v, g), flash)
for us in (3, 10, 30):
    run(f"fb: raw with untimed {us} us spin before fwd vs raw", step(raw, q, k, v, g, pre=lambda us=us: spin(us)), step(raw, q, k, v, g))
run("fb: raw with untimed 10 us spin between fwd and bwd vs raw", step(raw, q, k, v, g, mid=lambda: spin(10)), step(raw, q, k, v, g))
run("fb: raw with timed 10 us spin in fwd vs raw", step(lambda *a: (spin(10), raw(*a))[1], q, k, v, g), step(raw, q, k, v, g))
with torch.autograd.set_multithreading_enabled(False):
    run("fb (autograd multithreading off): A/A raw", step(raw, q, k, v, g), step(lambda *a: raw(*a), q, k, v, g))
    run("fb (autograd multithreading off): attnkit sdpa vs raw", step(ak("sdpa"), q, k, v, g), step(raw, q, k, v, g))
    run("fb (autograd multithreading off): raw with untimed 10 us spin before fwd vs raw", step(raw, q, k, v, g, pre=lambda: spin(10)), step(raw, q, k, v, g))
q0, k0, v0, _ = mk(False)
run("f: A/A raw", step(raw, q0, k0, v0, None), step(lambda *a: raw(*a), q0, k0, v0, None), bwd=False)
run("f: attnkit sdpa vs raw", step(ak("sdpa"), q0, k0, v0, None), step(raw, q0, k0, v0, None), bwd=False)
for us in (3, 10, 30):
    run(f"f: raw with untimed {us} us spin before vs raw", step(raw, q0, k0, v0, None, pre=lambda us=us: spin(us)), step(raw, q0, k0, v0, None), bwd=False)
run("f: raw with timed 3 us spin vs raw", step(lambda *a: (spin(3), raw(*a))[1], q0, k0, v0, None), step(raw, q0, k0, v0, None), bwd=False)
# host Python speed yardstick
t = []
for _ in range(7):
    s = clock(); spin(0); x = 0
    for i in range(10000): x += i
    t.append((clock() - s) / 1e3)
results.append({"row": "pure-python 10000-add loop us (least of 7)", "value": min(t)})
json.dump({"calls": args.calls, "rows": results}, open(args.out, "w"), indent=1)

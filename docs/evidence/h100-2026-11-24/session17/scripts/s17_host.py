"""Where attnkit's per-call host time goes on a GPU host, and how well two ways of pairing
measure it (issue 11). B1 H8 N128 D64 bf16 causal.

    PYTHONPATH=src:tools python scratch/s17_host.py --out host.json

1. Each per_call_cost.py target pair (and an A/A control: raw SDPA against itself), fwd and
   fwd+bwd, measured two ways: loops of 200 calls alternating A B B A (per_call_cost._paired),
   and calls alternating one by one (A B, then B A), each call timed alone.
2. Decomposition, loops of 2000 calls (least and median of 7): the Triton forward whole, with
   its launches stubbed, its launch object alone, Triton's compiled launcher alone, two
   torch.empty; sdpa-math whole, its op alone, attnkit around a stubbed op.
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

import sys

sys.path.insert(0, "tools")
import attnkit
import per_call_cost as pcc
from attnkit import attention
from attnkit_perf.decide.stats import median_interval

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--calls", type=int, default=3000)
args = ap.parse_args()
dev = torch.device("cuda")
SIZE = "B1-H8-N128-D64"
result = {"pairs": [], "decomposition": {}}


def interleaved(a, b, n):
    pc = time.perf_counter_ns
    da, db = np.empty(n), np.empty(n)
    for _ in range(50):
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


def summary(diff):
    low, high = median_interval(diff, confidence=0.95)
    return {"median": float(np.median(diff)), "low": low, "high": high, "mean_trim10": float(np.mean(np.sort(diff)[len(diff) // 10 : -len(diff) // 10]))}


class Null:
    def __enter__(self):
        return None

    def __exit__(self, *e):
        return False


def pair_both_ways(a_name, b_name, backward):
    b_, hq, hkv, n, m, d = pcc.SIZES[SIZE]
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_(backward) for s in ((b_, hq, n, d), (b_, hkv, m, d), (b_, hkv, m, d)))
    grad = torch.randn(b_, hq, n, d, device=dev, dtype=torch.bfloat16, generator=gen) if backward else None
    paths = pcc._paths(SIZE, dev)
    paths["raw-sdpa-gqa"] = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), None)
    fa, ctx_a = paths[a_name]
    fb, ctx_b = paths[b_name]
    sa, sb = pcc._step(fa, q, k, v, grad), pcc._step(fb, q, k, v, grad)
    if a_name == b_name:
        sb = pcc._step(lambda q, k, v: fb(q, k, v), q, k, v, grad)
    ctx = ctx_b or ctx_a
    with ctx() if ctx else Null():
        for _ in range(20):
            sa(), sb()
        n_calls = args.calls if not backward else args.calls // 3
        ia, ib = interleaved(sa, sb, n_calls)
    loop = pcc._paired((sa, ctx_a), (sb, ctx_b), 200 if not backward else 60, 12, dev)
    row = {
        "a": a_name, "b": b_name, "pass": "fwd+bwd" if backward else "fwd",
        "interleaved": {"a_median": float(np.median(ia)), "b_median": float(np.median(ib)), "extra": summary(ia - ib), "ratio": summary(ia / ib)},
        "loops": {"a_median": float(np.median(loop["path_us"])), "b_median": float(np.median(loop["raw_us"])), "extra": loop["extra_us"], "ratio": loop["ratio"]},
    }
    e, l_ = row["interleaved"]["extra"], row["loops"]["extra"]
    print(f"{row['pass']:8s} {a_name:14s} - {b_name:14s} interleaved {row['interleaved']['a_median']:7.1f} vs {row['interleaved']['b_median']:7.1f}: "
          f"{e['median']:+6.1f} [{e['low']:+6.1f}, {e['high']:+6.1f}] (trim mean {e['mean_trim10']:+6.1f}) | loops {row['loops']['a_median']:7.1f} vs {row['loops']['b_median']:7.1f}: "
          f"{l_['median']:+6.1f} [{l_['low']:+6.1f}, {l_['high']:+6.1f}]", flush=True)
    result["pairs"].append(row)


PAIRS = [("raw-sdpa", "raw-sdpa"), ("sdpa", "raw-sdpa"), ("sdpa-flash", "raw-flash"), ("sdpa-efficient", "raw-efficient"),
         ("sdpa-cudnn", "raw-cudnn"), ("sdpa-math", "raw-math"), ("triton", "raw-sdpa"), ("raw-sdpa-gqa", "raw-sdpa")]
for backward in (False, True):
    for a_name, b_name in PAIRS:
        pair_both_ways(a_name, b_name, backward)


def loops(fn, calls=2000, rounds=7):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return {"least": min(out), "median": float(np.median(out))}


def record(name, fn):
    result["decomposition"][name] = r = loops(fn)
    print(f"{name:40s} least {r['least']:7.2f}  median {r['median']:7.2f} us", flush=True)


gen = torch.Generator(device=dev).manual_seed(1)
q, k, v = (torch.randn(1, 8, 128, 64, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
with torch.no_grad():
    record("raw sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    record("triton whole", lambda: attention(q, k, v, causal=True, backend="triton"))
    from attnkit.inputs import check_inputs
    from attnkit.triton import fast_launch
    from attnkit.triton.launch import KernelLaunch, launch_setup

    problem = check_inputs(q, k, v, True, None)
    setup = launch_setup(problem)
    out = torch.empty(1, 8, 128, 64, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(1, 8, 128, device=dev, dtype=torch.float32)
    fwd_args = (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *setup.sizes, abs(setup.qk_scale))
    launch = setup.launches["fwd"]
    record("triton KernelLaunch alone", lambda: launch(setup.fwd_grid, *fwd_args))
    entry = next(iter(launch._entries.values()))
    stream = fast_launch._runtime.current_stream(0)
    raw_args = (setup.fwd_grid[0], 1, 1, stream, entry.function, entry.packed_metadata, None, None, None, *fwd_args, *entry.constexprs)
    record("triton compiled launcher alone", lambda: entry.launcher(*raw_args))
    record("torch.empty x2", lambda: (torch.empty(1, 8, 128, 64, device=dev, dtype=torch.bfloat16), torch.empty(1, 8, 128, device=dev, dtype=torch.float32)))
    record("current_stream + options + device", lambda: (fast_launch._runtime.current_stream(0), fast_launch._runtime.options(), fast_launch._runtime.current_device()))
    call = KernelLaunch.__call__
    KernelLaunch.__call__ = lambda self, grid, *a: None
    record("triton, launches stubbed", lambda: attention(q, k, v, causal=True, backend="triton"))
    KernelLaunch.__call__ = call
    record("sdpa-math whole", lambda: attention(q, k, v, causal=True, backend="sdpa-math"))
    record("math op alone", lambda: torch._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, None, scale=None, enable_gqa=True)[0])
    from torch.nn.attention import SDPBackend
    import attnkit.api
    import attnkit.sdpa

    saved = attnkit.sdpa._KERNEL_OPS[SDPBackend.MATH]
    attnkit.sdpa._KERNEL_OPS[SDPBackend.MATH] = (lambda q, k, v, *a: q, saved[1], saved[2])
    attnkit.api._PLANNED.clear()
    record("sdpa-math, op stubbed", lambda: attention(q, k, v, causal=True, backend="sdpa-math"))
    attnkit.sdpa._KERNEL_OPS[SDPBackend.MATH] = saved
    attnkit.api._PLANNED.clear()
    record("lambda returning q", lambda: q)
    record("sdpa-math whole (again)", lambda: attention(q, k, v, causal=True, backend="sdpa-math"))
    record("math op alone (again)", lambda: torch._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, None, scale=None, enable_gqa=True)[0])
json.dump(result, open(args.out, "w"), indent=1)

"""Why attnkit's sdpa-math costs ~20 us more per call than SDPA forced to math (issue 11).

    PYTHONPATH=src python scratch/s16_math_ops.py --out math_ops.json

B1 H8 N128 D64 bf16 causal forward, no grad. Paired wall time per call (loops of 300 calls,
A B B A, 8 pairs) of attnkit's call, SDPA forced to math, and the math op called directly with
and without enable_gqa; then the ATen ops each issues (torch.profiler, CPU) side by side.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnkit

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="math_ops.json")
args = ap.parse_args()
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
paths = {
    "attnkit": lambda: attnkit.attention(q, k, v, causal=True, backend="sdpa-math"),
    "raw-math": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "op-gqa": lambda: torch._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, None, scale=None, enable_gqa=True)[0],
    "op": lambda: torch._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, None)[0],
}


def loop(fn, calls=300):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


result = {"per_call_us": {}, "ops": {}}
with torch.no_grad():
    for name, fn in paths.items():
        if name == "raw-math":
            with sdpa_kernel(SDPBackend.MATH):
                loop(fn, 50)
        else:
            loop(fn, 50)
    samples = {name: [] for name in paths}
    for i in range(8):
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        for name in order:
            if name == "raw-math":
                with sdpa_kernel(SDPBackend.MATH):
                    samples[name].append(loop(paths[name]))
            else:
                samples[name].append(loop(paths[name]))
    for name, s in samples.items():
        result["per_call_us"][name] = sorted(s)
        print(f"{name:10s} median {sorted(s)[len(s) // 2]:.1f} us/call  {['%.1f' % x for x in s]}")
    for name, fn in paths.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            if name == "raw-math":
                with sdpa_kernel(SDPBackend.MATH):
                    for _ in range(20):
                        fn()
            else:
                for _ in range(20):
                    fn()
            torch.cuda.synchronize()
        rows = {e.key: (e.count, round(e.self_cpu_time_total / 20, 2)) for e in prof.key_averages()}
        result["ops"][name] = rows
        print(f"== {name}")
        for key, (count, self_us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            print(f"   {key:60s} calls/iter {count / 20:5.1f}  self us/iter {self_us:7.2f}")
json.dump(result, open(args.out, "w"), indent=1)

"""Triton backward at short lengths, streamed tensors through TMA descriptors vs pointers:
GPU time (median_time_s: flushed L2, CUDA events) and wall time per call in a loop of 300
back-to-back calls (max of host and GPU time), same run, alternating.
    python scratch/s11_bwd_small.py --out bwd_small.json
"""
import argparse, json, time, torch
from attnkit.inputs import check_inputs
from attnkit.triton.launch import LaunchSetup, attention_backward, attention_forward
from attnkit_perf.machine import provenance
from attnkit_perf.measure.timing import median_time_s

p = argparse.ArgumentParser(); p.add_argument("--out", required=True); a = p.parse_args()
dev = torch.device("cuda"); rows = []

def wall_us(fn, calls=300):
    fn(); torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(calls): fn()
    torch.cuda.synchronize(); return 1e6 * (time.perf_counter() - t0) / calls

for b, n in ((4, 1024), (16, 1024), (4, 2048)):
    for d in (64, 128):
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(b, 2048 // d, n, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            setup = LaunchSetup.build(check_inputs(q, k, v, causal, None))
            out, lse = attention_forward(q, k, v, setup)
            fns = {t: (lambda t=t: attention_backward(do, q, k, v, out, lse, setup, t)) for t in (False, True)}
            gpu, wall = {False: [], True: []}, {False: [], True: []}
            for rep in range(4):
                for t in ((False, True) if rep % 2 == 0 else (True, False)):
                    gpu[t].append(1e6 * median_time_s(fns[t], dev, budget_s=0.05))
                    wall[t].append(wall_us(fns[t]))
            med = lambda xs: sorted(xs)[len(xs) // 2]
            row = dict(b=b, n=n, d=d, causal=causal, gpu_us_ptr=round(med(gpu[False]), 1), gpu_us_tma=round(med(gpu[True]), 1),
                       wall_us_ptr=round(med(wall[False]), 1), wall_us_tma=round(med(wall[True]), 1))
            print(json.dumps(row), flush=True); rows.append(row)
json.dump({"provenance": provenance(dev), "rows": rows}, open(a.out, "w"), indent=1)

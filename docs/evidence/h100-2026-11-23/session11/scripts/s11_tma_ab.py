"""Backward passes with the streamed tensors through TMA descriptors vs pointers, same run,
same configs (the committed table), alternating, flushed L2 (the gate's median_time_s).
    python scratch/s11_tma_ab.py --out ab.json
"""
import argparse, json, torch
from attnkit.inputs import check_inputs
from attnkit.triton.launch import LaunchSetup, attention_forward, bwd_dkdv, bwd_dq, bwd_preprocess
from attnkit_perf.machine import provenance
from attnkit_perf.measure.timing import median_time_s

p = argparse.ArgumentParser(); p.add_argument("--out", required=True); a = p.parse_args()
dev = torch.device("cuda"); rows = []
for d in (64, 128):
    for causal in (False, True):
        for n in (4096, 16384):
            b = 4 if n == 4096 else 1
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(b, 2048 // d, n, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            setup = LaunchSetup.build(check_inputs(q, k, v, causal, None))
            out, lse = attention_forward(q, k, v, setup)
            delta = bwd_preprocess(setup, out, do)
            fns = {
                ("dkdv", False): lambda: bwd_dkdv(setup, q, k, v, do, lse, delta, False),
                ("dkdv", True): lambda: bwd_dkdv(setup, q, k, v, do, lse, delta, True),
                ("dq", False): lambda: bwd_dq(setup, q, k, v, do, lse, delta, False),
                ("dq", True): lambda: bwd_dq(setup, q, k, v, do, lse, delta, True),
            }
            for f in fns.values(): f()
            same = [torch.equal(fns[(kn, False)]()[0] if kn == "dkdv" else fns[(kn, False)](),
                                fns[(kn, True)]()[0] if kn == "dkdv" else fns[(kn, True)]()) for kn in ("dkdv", "dq")]
            times = {key: [] for key in fns}
            for rep in range(6):
                order = list(fns) if rep % 2 == 0 else list(reversed(list(fns)))
                for key in order:
                    times[key].append(median_time_s(fns[key], dev, budget_s=0.05))
            med = {f"{kn}-{'tma' if t else 'ptr'}_ms": round(1e3 * sorted(v)[len(v) // 2], 4) for (kn, t), v in times.items()}
            row = dict(d=d, causal=causal, n=n, b=b, config=setup.config.as_dict(), bitwise_equal=same, **med)
            for kn in ("dkdv", "dq"):
                row[f"{kn}_ptr_over_tma"] = round(med[f"{kn}-ptr_ms"] / med[f"{kn}-tma_ms"], 3)
            print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
            rows.append(row)
json.dump({"provenance": provenance(dev), "rows": rows}, open(a.out, "w"), indent=1)

"""Why forced sdpa-math costs ~20 us more host time than raw SDPA with MATH forced, on a GPU:
the ops each dispatches (profiler) and host time per call of attnkit, raw SDPA and the op."""
import argparse, json, time
from collections import Counter
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import attnkit
parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
calls = {
    "attnkit": lambda: attnkit.attention(q, k, v, causal=True, backend="sdpa-math"),
    "raw": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "op": lambda: torch._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, None, scale=None, enable_gqa=True)[0],
}
res = {"host_us": {n: [] for n in calls}, "ops": {}}
with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
    for fn in calls.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    for _ in range(7):
        for name, fn in calls.items():
            t = time.perf_counter()
            for _ in range(300):
                fn()
            res["host_us"][name].append((time.perf_counter() - t) / 300 * 1e6)
            torch.cuda.synchronize()
    for name, fn in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        res["ops"][name] = {e.key: [e.count, round(e.cpu_time_total / 10, 2)] for e in prof.key_averages()}
for name in calls:
    print(name, "host us", round(min(res["host_us"][name]), 1))
    for key, (count, us) in sorted(res["ops"][name].items(), key=lambda x: -x[1][1])[:25]:
        print(f"   {key[:70]:70s} {count:5d} {us:8.1f}")
json.dump(res, open(args.out, "w"), indent=1)

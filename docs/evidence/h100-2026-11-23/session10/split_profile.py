"""Host and device time of the cuDNN split's pieces at B4 Hq32 Hkv8 N16 M16384 D128 bf16."""
import argparse, json, time
import torch
from triton.testing import do_bench
from attnkit import attention
from attnkit.inputs import check_inputs
from attnkit import sdpa_split_causal as sc, sdpa_lower_right as lr
from attnkit.triton.decode import merge_pair
from torch.backends.cuda import can_use_cudnn_attention

p = argparse.ArgumentParser(); p.add_argument("--out"); a = p.parse_args()
torch.manual_seed(0)
B, HQ, HKV, N, M, D = 4, 32, 8, 16, 16384, 128
q = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, HKV, M, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(B, HKV, M, D, device="cuda", dtype=torch.bfloat16)
prob = check_inputs(q, k, v, True, None)
P = M - N
o1, l1, _ = sc.CUDNN.forward(q, k[:, :, :P], v[:, :, :P], False, prob.scale)
o2, l2, _ = sc.CUDNN.forward(q, k[:, :, P:], v[:, :, P:], True, prob.scale)
params = lr._params(q, k[:, :, :P], v[:, :, :P], prob, False)
pieces = {
    "attention causal (split)": lambda: attention(q, k, v, causal=True, backend="sdpa-cudnn"),
    "attention non-causal": lambda: attention(q, k, v, causal=False, backend="sdpa-cudnn"),
    "split only (no admission)": lambda: sc.split_causal_attention(sc.CUDNN, q, k, v, prob),
    "cudnn op prefix": lambda: sc.CUDNN.forward(q, k[:, :, :P], v[:, :, :P], False, prob.scale),
    "cudnn op square": lambda: sc.CUDNN.forward(q, k[:, :, P:], v[:, :, P:], True, prob.scale),
    "cudnn op full non-causal": lambda: sc.CUDNN.forward(q, k, v, False, prob.scale),
    "merge_pair (triton)": lambda: merge_pair(o1, l1, o2, l2),
    "merge (torch ops)": lambda: sc.merge(o1, l1, o2, l2),
    "admission check": lambda: can_use_cudnn_attention(params, False),
    "SDPAParams": lambda: lr._params(q, k[:, :, :P], v[:, :, :P], prob, False),
}
rows = {}
for name, fn in pieces.items():
    for _ in range(20): fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(200):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); host.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    host.sort()
    dev = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
    # back-to-back (queue kept full): time per call of 50 calls issued without a sync
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(50): fn()
    torch.cuda.synchronize(); b2b = (time.perf_counter() - t) / 50
    rows[name] = {"host_us": host[100] * 1e6, "do_bench_us": dev, "back_to_back_us": b2b * 1e6}
    print(f"{name:30s} host {host[100]*1e6:8.1f} us  do_bench {dev:8.1f} us  back-to-back {b2b*1e6:8.1f} us", flush=True)
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
with prof:
    for _ in range(10): pieces["attention causal (split)"]()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
if a.out: json.dump(rows, open(a.out, "w"), indent=1)

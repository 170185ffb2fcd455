"""Hot CPU cost of the SDPA prepared runs' Python, CUDA branches forced."""
import dataclasses, time, torch
import torch.nn.functional as F
import attnkit.sdpa as S
from attnkit.inputs import check_inputs
q = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16, requires_grad=True)
stub = "".format  # a C function taking any arguments, as SDPA is
F.scaled_dot_product_attention = stub
def t(fn, n=100000, r=9):
    best = []
    for _ in range(r):
        s = time.perf_counter_ns()
        for _ in range(n): fn()
        best.append((time.perf_counter_ns() - s) / n)
    return min(best)
problem = dataclasses.replace(check_inputs(q, k, v, True, None, None), device=torch.device("cuda"))
base = t(lambda: stub(q, k, v, is_causal=True))
for name in ("sdpa", "sdpa-flash"):
    run = S.sdpa_prepare(name, problem)
    S._ACCEPTED.add((name, problem, True, name))
    run(q, k, v, problem); run(q, k, v, problem)
    print(name, f"{t(lambda: run(q, k, v, problem)) - base:.0f} ns over the stubbed call")

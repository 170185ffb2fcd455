import time, torch, statistics
import torch.nn.functional as F
import attnkit
from attnkit import attention, sdpa as S
q = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16)
k = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16)
v = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16)
stub = lambda *a, **kw: q
def t(fn, n=20000, r=7):
    best = []
    for _ in range(r):
        s = time.perf_counter_ns()
        for _ in range(n): fn()
        best.append((time.perf_counter_ns() - s) / n)
    return min(best)
real = F.scaled_dot_product_attention
F.scaled_dot_product_attention = stub
for b in ["sdpa", "sdpa-flash", "sdpa-math"]:
    attention(q, k, v, causal=True, backend=b); attention(q, k, v, causal=True, backend=b)
    print(b, "attnkit stubbed ns", t(lambda: attention(q, k, v, causal=True, backend=b)))
print("stub alone", t(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
print("is_compiling", t(lambda: torch.compiler.is_compiling()))
print("key", t(lambda: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa")))
print("q.device", t(lambda: q.device))
print("q.shape", t(lambda: q.shape))
print("q.get_device", t(lambda: q.get_device()))
print("grad state", t(lambda: torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))
print("deterministic", t(lambda: torch.are_deterministic_algorithms_enabled()))
print("strides", t(lambda: (q.stride(), k.stride(), v.stride())))
print("ptrs", t(lambda: (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16))

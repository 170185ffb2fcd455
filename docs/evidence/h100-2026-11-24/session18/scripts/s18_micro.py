import time, torch
q = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16); k = q.clone(); v = q.clone()
def t(fn, n=200000, r=7):
    best = []
    for _ in range(r):
        s = time.perf_counter_ns()
        for _ in range(n): fn()
        best.append((time.perf_counter_ns() - s) / n)
    return round(min(best), 1)
key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa")
d = {key: 1}
print("empty lambda", t(lambda: None))
print("build key", t(lambda: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa")))
print("hash key (prebuilt)", t(lambda: hash(key)))
print("d.get(key prebuilt)", t(lambda: d.get(key)))
print("3 shapes", t(lambda: (q.shape, k.shape, v.shape)))
print("3 dtypes", t(lambda: (q.dtype, k.dtype, v.dtype)))
print("3 devices", t(lambda: (q.device, k.device, v.device)))
print("3 size()", t(lambda: (q.size(), k.size(), v.size())))
print("3 strides", t(lambda: (q.stride(), k.stride(), v.stride())))
print("3 data_ptr", t(lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr())))
print("3 is_contiguous", t(lambda: (q.is_contiguous(), k.is_contiguous(), v.is_contiguous())))
print("3 requires_grad", t(lambda: (q.requires_grad, k.requires_grad, v.requires_grad)))
print("is_grad_enabled", t(lambda: torch.is_grad_enabled()))
ige = torch.is_grad_enabled
print("is_grad_enabled (local)", t(lambda: ige()))
print("torch._C._get_tracing_state", t(lambda: torch._C._get_tracing_state()))
print("3 isinstance", t(lambda: (isinstance(q, torch.Tensor), isinstance(k, torch.Tensor), isinstance(v, torch.Tensor))))
T = torch.Tensor
print("3 isinstance local", t(lambda: (isinstance(q, T), isinstance(k, T), isinstance(v, T))))
print("is_compiling", t(lambda: torch.compiler.is_compiling()))
ic = torch.compiler.is_compiling
print("is_compiling local", t(lambda: ic()))
print("q.is_cuda", t(lambda: q.is_cuda))
print("q.get_device x3", t(lambda: (q.get_device(), k.get_device(), v.get_device())))

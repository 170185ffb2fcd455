"""Paired host cost of memo-key forms before raw SDPA."""
import argparse, json, sys
import numpy as np, torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
import per_call_cost as pc
ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--calls", type=int, default=3000)
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--shape", default="1,8,128,64"); ap.add_argument("--grad", default="0,1")
a = ap.parse_args(); dev = torch.device(a.device); B, H, N, D = map(int, a.shape.split(","))
sdpa = F.scaled_dot_product_attention
def mk(keyfn):
    memo = {}
    def f(q, k, v):
        key = keyfn(q, k, v)
        p = memo.get(key)
        if p is None:
            memo[key] = p = True
        return sdpa(q, k, v, is_causal=p)
    return f
from operator import attrgetter
ag = attrgetter("shape", "dtype", "device")
KEYS = {
 "attrget": lambda q, k, v: (ag(q), ag(k), ag(v), True, None, None, "sdpa"),
 "k13": lambda q, k, v: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa"),
 "no-dev": lambda q, k, v: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, True, None, None, "sdpa"),
 "getdev": lambda q, k, v: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(), True, None, None, "sdpa"),
 "shapes": lambda q, k, v: (q.shape, k.shape, v.shape),
 "qdev": lambda q, k, v: (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, True, None, None, "sdpa"),
 "k13+str": lambda q, k, v: (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, True, None, None, "sdpa"),
}
res = []
for grad in map(int, a.grad.split(",")):
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_(bool(grad)) for _ in range(3))
    go = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) if grad else None
    raw = pc._step(lambda q, k, v: sdpa(q, k, v, is_causal=True), q, k, v, go)
    for name, kf in {"A/A": None, **KEYS}.items():
        step = raw if kf is None else pc._step(mk(kf), q, k, v, go)
        x, y = pc._interleaved(step, raw, a.calls, dev); d = x - y
        lo, hi = pc.median_interval(d, confidence=0.95)
        res.append(dict(grad=grad, key=name, extra=float(np.median(d)), lo=lo, hi=hi, raw=float(np.median(y))))
        print(f"grad={grad} {name:8} {np.median(d):+6.2f} [{lo:+.2f},{hi:+.2f}] raw {np.median(y):.1f}", flush=True)
if a.out: json.dump(res, open(a.out, "w"), indent=1)

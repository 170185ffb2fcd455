"""Session 21 (scratch): the Triton path's host time per forward call (no gradients), through the
compiled memo's native launches and through the Python memo alone, each paired call by call with raw
SDPA (default kernel choice), and the two paired with each other."""
import argparse, json, sys, types
import numpy as np, torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
import per_call_cost as pc
import attnkit.api as api
from attnkit import fast_calls

ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--calls", type=int, default=3000)
ap.add_argument("--sizes", default="B1-H1-N8-D16,B1-H8-N128-D64,B4-H16-N1024-D128,B8-Hq32-Hkv8-N1-M4096-D128")
a = ap.parse_args(); dev = torch.device("cuda")
print("fast calls:", fast_calls.status, flush=True)
compiled = api.attention
python_only = types.FunctionType(api.attention.__code__, {**api.__dict__, "_compiled_memo": None}, "attention",
                                 api.attention.__defaults__, api.attention.__closure__)
python_only.__kwdefaults__ = api.attention.__kwdefaults__
res = []
for size in a.sizes.split(","):
    b, hq, hkv, n, m, d = pc.SIZES[size]
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g) for s in ((b, hq, n, d), (b, hkv, m, d), (b, hkv, m, d)))
    raw = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=n == m, enable_gqa=hq != hkv)
    comp = lambda: compiled(q, k, v, causal=True, backend="triton")
    pyth = lambda: python_only(q, k, v, causal=True, backend="triton")
    same = torch.equal(comp(), pyth())
    for pair, (x, y) in {"native-raw": (comp, raw), "python-raw": (pyth, raw), "native-python": (comp, pyth)}.items():
        t1, t2 = pc._interleaved(x, y, a.calls, dev)
        dd = t1 - t2; lo, hi = pc.median_interval(dd, confidence=0.95)
        r = dict(size=size, pair=pair, extra=float(np.median(dd)), lo=lo, hi=hi, a=float(np.median(t1)),
                 b=float(np.median(t2)), ratio=float(np.median(t1) / np.median(t2)), bitwise_equal=same)
        res.append(r)
        print(f"{size:28} {pair:14} {r['extra']:+7.2f} [{lo:+.2f},{hi:+.2f}]  {r['a']:.1f} vs {r['b']:.1f} us  x{r['ratio']:.2f}  equal={same}", flush=True)
if a.out: json.dump(res, open(a.out, "w"), indent=1)

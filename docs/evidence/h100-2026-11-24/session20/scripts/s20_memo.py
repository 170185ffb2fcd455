"""Session 20 (scratch): attnkit's SDPA paths through the compiled memo and through the Python memo
alone, each paired call by call with raw SDPA (the same kernel forced outside the loop), and the two
paired with each other. The Python-memo side is attention() itself with _compiled_memo None in its
globals (a copy of the function object: no per-call toggle)."""
import argparse, json, sys, types
import numpy as np, torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
import per_call_cost as pc
import attnkit.api as api
from attnkit import fast_calls
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--calls", type=int, default=3000)
ap.add_argument("--sizes", default="B1-H8-N128-D64,B4-H16-N1024-D128,B8-Hq32-Hkv8-N1-M4096-D128")
ap.add_argument("--paths", default="sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,sdpa-math")
a = ap.parse_args(); dev = torch.device("cuda")
print("fast calls:", fast_calls.status, flush=True)
compiled = api.attention
python_only = types.FunctionType(api.attention.__code__, {**api.__dict__, "_compiled_memo": None}, "attention",
                                 api.attention.__defaults__, api.attention.__closure__)
python_only.__kwdefaults__ = api.attention.__kwdefaults__
KERNEL = {"sdpa": None, "sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
          "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-math": SDPBackend.MATH}
res = []
for size in a.sizes.split(","):
    b, hq, hkv, n, m, d = pc.SIZES[size]
    for grad in ([0] if size in pc.FORWARD_ONLY else [0, 1]):
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_(bool(grad))
                   for s in ((b, hq, n, d), (b, hkv, m, d), (b, hkv, m, d)))
        go = torch.randn(b, hq, n, d, device=dev, dtype=torch.bfloat16, generator=g) if grad else None
        raw = pc._step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=n == m, enable_gqa=hq != hkv), q, k, v, go)
        for path in a.paths.split(","):
            kernel = KERNEL[path]
            comp = pc._step(lambda q, k, v: compiled(q, k, v, causal=True, backend=path), q, k, v, go)
            pyth = pc._step(lambda q, k, v: python_only(q, k, v, causal=True, backend=path), q, k, v, go)
            for pair, (x, y) in {"compiled-raw": (comp, raw), "python-raw": (pyth, raw), "compiled-python": (comp, pyth)}.items():
                try:
                    with sdpa_kernel([kernel]) if kernel is not None else pc._null():
                        for _ in range(20): x(); y()
                        t1, t2 = pc._interleaved(x, y, a.calls, dev)
                except RuntimeError as err:
                    print(size, grad, path, pair, "error", str(err).splitlines()[0][:100], flush=True); break
                dd = t1 - t2; lo, hi = pc.median_interval(dd, confidence=0.95)
                r = dict(size=size, grad=grad, path=path, pair=pair, extra=float(np.median(dd)), lo=lo, hi=hi,
                         a=float(np.median(t1)), b=float(np.median(t2)))
                res.append(r)
                print(f"{size:28} grad={grad} {path:15} {pair:16} {r['extra']:+7.2f} [{lo:+.2f},{hi:+.2f}]  {r['a']:.1f} vs {r['b']:.1f}", flush=True)
if a.out: json.dump(res, open(a.out, "w"), indent=1)

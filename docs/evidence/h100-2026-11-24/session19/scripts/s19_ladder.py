"""Ladder of cumulative Python layers before SDPA, each paired call by call with raw SDPA.
Which rung costs what on this host, with and without gradients."""
import argparse, json, sys
import numpy as np, torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
import per_call_cost as pc
from attnkit import attention
from attnkit import sdpa as S
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--calls", type=int, default=3000)
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--shapes", default="1,8,128,64"); ap.add_argument("--grad", default="0,1")
a = ap.parse_args(); dev = torch.device(a.device)
_T = torch.Tensor
_isc = torch.compiler.is_compiling
sdpa = F.scaled_dot_product_attention

def rungs():
    memo = {}
    passed = [None]
    def wrapper(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        return sdpa(q, k, v, is_causal=causal)
    def kw_full(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        return sdpa(q, k, v, attn_mask=None, is_causal=causal, scale=None, enable_gqa=True)
    def kw_gqa(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        return sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    def checks(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        if _isc(): raise RuntimeError
        if isinstance(q, _T) and isinstance(k, _T) and isinstance(v, _T) and type(causal) is bool and scale is None and window is None and type(backend) is str:
            pass
        return sdpa(q, k, v, is_causal=causal)
    def key(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        if _isc(): raise RuntimeError
        if isinstance(q, _T) and isinstance(k, _T) and isinstance(v, _T) and type(causal) is bool and scale is None and window is None and type(backend) is str:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, window, backend)
            p = memo.get(key)
        if p is None:
            memo[key] = p = (None, causal)
        return sdpa(q, k, v, is_causal=p[1])
    def make_run(is_causal):
        def run(q, k, v, problem):
            return sdpa(q, k, v, is_causal=is_causal)
        return run
    memo2 = {}
    def key_closure(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        if _isc(): raise RuntimeError
        if isinstance(q, _T) and isinstance(k, _T) and isinstance(v, _T) and type(causal) is bool and scale is None and window is None and type(backend) is str:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, window, backend)
            p = memo2.get(key)
        if p is None:
            memo2[key] = p = (None, make_run(causal))
        problem, run = p
        return run(q, k, v, problem)
    def make_lean(is_causal):
        def run(q, k, v, problem):
            strides = (q.stride(), k.stride(), v.stride())
            if strides != passed[0] or (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15:
                passed[0] = strides
            return sdpa(q, k, v, is_causal=is_causal)
        return run
    memo3 = {}
    def lean(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        if _isc(): raise RuntimeError
        if isinstance(q, _T) and isinstance(k, _T) and isinstance(v, _T) and type(causal) is bool and scale is None and window is None and type(backend) is str:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, window, backend)
            p = memo3.get(key)
        if p is None:
            memo3[key] = p = (None, make_lean(causal))
        problem, run = p
        return run(q, k, v, problem)
    memo4 = {}
    def floor(q, k, v, *, causal=False, scale=None, window=None, backend="auto"):
        # the least a validating layer does: the signature, the layout and the pointers' alignment
        # in one key, one lookup, SDPA called with the plan's arguments
        if _isc(): raise RuntimeError
        if isinstance(q, _T) and isinstance(k, _T) and isinstance(v, _T) and type(causal) is bool and scale is None and window is None and type(backend) is str:
            key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, window, backend)
            p = memo4.get(key)
        if p is None:
            memo4[key] = p = (None, causal)
        return sdpa(q, k, v, is_causal=p[1])
    def attnkit_sdpa(q, k, v, **kw):
        return attention(q, k, v, **kw)
    return dict(wrapper=wrapper, kw_full=kw_full, kw_gqa=kw_gqa, checks=checks, key=key,
                key_closure=key_closure, lean=lean, floor=floor, attnkit=attnkit_sdpa)

res = []
for shape in a.shapes.split(";"):
    B, H, N, D = map(int, shape.split(","))
    for grad in map(int, a.grad.split(",")):
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_(bool(grad)) for _ in range(3))
        go = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) if grad else None
        raw = pc._step(lambda q, k, v: sdpa(q, k, v, is_causal=True), q, k, v, go)
        steps = {"A/A": raw}
        for name, fn in rungs().items():
            steps[name] = pc._step(lambda q, k, v, fn=fn: fn(q, k, v, causal=True, backend="sdpa"), q, k, v, go)
        # forced kernels: attnkit against the same kernel forced outside the loop
        forced = {}
        if dev.type == "cuda":
            forcer = S._FORCERS["sdpa-flash"]
            forced["flash"] = (SDPBackend.FLASH_ATTENTION, {
                "flags": lambda q, k, v: forcer(sdpa, q, k, v, None, 0.0, True),
                "attnkit": lambda q, k, v: attention(q, k, v, causal=True, backend="sdpa-flash")})
            forced["efficient"] = (SDPBackend.EFFICIENT_ATTENTION, {
                "op": lambda q, k, v: torch._scaled_dot_product_efficient_attention(q, k, v, None, bool(grad), 0.0, True)[0],
                "attnkit": lambda q, k, v: attention(q, k, v, causal=True, backend="sdpa-efficient")})
            forced["cudnn"] = (SDPBackend.CUDNN_ATTENTION, {
                "op": lambda q, k, v: torch._scaled_dot_product_cudnn_attention(q, k, v, None, bool(grad), 0.0, True, False)[0],
                "attnkit": lambda q, k, v: attention(q, k, v, causal=True, backend="sdpa-cudnn")})
        plan = [(name, step, None) for name, step in steps.items()]
        for kname, (kernel, fns) in forced.items():
            plan.append((f"{kname}:A/A", None, kernel))
            for fname, fn in fns.items():
                plan.append((f"{kname}:{fname}", pc._step(fn, q, k, v, go), kernel))
        for name, step, kernel in plan:
            ctx = sdpa_kernel([kernel]) if kernel is not None else pc._null()
            with ctx:
                base = raw
                if step is None:
                    step = raw
                for _ in range(20): step()
                x, y = pc._interleaved(step, base, a.calls, dev); d = x - y
            lo, hi = pc.median_interval(d, confidence=0.95)
            r = dict(shape=shape, grad=grad, rung=name, extra=float(np.median(d)), lo=lo, hi=hi, raw=float(np.median(y)))
            res.append(r)
            print(f"{shape} grad={grad} {name:18} {r['extra']:+6.2f} [{lo:+.2f},{hi:+.2f}] raw {r['raw']:.1f}", flush=True)
if a.out: json.dump(res, open(a.out, "w"), indent=1)

"""Which sdpa-flash calls survive make_graphed_callables (forward + backward capture)."""
import argparse, json, math, traceback
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import attnkit, attnkit.sdpa as S
parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
def operands(n=64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, n, 64, generator=g).to("cuda", torch.bfloat16).requires_grad_() for _ in range(3)]
def flash_none(q, k, v, needs_grad, is_causal, scale):
    return torch._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=scale)[0]
def flash_explicit(q, k, v, needs_grad, is_causal, scale):
    return torch._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, scale=1.0 / math.sqrt(q.shape[-1]))[0]
def raw_forced(q, k, v):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
cases = {
    "raw F.sdpa forced flash": raw_forced,
    "direct op, scale explicit": lambda q, k, v: flash_explicit(q, k, v, True, True, None),
    "direct op, scale None": lambda q, k, v: flash_none(q, k, v, True, True, None),
    "attnkit sdpa-flash": lambda q, k, v: attnkit.attention(q, k, v, causal=True, backend="sdpa-flash"),
    "attnkit sdpa-cudnn": lambda q, k, v: attnkit.attention(q, k, v, causal=True, backend="sdpa-cudnn"),
}
res = {}
for rep in range(15):
    for name, fn in cases.items():
        try:
            g = torch.cuda.make_graphed_callables(fn, tuple(operands()))
            q, k, v = operands()
            out = g(q, k, v); out.sum().backward(); torch.cuda.synchronize()
            res[f"{rep} {name}"] = "ok"
        except Exception as e:
            res[f"{rep} {name}"] = f"{type(e).__name__}: {str(e)[:150]}"
            torch.cuda.synchronize()
        print(rep, name, res[f"{rep} {name}"], flush=True)
import collections
summary = collections.Counter((key.split(" ", 1)[1], val == "ok") for key, val in res.items())
print(sorted(summary.items()))
json.dump(res, open(args.out, "w"), indent=1)

"""Which tensor is non-finite in sdpa-cudnn, window (0,0), N=66 M=64 D=16 fp16 large (thorough profile)."""
import dataclasses, itertools, sys, torch, warnings
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "tests/correctness")
from strategies import Problem
from attnkit import attention
warnings.simplefilter("ignore")
dev = torch.device("cuda")
base = Problem(batch=1, q_heads=1, kv_heads=1, q_len=66, kv_len=64, head_dim=16, value_dim=16, causal=False,
               dtype=torch.float16, scale=None, q_layout="contiguous", kv_layout="contiguous", magnitude="large",
               seed=0, window=(0, 0))

def bad(x):
    nf = ~torch.isfinite(x)
    if not nf.any():
        return "ok"
    rows = nf.any(-1).flatten().nonzero().flatten().tolist()
    return f"{int(nf.sum())} nonfinite rows {rows[:8]}{'...' if len(rows) > 8 else ''} absmax-finite {x[~nf].abs().max().item() if (~nf).any() else 0:.3g}"

def via_attnkit(p, backend="sdpa-cudnn"):
    q, k, v, go = p.tensors(dev)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = attention(q, k, v, causal=p.causal, scale=p.scale, window=p.window, backend=backend)
    g = torch.autograd.grad(out, (q, k, v), go)
    return [bad(x) for x in (out, *g)]

print("== attnkit, the failing problem, 4 repeats")
for _ in range(4):
    print("sdpa-cudnn", via_attnkit(base), " efficient", via_attnkit(base, "sdpa-efficient"))

print("== raw cuDNN on the 64 visible rows: bool vs float mask, dO sliced vs contiguous, q sliced vs cloned")
for mask_kind, do_kind, q_kind in itertools.product(("bool", "float"), ("sliced", "contig"), ("sliced", "cloned")):
    q, k, v, go = base.tensors(dev)
    vis = torch.eye(64, dtype=torch.bool, device=dev)
    mask = vis if mask_kind == "bool" else torch.zeros(64, 64, dtype=torch.float16, device=dev).masked_fill(~vis, float("-inf"))
    qs = q[:, :, 2:]
    qs = (qs.clone() if q_kind == "cloned" else qs).detach().requires_grad_()
    k, v = k.detach().requires_grad_(), v.detach().requires_grad_()
    dO = go[:, :, 2:]
    dO = dO.clone() if do_kind == "contig" else dO
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask)
        g = torch.autograd.grad(out, (qs, k, v), dO)
        print(f"mask={mask_kind:5} dO={do_kind:6} q={q_kind:6}", [bad(x) for x in (out, *g)])
    except RuntimeError as e:
        print(f"mask={mask_kind:5} dO={do_kind:6} q={q_kind:6} error {str(e)[:100]}")

print("== attnkit sdpa-cudnn over variants (out, dq, dk, dv)")
for dtype, mag, left, qlen in itertools.product((torch.float16, torch.bfloat16), ("unit", "large"), (0, 1, 3), (64, 66)):
    p = dataclasses.replace(base, dtype=dtype, magnitude=mag, window=(left, 0), q_len=qlen)
    try:
        r = via_attnkit(p)
    except Exception as e:
        r = f"error {type(e).__name__}: {str(e)[:100]}"
    print(str(dtype)[6:], mag, "window", (left, 0), "N", qlen, r)

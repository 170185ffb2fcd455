"""Where the host time of a Triton backward goes: autograd.grad through attnkit against its
parts called directly (no autograd), each launch alone, the allocations, an autograd node that
does no work, and sdpa-cudnn / raw SDPA. Host time = issue loop without synchronisation, per
call; each variant's loop alternates with the others, 7 rounds, median."""
import argparse, json, statistics, time
import torch
import torch.nn.functional as F
import attnkit
from attnkit.inputs import check_inputs
from attnkit.triton.launch import (attention_backward, attention_forward, bwd_dkdv, bwd_dq,
                                   bwd_preprocess, launch_setup)

parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
dev = torch.device("cuda")

class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.clone()
    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        return g, None, None

def host_us(step, calls=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / calls

result = {}
for name, (b, h, n, d) in {"B1-H8-N128-D64": (1, 8, 128, 64), "B4-H16-N1024-D128": (4, 16, 1024, 128)}.items():
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, go = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
    problem = check_inputs(q, k, v, True, None)
    setup = launch_setup(problem)
    out, lse = attention_forward(q, k, v, setup)
    delta = bwd_preprocess(setup, out, go)
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o_tr = attnkit.attention(qg, kg, vg, causal=True, backend="triton")
    o_cu = attnkit.attention(qg, kg, vg, causal=True, backend="sdpa-cudnn")
    o_raw = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o_nothing = Nothing.apply(qg, kg, vg)
    variants = {
        "autograd triton": lambda: torch.autograd.grad(o_tr, (qg, kg, vg), go, retain_graph=True),
        "direct attention_backward": lambda: attention_backward(go, q, k, v, out, lse, setup),
        "direct attention_backward tma=False": lambda: attention_backward(go, q, k, v, out, lse, setup, False),
        "bwd_preprocess": lambda: bwd_preprocess(setup, out, go),
        "bwd_dkdv": lambda: bwd_dkdv(setup, q, k, v, go, lse, delta),
        "bwd_dq": lambda: bwd_dq(setup, q, k, v, go, lse, delta),
        "bwd_dkdv tma=False": lambda: bwd_dkdv(setup, q, k, v, go, lse, delta, False),
        "bwd_dq tma=False": lambda: bwd_dq(setup, q, k, v, go, lse, delta, False),
        "tile_safe_all x5": lambda: setup.tile_safe_all(q, k, v, out, go),
        "torch.empty x4": lambda: [torch.empty(b, h, n, d, dtype=torch.bfloat16, device=dev) for _ in range(4)],
        "forward direct attention_forward": lambda: attention_forward(q, k, v, setup),
        "forward direct attention_forward tma=False": lambda: attention_forward(q, k, v, setup, False),
        "forward attnkit triton (no grad)": lambda: attnkit.attention(q, k, v, causal=True, backend="triton"),
        "forward raw sdpa (no grad)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "autograd Nothing (python node, no work)": lambda: torch.autograd.grad(o_nothing, (qg,), go, retain_graph=True),
        "autograd sdpa-cudnn": lambda: torch.autograd.grad(o_cu, (qg, kg, vg), go, retain_graph=True),
        "autograd raw sdpa": lambda: torch.autograd.grad(o_raw, (qg, kg, vg), go, retain_graph=True),
    }
    for fn in variants.values():
        for _ in range(20): fn()
    samples = {key: [] for key in variants}
    for _ in range(7):
        for key, fn in variants.items():
            samples[key].append(host_us(fn))
    result[name] = {key: {"median_host_us": statistics.median(vals), "samples": vals} for key, vals in samples.items()}
    print(f"== {name}")
    for key, vals in samples.items():
        print(f"  {key:45s} {statistics.median(vals):8.1f} us  (min {min(vals):.1f})")
json.dump(result, open(args.out, "w"), indent=1)

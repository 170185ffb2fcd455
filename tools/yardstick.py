"""How strict the tolerance rule's yardstick is, before and after its softmax moved to float32.

The rule (attnkit.testing) bounds a path's error against the float64 oracle by c times the
error of the naive path in the same dtype, plus a floor. This tool measures, per dtype and
quantity (out, dq, dk, dv), on a fixed set of problems:

* ``legacy/yardstick``: the error of the former naive path (scores, softmax and P @ V all in
  the input dtype) divided by the error of today's (scores and softmax in float32, P rounded to
  the dtype before P @ V): how much looser the former bound was;
* for every available path, the largest multiple error(path) / error(yardstick), against the
  legacy yardstick (before) and today's (after), and whether the path passes today's rule.

Usage (CPU or GPU; no network; < 4 min on a GPU, ~1 min on a CPU without --triton-interpreted):

    PYTHONPATH=src python3 tools/yardstick.py [--out results.json] [--device cuda]

Prints a Markdown table; ``--out`` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch

import attnkit
from attnkit.inputs import check_inputs
from attnkit.reference import visibility
from attnkit.testing import ERROR_FACTORS, compare_to_reference, make_tensor, max_abs_error, run_with_grads

QUANTITIES = ("out", "dq", "dk", "dv")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

#: (B, Hq, Hkv, N, M, D, Dv, causal, magnitude): block edges, N != M, GQA, odd head dims,
#: large logits and outliers, as the equivalence suite draws them.
PROBLEMS = (
    (2, 4, 2, 45, 67, 40, 40, True, "unit"),
    (1, 2, 2, 128, 128, 64, 64, False, "unit"),
    (1, 4, 1, 97, 131, 59, 59, True, "unit"),
    (1, 2, 2, 64, 200, 128, 96, False, "outliers"),
    (1, 2, 1, 80, 80, 111, 111, True, "large"),
    (2, 3, 3, 33, 257, 32, 32, False, "large"),
    (1, 2, 2, 256, 256, 96, 96, True, "outliers"),
    (1, 1, 1, 1, 300, 64, 64, False, "unit"),
)


def legacy_naive(q, k, v, causal, scale):
    """The former yardstick: everything in q's dtype (softmax included)."""
    p = check_inputs(q, k, v, causal, scale)
    qg = q.reshape(p.batch, p.kv_heads, p.group_size, p.q_len, p.head_dim)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * p.scale
    if p.causal:
        scores = scores.masked_fill(~visibility(p, q.device), float("-inf"))
    row_max = scores.amax(-1, keepdim=True).detach()
    weights = torch.exp(scores - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)))
    denom = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.matmul(probs, v.unsqueeze(2)).reshape(p.batch, p.q_heads, p.q_len, p.value_dim)


def _tensors(spec, dtype, device, seed):
    b, hq, hkv, n, m, d, dv, causal, magnitude = spec
    gen = torch.Generator().manual_seed(seed)
    kw = {"dtype": dtype, "device": device, "generator": gen}
    q = make_tensor((b, hq, n, d), magnitude=magnitude, **kw)
    k = make_tensor((b, hkv, m, d), magnitude="unit" if magnitude == "large" else magnitude, **kw)
    v = make_tensor((b, hkv, m, dv), magnitude="unit" if magnitude == "large" else magnitude, **kw)
    grad_out = torch.randn(b, hq, n, dv, generator=gen).to(device=device, dtype=dtype)
    return q, k, v, grad_out, causal


def measure(device, backends, seeds):
    rows = []
    for dname, dtype in DTYPES.items():
        for spec in PROBLEMS:
            for seed in range(seeds):
                q, k, v, grad_out, causal = _tensors(spec, dtype, device, seed)
                ref = run_with_grads(
                    lambda a, b, c, cz=causal: attnkit.reference_attention(a, b, c, causal=cz),
                    q.double(), k.double(), v.double(), grad_out.double(),
                )  # fmt: skip
                legacy = run_with_grads(
                    lambda a, b, c, cz=causal: legacy_naive(a, b, c, cz, None), q, k, v, grad_out
                )
                legacy_err = {x: max_abs_error(legacy[x], ref[x]) for x in QUANTITIES}
                for name in backends:

                    def run(a, b, c, name=name, cz=causal):
                        return attnkit.attention(a, b, c, causal=cz, backend=name)

                    try:
                        checks = compare_to_reference(
                            run, q, k, v, causal=causal, scale=None, grad_out=grad_out
                        )
                    except attnkit.UnsupportedProblemError:
                        continue
                    for c in checks:
                        rows.append({
                            "dtype": dname, "problem": list(spec), "seed": seed, "backend": name,
                            "quantity": c.quantity, "error": c.error, "yardstick_error": c.baseline_error,
                            "legacy_error": legacy_err[c.quantity], "bound": c.bound, "ok": c.ok,
                        })  # fmt: skip
    return rows


def _ratio(a, b):
    return a / b if b > 0 else math.inf


def summarise(rows):
    lines = ["## Yardstick error: legacy (softmax in dtype) / today (softmax in float32)", ""]
    lines += ["| dtype | " + " | ".join(f"{x} median / min / max" for x in QUANTITIES) + " |"]
    lines += ["|---" * (len(QUANTITIES) + 1) + "|"]
    summary = {"looseness": {}, "multiples": {}}
    for dname in DTYPES:
        cells = []
        for x in QUANTITIES:
            seen = {
                (tuple(r["problem"]), r["seed"]): _ratio(r["legacy_error"], r["yardstick_error"])
                for r in rows
                if r["dtype"] == dname and r["quantity"] == x
            }
            vals = [v for v in seen.values() if math.isfinite(v)]
            if not vals:
                cells.append("-")
                continue
            stats = (statistics.median(vals), min(vals), max(vals))
            summary["looseness"][f"{dname}/{x}"] = stats
            cells.append(" / ".join(f"{s:.2f}" for s in stats))
        lines.append(f"| {dname} | " + " | ".join(cells) + " |")
    lines += ["", "## Largest error(path) / error(yardstick): before (legacy) -> after (today)", ""]
    lines += [
        "Allowed multiple: "
        + ", ".join(f"{x} {ERROR_FACTORS[x]:g}x" for x in QUANTITIES)
        + " (plus the floor). `error/bound` is the largest error over today's bound (floor included; "
        + "the path fails above 1), `fail` counts the problems outside today's rule.",
        "",
    ]
    lines += [
        "| backend | dtype | " + " | ".join(QUANTITIES) + " | error/bound | fail |",
        "|---" * (len(QUANTITIES) + 4) + "|",
    ]
    for name in sorted({r["backend"] for r in rows}):
        for dname in DTYPES:
            mine = [r for r in rows if r["backend"] == name and r["dtype"] == dname]
            if not mine:
                continue
            cells = []
            for x in QUANTITIES:
                sel = [r for r in mine if r["quantity"] == x]
                before = max(_ratio(r["error"], r["legacy_error"]) for r in sel)
                after = max(_ratio(r["error"], r["yardstick_error"]) for r in sel)
                summary["multiples"][f"{name}/{dname}/{x}"] = (before, after)
                cells.append(f"{before:.2f} -> {after:.2f}")
            fails = sum(not r["ok"] for r in mine)
            worst = max(_ratio(r["error"], r["bound"]) for r in mine)
            summary["error_over_bound"] = {**summary.get("error_over_bound", {}), f"{name}/{dname}": worst}
            lines.append(f"| {name} | {dname} | " + " | ".join(cells) + f" | {worst:.2f} | {fails} |")
    return "\n".join(lines), summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(attnkit.registry.default_device()))
    parser.add_argument("--seeds", type=int, default=2, help="random draws per problem")
    parser.add_argument("--backends", nargs="*", help="default: every available one but naive")
    parser.add_argument("--out", help="write the rows and the summary as JSON here")
    parser.add_argument("--doc", help="also write the table as a Markdown page here, with this command")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    backends = args.backends or [n for n in attnkit.available_backends(device) if n != "naive"]
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and not args.backends:
        backends = [n for n in backends if n != "triton"]  # interpreted: far too slow at these sizes
    rows = measure(device, backends, args.seeds)
    table, summary = summarise(rows)
    header = f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
    header += f"torch {torch.__version__}, {len(PROBLEMS)} problems x {args.seeds} seeds per dtype\n"
    print(header + "\n" + table)
    if args.doc:
        command = "PYTHONPATH=src python3 tools/yardstick.py " + " ".join(argv or sys.argv[1:])
        with open(args.doc, "w") as f:
            f.write(
                f"# The tolerance rule's yardstick, before and after\n\nProduced by `{command}`; {header}\n"
            )
            f.write((__doc__ or "").split("\n\n", 1)[1].split("Usage")[0].strip() + "\n\n" + table + "\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"header": header, "summary": summary, "rows": rows}, f, indent=1)
    failed = sum(not r["ok"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""How strict the tolerance rule's yardstick is: the naive path with its softmax in float32 (the
rule's) against one computing everything, softmax included, in the input dtype.

The rule (attnkit.testing) bounds a path's error against the float64 oracle by c times the
error of the naive path in the same dtype, plus a floor. This tool measures, per dtype and
quantity (out, dq, dk, dv), on a fixed set of problems (``PROBLEMS`` in the module):

* ``dtype-softmax / yardstick``: the error of a naive path with scores, softmax and P @ V all in
  the input dtype divided by the error of the rule's yardstick (scores and softmax in float32,
  P rounded to the dtype before P @ V): how much looser a bound on the former would be;
* for every available path, the largest multiple error(path) / error(yardstick), against the
  dtype-softmax yardstick and the rule's, and whether the path passes the rule.

Usage (CPU or GPU; no network; about 5 min on an H200 from cold compile caches, ~1 min on a CPU,
the Triton path left out when interpreted):

    python -m attnkit_tools.pages.yardstick --seeds 3 --doc docs/<gpu>/YARDSTICK.md \\
        [--out r.json] [--device cuda]

Prints a Markdown table; ``--doc`` writes it as a page with its provenance, ``--out`` the
numbers as JSON. Exits 1 when a path falls outside the rule on some problem.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch

import attnkit
from attnkit.inputs import check_inputs
from attnkit.reference import visibility
from attnkit.registry import get_backend
from attnkit.testing import ERROR_FACTORS, compare_to_reference, make_tensor, max_abs_error, run_with_grads
from attnkit_perf.bench import provenance
from attnkit_tools.pages.provenance import produced_by, provenance_table

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


def naive_dtype_softmax(q, k, v, causal, scale):
    """The naive path with everything in q's dtype, softmax included. q: (B, Hq, N, D);
    k: (B, Hkv, M, D); v: (B, Hkv, M, Dv); returns (B, Hq, N, Dv)."""
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
                loose = run_with_grads(
                    lambda a, b, c, cz=causal: naive_dtype_softmax(a, b, c, cz, None), q, k, v, grad_out
                )
                loose_err = {x: max_abs_error(loose[x], ref[x]) for x in QUANTITIES}
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
                            "dtype_softmax_error": loose_err[c.quantity], "bound": c.bound, "ok": c.ok,
                        })  # fmt: skip
    return rows


def _ratio(a, b):
    return a / b if b > 0 else math.inf


def summarise(rows):
    lines = ["## Yardstick error: softmax in the dtype / softmax in float32 (the rule's)", ""]
    lines += ["| dtype | " + " | ".join(f"{x} median / min / max" for x in QUANTITIES) + " |"]
    lines += ["|---" * (len(QUANTITIES) + 1) + "|"]
    summary = {"looseness": {}, "multiples": {}}
    for dname in DTYPES:
        cells = []
        for x in QUANTITIES:
            seen = {
                (tuple(r["problem"]), r["seed"]): _ratio(r["dtype_softmax_error"], r["yardstick_error"])
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
    lines += ["", "## Largest error(path) / error(yardstick): dtype-softmax yardstick -> the rule's", ""]
    lines += [
        "Allowed multiple: "
        + ", ".join(f"{x} {ERROR_FACTORS[x]:g}x" for x in QUANTITIES)
        + " (plus the floor). `error/bound` is the largest error over the rule's bound (floor included; "
        + "the path fails above 1), `fail` counts the problems outside the rule.",
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
                before = max(_ratio(r["error"], r["dtype_softmax_error"]) for r in sel)
                after = max(_ratio(r["error"], r["yardstick_error"]) for r in sel)
                summary["multiples"][f"{name}/{dname}/{x}"] = (before, after)
                cells.append(f"{before:.2f} -> {after:.2f}")
            fails = sum(not r["ok"] for r in mine)
            worst = max(_ratio(r["error"], r["bound"]) for r in mine)
            summary["error_over_bound"] = {**summary.get("error_over_bound", {}), f"{name}/{dname}": worst}
            lines.append(f"| {name} | {dname} | " + " | ".join(cells) + f" | {worst:.2f} | {fails} |")
    return "\n".join(lines), summary


def page(table: str, info: dict, command: str, seeds: int) -> str:
    """The Markdown page: title, command, provenance, what is measured (this module's
    docstring), then ``table`` (:func:`summarise`'s)."""
    what = (__doc__ or "").split("\n\n", 1)[1].split("Usage")[0].strip()
    return "\n".join(
        [
            "# The tolerance rule's yardstick",
            "",
            f"Produced by `{command}`: {len(PROBLEMS)} problems x {seeds} seeds per dtype.",
            "",
            *provenance_table(info),
            "",
            what,
            "",
            table,
            "",
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit_tools.pages.yardstick", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seeds", type=int, default=2, help="random draws per problem")
    parser.add_argument("--backends", nargs="*", help="default: every available one but naive")
    parser.add_argument("--out", help="write the rows and the summary as JSON here")
    parser.add_argument("--doc", help="also write the table as a Markdown page here, with this command")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, not {args.seeds}")
    available = attnkit.available_backends(torch.device(args.device))
    unknown = [name for name in args.backends or () if name not in available]
    if unknown:
        parser.error(f"--backends {unknown} not available on {args.device}; available: {list(available)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    backends = args.backends or [n for n in attnkit.available_backends(device) if n != "naive"]
    if not args.backends:  # a path interpreted on this device is far too slow at these sizes
        backends = [n for n in backends if not get_backend(n).is_interpreted(device)]
    rows = measure(device, backends, args.seeds)
    table, summary = summarise(rows)
    info = provenance(device)
    print(table)
    if args.doc:
        command = produced_by("pages.yardstick", sys.argv[1:] if argv is None else argv)
        with open(args.doc, "w") as f:
            f.write(page(table, info, command, args.seeds))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": info, "summary": summary, "rows": rows}, f, indent=1)
    failed = sum(not r["ok"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

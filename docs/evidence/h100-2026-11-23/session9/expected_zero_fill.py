"""Expected effect of zeroed-outputs.patch from bytes alone, next to do_bench and the gate:

    python docs/evidence/h100-2026-11-23/session9/expected_zero_fill.py VERDICT.json AB.json [GB_S]

expected = 1 + (bytes the patch zero-fills) / (write bandwidth, default 2.8e12 B/s) / (base time
the verdict measured). Bytes: the forward's output (B, Hq, N, Dv) and the backward's dQ (B, Hq,
N, D), dK and dV (B, Hkv, M, D), at the dtype's width.
"""

import json
import sys

verdict, ab = (json.load(open(p)) for p in sys.argv[1:3])
bandwidth = float(sys.argv[3]) if len(sys.argv) > 3 else 2.8e12
effects = {r["name"]: r for r in ab["rows"]}
print("| benchmark | zero-filled | expected | do_bench (rounds) | gate |")
print("|---|---:|---:|---|---|")
for row in verdict["benchmarks"]:
    s = row["shape"]
    n, m = s["seq_len"], s["kv_len"] or s["seq_len"]
    width = 4 if s["dtype"] == "fp32" else 2
    out = s["batch"] * s["q_heads"] * n * s["head_dim"] * width
    grads = out + 2 * s["batch"] * s["kv_heads"] * m * s["head_dim"] * width
    zeroed = {"fwd": out, "bwd": grads, "fwd+bwd": out + grads}[row["pass"]]
    expected = 1 + zeroed / bandwidth / (row["base_median_ms"] / 1e3)
    e = effects.get(row["name"])
    measured = "" if e is None else f"x{e['ratio']:.3f} ({' '.join(f'{r:.3f}' for r in e['ratios'])})"
    bound = " (host-bound)" if row.get("host_bound") else ""
    print(
        f"| {row['name']} | {zeroed / 2**20:.0f} MiB | x{expected:.3f} | {measured} | "
        f"{row['outcome']} x{row['ratio']:.3f}{bound} |"
    )

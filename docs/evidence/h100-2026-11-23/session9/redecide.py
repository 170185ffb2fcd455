"""Re-decide measured paired verdicts under the current rule, offline, from the pair log ratios
each verdict row stores (the decision depends on nothing else):

    PYTHONPATH=src python docs/evidence/h100-2026-11-23/session9/redecide.py VERDICT.json \
        --noise baselines/nvidia-h100-80gb-hbm3/noise-paired.json [--effects AB.json]

Per benchmark: the measured outcome, the threshold the noise file gives now (k from
attnkit_perf.decide.gate.noise_z, confirmed; at least 25% where the row is host-bound), and the
outcome under it. A row that was slower is
re-decided on its stored (confirming) measurement and its recorded ratio (the smaller of the two
measurements'); a row that was not slower has one measurement, so "slower" there means "slower on
the first measurement, confirmation not run".
"""

import argparse
import json
import math

from attnkit_perf.decide import gate
from attnkit_perf.decide.noise import load_noise


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verdict")
    parser.add_argument("--noise", required=True)
    parser.add_argument("--effects")
    args = parser.parse_args()
    doc = json.load(open(args.verdict))
    key = doc["head"]["provenance"]["gpu_key"]
    noise = load_noise(args.noise, key, "paired")
    effects = {}
    if args.effects:
        effects = {r["name"]: r for r in json.load(open(args.effects))["rows"]}
    t = gate.Thresholds()
    alpha = doc["thresholds"]["per_benchmark_alpha"]
    k = gate.noise_z(alpha, confirmed=True)
    print(f"{args.verdict}: alpha {alpha:.3g}, k = {k:.2f}")
    print("| benchmark | true effect (do_bench, rounds) | measured | threshold now | outcome now |")
    print("|---|---|---|---|---|")
    moved = {}
    for row in doc["benchmarks"]:
        logs = (row.get("evidence") or {}).get("log_ratios")
        if not logs:
            continue
        threshold = gate.benchmark_threshold(t, noise.get(row["name"]), alpha, confirmed=True)
        if row.get("host_bound"):  # as the verdict recorded it (the head's host fraction)
            threshold = max(threshold, t.host_bound_slower)
        # Blocks with the stored log ratios (the decision reads only those; constant base blocks
        # would be refused as no evidence, so each pair gets its own level).
        base = [1e-3 * (1 + 0.01 * i) for i in range(len(logs))]
        head = [b * math.exp(x) for b, x in zip(base, logs)]
        d = gate.decide_paired(base, head, t, alpha, threshold)
        now = d.outcome
        if row["outcome"] == "slower" and now == "slower" and row["ratio"] < 1 + threshold:
            now = "same or inconclusive (the smaller measurement is under the threshold)"
        elif row["outcome"] != "slower" and now == "slower":
            now = "slower on the first measurement (confirmation not run)"
        elif now == "inconclusive" and len(logs) < 48:
            now = f"inconclusive at {len(logs)} pairs (the gate measures more, up to 48)"
        moved[(row["outcome"], now)] = moved.get((row["outcome"], now), 0) + 1
        effect = effects.get(row["name"])
        truth = "" if effect is None else (
            f"x{effect['ratio']:.4f} ({' '.join(f'{r:.3f}' for r in effect['ratios'])})"
        )
        print(f"| {row['name']} | {truth} | {row['outcome']} x{row['ratio']:.4f}"
              f"{' host-bound' if row.get('host_bound') else ''} | {threshold:.2%} | {now} |")
    print()
    for (before, after), n in sorted(moved.items()):
        print(f"{n:3d}  {before} -> {after}")


if __name__ == "__main__":
    main()

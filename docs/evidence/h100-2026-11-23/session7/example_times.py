"""Seconds per hypothesis example from a timestamped verbose log (call3.sh), summed by dtype.

    python3 example_times.py verbose_call3_t1.log.gz [...]

Hypothesis prints "Test case:" when an example starts, so the time to the next one is that
example's (draws, attnkit's call, any Triton compilation, the checks).
"""

import collections
import gzip
import re
import sys

FIELDS = ("head_dim", "value_dim", "dtype", "causal", "q_len", "kv_len", "q_layout", "kv_layout")

for path in sys.argv[1:]:
    cases = []
    for line in gzip.open(path, "rt"):
        if "Test case:" in line:
            cases.append([float(line[:7]), ""])
        elif cases:
            cases[-1][1] += line[8:].strip() + " "
    by_dtype = collections.Counter()
    slow = []
    for (start, text), (end, _) in zip(cases, cases[1:]):
        fields = dict(re.findall(r"(\w+)=([^,)]+)", text))
        by_dtype[fields.get("dtype", "?")] += end - start
        slow.append((end - start, " ".join(f"{k}={fields.get(k)}" for k in FIELDS)))
    total = cases[-1][0] - cases[0][0]
    print(f"{path}: {len(cases) - 1} examples timed, {total:.0f} s")
    print("  by dtype: " + ", ".join(f"{k} {v:.0f} s" for k, v in by_dtype.most_common()))
    for seconds, what in sorted(slow, reverse=True)[:5]:
        print(f"  {seconds:5.1f} s  {what}")

#!/usr/bin/env bash
# Verification of the perf gate on a GPU (docs/PERF_GATE.md): record a baseline, then run the
# gate 5x on unchanged code, 3x with a ~10% slowdown injected into one path, 1x with a memory
# growth injected into another. Writes logs, runs and verdicts under $1 (default ./gate-verify).
set -uo pipefail
out=${1:-gate-verify}
slow_path=${SLOW_PATH:-sdpa-flash}
memory_path=${MEMORY_PATH:-sdpa-cudnn}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
suite=(python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider
       --benchmark-columns=median,rounds --attnkit-baseline-dir="$out/baselines")

summarise() {  # $1: verdict file
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [b for b in doc["benchmarks"] if b["verdict"] in ("slower", "more-memory")]
paths = sorted({b["backend"] for b in bad})
print(f"   drift {doc['drift']:.4f} counts {doc['counts']} failing paths {paths}")
for b in bad:
    print(f"   {b['verdict']:11s} {b['name']} ratio {b['ratio']} confirm {b['evidence'].get('confirm')}")
PY
}

start=$(date +%s)
python3 -m attnkit.bench.baseline record --dir "$out/baselines" -- -q -p no:cacheprovider \
  --benchmark-json="$out/run_record.json" > "$out/log_record.txt" 2>&1
echo "record rc=$? $(( $(date +%s) - start ))s $(grep -c '"fullname"' "$out/run_record.json") benchmarks"

gate() {  # $1: label; the rest: environment for the run
  local label=$1; shift
  local t0=$(date +%s)
  env "$@" "${suite[@]}" --benchmark-compare --attnkit-verdict-json="$out/verdict_$label.json" \
    --benchmark-json="$out/run_$label.json" > "$out/log_$label.txt" 2>&1
  local rc=$?
  echo "$label rc=$rc $(( $(date +%s) - t0 ))s: $(grep 'attnkit perf gate:' "$out/log_$label.txt")"
  summarise "$out/verdict_$label.json"
}

for i in 1 2 3 4 5; do gate "unchanged$i"; done
for i in 1 2 3; do gate "slow$i" ATTNKIT_PERF_INJECT="slow:$slow_path:0.10"; done
gate memory ATTNKIT_PERF_INJECT="memory:$memory_path:64"
echo "total $(( $(date +%s) - start ))s"

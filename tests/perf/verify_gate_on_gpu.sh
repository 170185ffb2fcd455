#!/usr/bin/env bash
# Verification of the perf gate on a GPU (docs/PERF_GATE.md). Each step is a word:
#
#   bash tests/perf/verify_gate_on_gpu.sh OUT record unchanged:5 slow:3 memory
#
#   record        python -m attnkit.bench.baseline record (into $BASELINE_DIR, default baselines/)
#   unchanged:N   the gate N times on unchanged code: each run must pass
#   slow:N        the gate N times with a ~10% slowdown injected into $SLOW_PATH: each must fail
#                 naming that path only
#   memory        the gate once with 64 MiB more peak memory in $MEMORY_PATH: it must fail
#
# Writes each run's log, benchmark JSON and verdict under OUT and prints one line per run.
set -uo pipefail
out=$1; shift
slow_path=${SLOW_PATH:-sdpa-flash}
memory_path=${MEMORY_PATH:-sdpa-cudnn}
baseline_dir=${BASELINE_DIR:-baselines}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
suite=(python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider
       --benchmark-columns=median,rounds --attnkit-baseline-dir="$baseline_dir")

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

gate() {  # $1: label; the rest: environment for the run
  local label=$1; shift
  local t0=$(date +%s)
  env "$@" "${suite[@]}" --benchmark-compare --attnkit-verdict-json="$out/verdict_$label.json" \
    --benchmark-json="$out/run_$label.json" > "$out/log_$label.txt" 2>&1
  local rc=$?
  echo "$label rc=$rc $(( $(date +%s) - t0 ))s: $(grep 'attnkit perf gate:' "$out/log_$label.txt")"
  summarise "$out/verdict_$label.json"
}

start=$(date +%s)
for step in "$@"; do
  case $step in
    record)
      t0=$(date +%s)
      python3 -m attnkit.bench.baseline record --dir "$baseline_dir" -- -q -p no:cacheprovider \
        > "$out/log_record.txt" 2>&1
      echo "record rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$out/log_record.txt" ;;
    unchanged:*) for i in $(seq "${step#*:}"); do gate "unchanged$i"; done ;;
    slow:*) for i in $(seq "${step#*:}"); do gate "slow$i" ATTNKIT_PERF_INJECT="slow:$slow_path:0.10"; done ;;
    memory) gate memory ATTNKIT_PERF_INJECT="memory:$memory_path:64" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "total $(( $(date +%s) - start ))s"

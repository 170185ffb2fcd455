#!/usr/bin/env bash
# Verification of the perf gate on a GPU (docs/VERIFICATION.md lists what it showed).
# Each step is a word; results go under OUT (one verdict JSON and log per run, summary.txt):
#
#   bash tests/perf/verify_gate_on_gpu.sh OUT aa:5 change:fwd-tiles-d64 stored-record stored:2
#
#   aa:N           paired mode N times with the base a copy of this tree (A/A): nothing may fail
#   change:NAME    apply tests/perf/gate_changes/NAME.patch to a copy of this tree (the head),
#                  run paired mode against the unchanged tree on the cases the patch names in
#                  its first line ("# cases: WORD ...": -k "WORD and ...", unless CHANGE_ARGS
#                  is set), then measure the change's true effect side by side on those cases
#                  (attnkit_tools.gate.ab_dobench; AB=0 skips this)
#   base:DIR       paired mode with the base another checkout DIR (holding src/), e.g. an
#                  earlier commit's `git archive REF src`: a real change, measured, then its
#                  true effect with do_bench side by side on the cases named by BASE_MATCH
#                  (words matched as in attnkit_tools.gate.ab_dobench; unset: no do_bench)
#   stored-record  record this GPU model's baseline (pytest tests/perf --attnkit-record)
#   stored-pool:N  N recordings in fresh processes, pooled into the baseline and its spread
#                  (python -m attnkit_perf.commands.pool; baselines/<gpu_key>/noise-stored.json)
#   stored:N       stored mode N times against that baseline: nothing may fail
#   noise          build baselines/<gpu_key>/noise-paired.json from the aa runs' verdicts
#
# DEADLINE_S: seconds from the start after which nothing more runs: each command gets the time
# that is left (a paired run stopped that way leaves its verdict file marked incomplete), and a
# step with under 20 s left is skipped and said so.
# PERF_ARGS: extra pytest arguments for every run (e.g. "-k triton", "-n 2"); CHANGE_ARGS: for
# the change runs only, instead of the patch's cases (set it empty to run the whole grid). Where the tree is a copy whose .git is not its own, export
# ATTNKIT_COMMIT=<sha> so that verdicts and baselines name the commit measured.
set -uo pipefail
out=$(realpath -m "$1"); shift
mkdir -p "$out"
root=$(pwd)
site=${PYTHONPATH:+:$PYTHONPATH}  # wheels or site folders the caller added stay visible
export PYTHONPATH=$root/src$site PYTHONUNBUFFERED=1
work=$(mktemp -d)
cp -r "$root/src" "$work/clean-src" && mkdir -p "$work/clean" && mv "$work/clean-src" "$work/clean/src"
summary=$out/summary.txt
# shellcheck disable=SC2206
extra=(${PERF_ARGS:-})

log() { echo "$*" | tee -a "$summary"; }

start=$(date +%s)
left() { echo $(( ${DEADLINE_S:-1000000} - $(date +%s) + start )); }
limited() {  # run "$@" within the time left (DEADLINE_S); none left: not at all (status 124)
  local t; t=$(left)
  if [ "$t" -lt 5 ]; then echo "not run, DEADLINE_S reached: $*" >&2; return 124; fi
  timeout --kill-after=10 "$t" "$@"
}

counts() {  # $1: verdict file
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [b for b in doc["benchmarks"] if b["outcome"] in ("slower", "more-memory", "kept-memory", "inconclusive")]
print(f"   {doc['mode']} complete={doc.get('complete', True)} passed={doc['passed']} counts={doc['counts']}")
spent = {}
for b in doc["benchmarks"]:
    for step, s in ((b.get("evidence") or {}).get("seconds") or {}).items():
        spent[step] = spent.get(step, 0.0) + s
if spent:
    print("   seconds per step, summed over benchmarks: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()))
for b in bad:
    print(f"   {b['outcome']:12s} {b['name']} ratio={b['ratio']} {b['reason']}")
PY
}

paired() {  # $1: label, $2: head src, $3: base folder
  local label=$1 head=$2 base=$3 t0
  t0=$(date +%s)
  PYTHONPATH=$head$site limited python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider \
    --attnkit-base="$base" --attnkit-verdict-json="$out/verdict_$label.json" "${extra[@]}" \
    > "$out/log_$label.txt" 2>&1
  log "$label rc=$? $(( $(date +%s) - t0 ))s: $(grep 'attnkit perf gate (' "$out/log_$label.txt")"
  [ -f "$out/verdict_$label.json" ] && counts "$out/verdict_$label.json" | tee -a "$summary"
}

for step in "$@"; do
  if [ "$(left)" -lt 20 ]; then log "$step: skipped, DEADLINE_S reached"; continue; fi
  case $step in
    aa:*)
      for i in $(seq "${step#*:}"); do paired "aa$i" "$root/src" "$work/clean"; done ;;
    base:*)
      dir=$(realpath "${step#*:}"); name=$(basename "$dir")
      paired "base_$name" "$root/src" "$dir"
      if [ -n "${BASE_MATCH:-}" ]; then
        read -r -a words <<< "$BASE_MATCH"
        limited python3 -m attnkit_tools.gate.ab_dobench --base "$dir/src" --head "$root/src" --match "${words[@]}" \
          --rounds 3 --out "$out/ab_base_$name.json" > "$out/ab_base_$name.txt" 2>&1
        log "$name -> this tree, true effect (ab_dobench: do_bench, or wall per call for loop cases; head/base):"; tee -a "$summary" < "$out/ab_base_$name.txt"
        python3 -m attnkit_tools.gate.detection --effects "$out/ab_base_$name.json" \
          --verdict "$out/verdict_base_$name.json" --out "$out/detection_base_$name.md" | tee -a "$summary"
      fi ;;
    change:*)
      name=${step#*:}
      patch=$root/tests/perf/gate_changes/$name.patch
      head=$work/$name && mkdir -p "$head" && cp -r "$root/src" "$head/src"
      (cd "$head" && patch -s -p1 < "$patch") || { log "$name: patch failed"; continue; }
      read -r -a words <<< "$(head -1 "$patch" | sed 's/^# cases: //')"
      joined="${words[*]}"
      # shellcheck disable=SC2206
      if [ -n "${CHANGE_ARGS+set}" ]; then more=(${CHANGE_ARGS}); else more=(-k "${joined// / and }"); fi
      # shellcheck disable=SC2206
      extra=(${PERF_ARGS:-} "${more[@]}"); paired "change_$name" "$head/src" "$work/clean"
      # shellcheck disable=SC2206
      extra=(${PERF_ARGS:-})
      if [ "${AB:-1}" != 0 ]; then
        limited python3 -m attnkit_tools.gate.ab_dobench --base "$work/clean/src" --head "$head/src" --match "${words[@]}" \
          --rounds 3 --out "$out/ab_$name.json" > "$out/ab_$name.txt" 2>&1
        log "$name true effect (ab_dobench: do_bench, or wall per call for loop cases; head/base):"; tee -a "$summary" < "$out/ab_$name.txt"
        python3 -m attnkit_tools.gate.detection --effects "$out/ab_$name.json" --verdict "$out/verdict_change_$name.json" \
          --out "$out/detection_$name.md" | tee -a "$summary"
      fi ;;
    stored-record)
      t0=$(date +%s)
      limited python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider --attnkit-record \
        "${extra[@]}" > "$out/log_record.txt" 2>&1
      log "record rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/log_record.txt")"
      key=$(python3 -c "from attnkit.device import gpu_key; print(gpu_key())")
      cp "baselines/$key/baseline.json" "$out/baseline_$key.json" ;;
    stored-pool:*)
      # N recordings in fresh processes, pooled into this GPU model's baseline and its spread
      # (recordings of other machines copied to $out/recording_*.json first join the pool).
      for i in $(seq "${step#*:}"); do
        t0=$(date +%s)
        limited python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider --attnkit-record \
          --attnkit-baseline-dir="$work/record$i" --benchmark-json="$out/recording_$(hostname)_$i.json" \
          "${extra[@]}" > "$out/log_record$i.txt" 2>&1
        log "recording $i rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/log_record$i.txt")"
      done
      key=$(python3 -c "from attnkit.device import gpu_key; print(gpu_key())")
      python3 -m attnkit_perf.commands.pool "$out"/recording_*.json --out "baselines/$key/baseline.json" \
        | tee -a "$summary"
      cp "baselines/$key/baseline.json" "baselines/$key/noise-stored.json" "$out/" ;;
    stored:*)
      for i in $(seq "${step#*:}"); do
        t0=$(date +%s)
        limited python3 -m pytest tests/perf/test_attention_perf.py -q -p no:cacheprovider --benchmark-compare \
          --attnkit-verdict-json="$out/verdict_stored$i.json" "${extra[@]}" > "$out/log_stored$i.txt" 2>&1
        log "stored$i rc=$? $(( $(date +%s) - t0 ))s: $(grep 'attnkit perf gate (' "$out/log_stored$i.txt")"
        counts "$out/verdict_stored$i.json" | tee -a "$summary"
      done ;;
    noise)
      key=$(python3 -c "from attnkit.device import gpu_key; print(gpu_key())")
      python3 -m attnkit_perf.commands.noise "$out"/verdict_aa*.json --out "baselines/$key/noise-paired.json" \
        | tee -a "$summary" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
log "total $(( $(date +%s) - start ))s"

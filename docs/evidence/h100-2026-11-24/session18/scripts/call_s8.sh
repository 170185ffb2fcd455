#!/usr/bin/env bash
# Session-8 device call: bash scratch/call_s8.sh DEADLINE_S STEP...
# Restores the carried caches (scratch/cache/cache.txz: Triton, Inductor and the paired sides'
# caches under /tmp/cache), runs the steps, and with PACK=1 packs the caches back into
# $OUT/cache.txz.partNN (15 MB parts; rejoin with cat into scratch/cache/cache.txz).
# Steps: thorough | ci | gate (the whole .ci/gpu-gate.sh, paired against a copy = A/A) |
#        any step of tests/perf/verify_gate_on_gpu.sh (aa:N, change:NAME, stored-record, stored:N)
START=$(date +%s); deadline=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=src:/tmp/site:scratch PYTHONUNBUFFERED=1 ATTNKIT_COMMIT=$(cat scratch/commit)
export TRITON_CACHE_DIR=/tmp/cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor ATTNKIT_CACHE_DIR=/tmp/cache/attnkit
W=/tmp/w; mkdir -p $W /tmp/cache; trap 'tar czf $OUT/results.tgz -C $W .' EXIT
cp scratch/commit $W/commit.txt; nvidia-smi -L > $W/gpu.txt
t0=$(date +%s); [ -f scratch/cache/cache.txz ] && xz -dc -T16 scratch/cache/cache.txz | tar xf - -C /tmp/cache
echo "restore $(( $(date +%s) - t0 ))s $(du -sh /tmp/cache 2>/dev/null | cut -f1)" | tee -a $W/steps.txt
left() { echo $(( deadline - $(date +%s) + START - ${PACK_S:-0} )); }
run_group() {  # run "$@" in its own process group; after $1 s SIGINT to its leader (pytest prints its
  # summary), 15 s later SIGKILL to the whole group; the group is killed at the end in any case
  local t=$1; shift
  # A background job of a non-interactive shell starts with SIGINT ignored: restore it, then exec.
  python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@" &
  local pid=$!
  ( sleep "$t"; kill -INT $pid 2>/dev/null; sleep 15; kill -KILL -- -$pid 2>/dev/null ) & local dog=$!
  wait $pid; local rc=$?
  kill $dog 2>/dev/null; kill -KILL -- -$pid 2>/dev/null  # orphaned xdist workers, if any
  return $rc
}
for step in "$@"; do
  [ "$(left)" -lt 40 ] && { echo "$step skipped" >> $W/steps.txt; continue; }
  t0=$(date +%s)
  case $step in
    thorough|ci)
      profile=$step; n=${WORKERS:-8}; [ $step = thorough ] && n=${WORKERS:-12}
      OUT=$W TAG=$step- MAX_FAILURE_FILES=6 HYPOTHESIS_PROFILE=$profile run_group $(( $(left) - 20 )) \
        python3 -m pytest ${TESTS:-tests/correctness} -q -n $n -p live_failures --durations=25 -p no:cacheprovider -rfE ${PYTEST_EXTRA:-} \
        > $W/$step.log 2>&1
      echo "$step rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 $W/$step.log)" | tee -a $W/steps.txt ;;
    py:*)
      n=$(basename ${step#py:} .py); timeout $(( $(left) - 10 )) python3 ${step#py:} --out $W/$n.json > $W/$n.log 2>&1
      echo "$step rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/steps.txt ;;
    sh:*)
      n=$(basename ${step#sh:} .sh); W=$W timeout $(( $(left) - 10 )) bash ${step#sh:} > $W/$n.log 2>&1
      echo "$step rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/steps.txt ;;
    gate)
      base=/tmp/base && rm -rf $base && mkdir -p $base && cp -r src $base/src
      PYTHONPATH=/tmp/site ATTNKIT_PYTHON=python3 ATTNKIT_BASE=$base ATTNKIT_TEST_WORKERS=${TEST_WORKERS:-16} run_group $(( $(left) - 20 )) \
        bash .ci/gpu-gate.sh $W/gate > $W/gate.log 2>&1
      echo "gate rc=$? $(( $(date +%s) - t0 ))s: $(grep -E '^(correctness|perf): ' $W/gate.log | tr '\n' ' ')" | tee -a $W/steps.txt ;;
    *)
      DEADLINE_S=$(( $(left) - 10 )) HYPOTHESIS_PROFILE=ci bash tests/perf/verify_gate_on_gpu.sh $W/verify "$step"
      echo "$step rc=$? $(( $(date +%s) - t0 ))s" | tee -a $W/steps.txt ;;
  esac
done
if [ "${PACK:-0}" = 1 ]; then
  t0=$(date +%s); tar cf - -C /tmp/cache . | xz -T16 -6 > /tmp/cache.txz
  if [ $(stat -c %s /tmp/cache.txz) -gt 52000000 ]; then  # keep what a cache hit loads: cubin, json, ptx
    find /tmp/cache/triton -name '*.ttir' -o -name '*.ttgir' -o -name '*.llir' -o -name '*.source' | xargs rm -f
    tar cf - -C /tmp/cache . | xz -T16 -6 > /tmp/cache.txz; echo pruned >> $W/steps.txt
  fi
  split -b 15M -d /tmp/cache.txz $OUT/cache.txz.part
  echo "pack $(( $(date +%s) - t0 ))s $(ls -la /tmp/cache.txz | awk '{print $5}') bytes" | tee -a $W/steps.txt
fi
cat $W/verify/summary.txt 2>/dev/null | tail -30

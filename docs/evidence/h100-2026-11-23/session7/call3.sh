#!/usr/bin/env bash
# bash scratch/call_s7b.sh DEADLINE: per-call cost on a quiet machine, then the 3 slow thorough Triton
# tests each in its own process (no xdist), verbose hypothesis (one line per example, timestamped),
# stacks dumped by faulthandler after FH seconds; each process group killed at the deadline.
START=$(date +%s); deadline=$1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=src:/tmp/site:scratch PYTHONUNBUFFERED=1 ATTNKIT_COMMIT=$(cat scratch/commit)
export TRITON_CACHE_DIR=/tmp/cache/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor
W=/tmp/w; mkdir -p $W; trap 'tar czf $OUT/results.tgz -C $W .' EXIT
cp scratch/commit $W/commit.txt; nvidia-smi -L > $W/gpu.txt
left() { echo $(( deadline - $(date +%s) + START )); }
timeout 120 python3 tools/per_call_cost.py --out $W/per_call.json > $W/per_call.log 2>&1
echo "per_call rc=$? $(( $(date +%s) - START ))s" >> $W/steps.txt
stamp='import sys,time
t=time.time()
for l in sys.stdin: sys.stdout.write(f"{time.time()-t:7.1f} {l}")'
i=0
for t in "tests/correctness/test_decode.py::test_decode_shapes_match_reference[triton-fwd+bwd]" \
         "tests/correctness/test_properties.py::test_rows_that_see_no_key_are_zero_with_zero_gradient[triton]" \
         "tests/correctness/test_properties.py::test_windowed_rows_that_see_no_key_are_zero_with_zero_gradient[triton]"; do
  i=$((i+1))
  setsid bash -c "HYPOTHESIS_PROFILE=thorough python3 -u -m pytest '$t' -s -q -p no:cacheprovider -p no:xdist --hypothesis-seed=1 \
     --hypothesis-verbosity=verbose --hypothesis-show-statistics -o faulthandler_timeout=${FH:-250} 2>&1 | python3 -u -c '$stamp' > $W/t$i.log" &
  echo $! > $W/pid$i
done
while [ "$(left)" -gt 15 ] && [ -n "$(jobs -r)" ]; do sleep 2; done
for i in 1 2 3; do kill -INT -- -$(cat $W/pid$i) 2>/dev/null; done; sleep 4
for i in 1 2 3; do kill -KILL -- -$(cat $W/pid$i) 2>/dev/null; done
echo "tests end $(( $(date +%s) - START ))s" >> $W/steps.txt
for i in 1 2 3; do echo "== t$i $(grep -c 'Test case:' $W/t$i.log) examples"; tail -3 $W/t$i.log; done
cat $W/steps.txt; grep -E "^B1-H8-N128-D64 +fwd +(triton|sdpa|raw)" $W/per_call.log

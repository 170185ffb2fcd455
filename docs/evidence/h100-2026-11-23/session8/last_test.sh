# The last thorough test as 8 shards of 50 examples (seeds 101..108), side by side: 400 examples.
# W is exported by call_s8.sh; each shard in its own process group, SIGINT restored, INT at $LIMIT s.
T='tests/correctness/test_properties.py::test_windowed_rows_that_see_no_key_are_zero_with_zero_gradient[triton]'
LIMIT=${LIMIT:-300}
pids=()
for s in 1 2 3 4 5 6 7 8; do
  SHARD_EXAMPLES=50 HYPOTHESIS_PROFILE=thorough python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
    python3 -m pytest "$T" -p shard_profile --hypothesis-seed=$((100 + s)) -p no:cacheprovider -q -rA \
    --hypothesis-show-statistics --durations=1 > $W/last_shard$s.log 2>&1 &
  pids+=($!)
done
( sleep $LIMIT; for p in "${pids[@]}"; do kill -INT $p 2>/dev/null; done; sleep 15; for p in "${pids[@]}"; do kill -KILL -- -$p 2>/dev/null; done ) & dog=$!
t0=$(date +%s); rcs=""
for p in "${pids[@]}"; do wait $p; rcs="$rcs $?"; done
kill $dog 2>/dev/null
echo "shards rc:$rcs in $(( $(date +%s) - t0 ))s"
for s in 1 2 3 4 5 6 7 8; do echo "shard $s: $(grep -E 'passed|failed|error' $W/last_shard$s.log | tail -1) | $(grep -m1 -E 'passing examples|thorough-shard' $W/last_shard$s.log)"; done

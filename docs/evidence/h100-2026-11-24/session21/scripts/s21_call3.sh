# session 21, call 3: build, the per-call table, the native-launch tests and neighbours, the pairs
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build.log 2>&1; echo "build rc=$?"
python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.txt 2>&1
echo "per_call rc=$?"
python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/correctness/test_fast_launch.py tests/correctness/test_fast_calls.py \
  tests/correctness/test_decode.py tests/correctness/test_triton.py tests/correctness/test_compile.py tests/correctness/test_sdpa_call.py > $W/tests.log 2>&1
echo "tests rc=$? $(tail -1 $W/tests.log)"
python3 scratch/s21/s21_triton.py --out $W/s21_triton.json > $W/s21_triton.txt 2>&1; echo "pairs rc=$?"
cat $W/s21_triton.txt

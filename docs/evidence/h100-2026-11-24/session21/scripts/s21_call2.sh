# session 21, call 2: build, the native-launch tests and their neighbours, then the host-time pairs
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build.log 2>&1; echo "build rc=$?"
python3 -m pytest -q -n 4 -p no:cacheprovider -rfE tests/correctness/test_fast_launch.py tests/correctness/test_fast_calls.py \
  tests/correctness/test_decode.py tests/correctness/test_triton.py tests/correctness/test_compile.py > $W/tests.log 2>&1
echo "tests rc=$? $(tail -1 $W/tests.log)"
python3 scratch/s21/s21_triton.py --out $W/s21_triton.json > $W/s21_triton.txt 2>&1; echo "pairs rc=$?"
cat $W/s21_triton.txt

# session 20, call 1: build the compiled memo, its tests and the SDPA ones, memo pairs, per-call table
set -x
t0=$(date +%s)
python3 -c "import sys, sysconfig; print(sys.version); print(sysconfig.get_paths()['include'])"; which g++ ninja c++
ATTNKIT_FAST_CALLS=build python3 -m attnkit.fast_calls build > $W/build.log 2>&1; echo "build rc=$? $(( $(date +%s) - t0 ))s"
tail -5 $W/build.log
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls
t0=$(date +%s)
python3 -m pytest tests/correctness/test_fast_calls.py tests/correctness/test_sdpa_call.py tests/correctness/test_decode.py tests/correctness/test_compile.py tests/correctness/test_equivalence.py -q -n 8 -p no:cacheprovider -rfE > $W/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 $W/tests.log)"
t0=$(date +%s)
python3 scratch/s20_memo.py --out $W/memo_pairs.json > $W/memo_pairs.log 2>&1; echo "memo pairs rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.txt 2>&1
echo "per_call rc=$? $(( $(date +%s) - t0 ))s"

# session 20, call 3: the compiled memo's and the SDPA call tests under the thorough profile
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build3.log 2>&1; echo "build rc=$?"
HYPOTHESIS_PROFILE=thorough python3 -m pytest tests/correctness/test_fast_calls.py tests/correctness/test_sdpa_call.py -q -n 8 -p no:cacheprovider -rfE > $W/thorough_fast.log 2>&1
echo "thorough fast_calls+sdpa_call rc=$?: $(tail -1 $W/thorough_fast.log)"

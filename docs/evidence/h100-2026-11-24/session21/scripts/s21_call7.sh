# session 21, call 7: the final source built, and the native-launch and compiled-memo tests
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build.log 2>&1; echo "build rc=$?"
python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/correctness/test_fast_launch.py tests/correctness/test_fast_calls.py > $W/tests.log 2>&1
echo "tests rc=$? $(tail -1 $W/tests.log)"

# session 20, call 2: per_call_cost's whole table with the compiled memo (docs/PER_CALL.md)
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build.log 2>&1; echo "build rc=$?"
python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.txt 2>&1
echo "per_call rc=$?"

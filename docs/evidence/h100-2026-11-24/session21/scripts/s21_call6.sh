# session 21, call 6: the B16 rows again with 5x the paired calls (one UNCLEAR row in call 3)
export ATTNKIT_FAST_CALLS=build
python3 -m attnkit.fast_calls_cli build > $W/build.log 2>&1; echo "build rc=$?"
python3 tools/per_call_cost.py --sizes B16-H16-N1024-D128 --paired-calls 10000 --out $W/per_call_b16.json --md $W/PER_CALL_b16.md > $W/per_call_b16.txt 2>&1
echo "per_call rc=$?"
grep -E "^- (PASS|FAIL|UNCLEAR)" $W/PER_CALL_b16.md

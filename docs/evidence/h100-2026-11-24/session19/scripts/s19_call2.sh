# session 19, call 2: the ladder at the new commit (both sizes), then per_call_cost's table
python3 scratch/s19_ladder.py --shapes "1,8,128,64;4,16,1024,128" --out $W/ladder.json > $W/ladder.log 2>&1
echo "ladder rc=$?"
python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.log 2>&1
echo "per_call rc=$?"

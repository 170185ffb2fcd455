# session 19, call 3: the ladder (both sizes), then per_call_cost at the host-bound sizes
python3 scratch/s19_ladder.py --shapes "1,8,128,64;4,16,1024,128" --out $W/ladder.json > $W/ladder.log 2>&1
echo "ladder rc=$?"
python3 tools/per_call_cost.py --sizes B1-H8-N128-D64,B8-Hq32-Hkv8-N1-M4096-D128 --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.log 2>&1
echo "per_call rc=$?"

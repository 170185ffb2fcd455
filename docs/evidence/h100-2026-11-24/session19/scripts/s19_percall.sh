# session 19: per_call_cost's whole table (docs/PER_CALL.md)
python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.txt 2>&1
echo "per_call rc=$?"

# per_call_cost.py at this commit, every size, with docs/PER_CALL.md
PYTHONPATH=src:/tmp/site python3 tools/per_call_cost.py --out $W/per_call.json --md $W/PER_CALL.md > $W/per_call.txt 2>&1

# per_call_cost.py at this commit, every size
PYTHONPATH=src:/tmp/site python3 tools/per_call_cost.py --out $W/per_call_final.json > $W/per_call_final.txt 2>&1

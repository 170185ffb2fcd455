# per_call_cost.py (this tree's tool) on the library before (0219d30, scratch/base0219) and after
set -x
PYTHONPATH=scratch/base0219/src:/tmp/site python3 tools/per_call_cost.py --sizes B1-H8-N128-D64,B8-Hq32-Hkv8-N1-M4096-D128 --out $W/per_call_before.json > $W/per_call_before.txt 2>&1
PYTHONPATH=src:/tmp/site python3 tools/per_call_cost.py --out $W/per_call_after.json > $W/per_call_after.txt 2>&1

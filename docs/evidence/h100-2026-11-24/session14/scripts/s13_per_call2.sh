PYTHONPATH=src:/tmp/site:scratch python3 tools/per_call_cost.py --sizes B1-H8-N128-D64,B4-H16-N1024-D128 --out $W/per_call_c2.json > $W/per_call_c2.txt 2>&1
echo "rc=$?"

# per_call_cost at the two host-bound sizes: this commit, then the previous commit's src (before
# the direct kernel ops), same machine, one after the other.
S="B1-H1-N8-D16,B1-H8-N128-D64"
PYTHONPATH=src:/tmp/site:scratch python3 tools/per_call_cost.py --sizes $S --out $W/per_call_new.json > $W/per_call_new.txt 2>&1
echo "new rc=$?"
PYTHONPATH=scratch/old_src/src:/tmp/site:scratch python3 tools/per_call_cost.py --sizes $S --out $W/per_call_old.json > $W/per_call_old.txt 2>&1
echo "old rc=$?"

bash scratch/s12_ncu.sh
python3 scratch/s12_host_bwd.py --out $W/host_bwd.json > $W/host_bwd.log 2>&1; echo "host_bwd rc=$?"

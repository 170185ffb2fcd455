# Split-KV config sweeps (contiguous and paged) on this GPU, into $W.
t0=$(date +%s)
python3 tools/decode_table.py --sweep --sweep-paged --out $W/decode_sweep.json > $W/decode_sweep.md 2> $W/decode_sweep.err
echo "sweep rc=$? $(( $(date +%s) - t0 ))s"; tail -4 $W/decode_sweep.md

# H200: grid and decode table into docs/nvidia-h200/, copies of them and of the baseline into $W.
mkdir -p $W/grid $W/h200; t0=$(date +%s)
python3 -m attnkit_tools.grid --out docs/nvidia-h200/PERFORMANCE.md --json $W/grid/grid.json > $W/grid/grid.log 2>&1
echo "grid rc=$? $(( $(date +%s) - t0 ))s"; t0=$(date +%s)
python3 tools/decode_table.py --out $W/decode_table.json --md docs/nvidia-h200/DECODE.md > $W/decode_table.md 2> $W/decode_table.err
echo "decode_table rc=$? $(( $(date +%s) - t0 ))s"
cp -r docs/nvidia-h200/* $W/h200/; mkdir -p $W/baselines && cp -r baselines/nvidia-h200 $W/baselines/

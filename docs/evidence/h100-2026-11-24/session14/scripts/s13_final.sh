# Grid (docs/PERFORMANCE.md) and decode table (docs/DECODE.md) at this commit, into $W.
mkdir -p $W/grid; t0=$(date +%s)
python3 -m attnkit_tools.grid --out $W/grid/PERFORMANCE.md --json $W/grid/grid.json > $W/grid/grid.log 2>&1
echo "grid rc=$? $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
python3 tools/decode_table.py --out $W/decode_table.json --md docs/DECODE.md > $W/decode_table.md 2> $W/decode_table.err
echo "decode_table rc=$? $(( $(date +%s) - t0 ))s"
cp docs/DECODE.md $W/DECODE.md

# The Triton grid (docs/PERFORMANCE.md's command) into $W/grid/.
mkdir -p $W/grid; t0=$(date +%s)
python3 -m attnkit_tools.grid --out $W/grid/PERFORMANCE.md --json $W/grid/grid.json > $W/grid/grid.log 2>&1
echo "grid rc=$? $(( $(date +%s) - t0 ))s" >> $W/grid/grid.log

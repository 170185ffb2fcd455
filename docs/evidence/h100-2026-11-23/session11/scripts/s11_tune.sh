# Tune every kernel of every family into $W/tune/<gpu_key>.json, then the grid with that table.
mkdir -p $W/tune
key=$(python3 -c "import torch; from attnkit.device import gpu_key; print(gpu_key(torch.device('cuda')))")
t0=$(date +%s)
python3 -m attnkit_tools.tune --out $W/tune/$key.json --jobs ${TUNE_JOBS:-15} > $W/tune/tune.log 2>&1
echo "tune rc=$? $(( $(date +%s) - t0 ))s" >> $W/tune/tune.log

# Nsight Compute counters of the Triton kernels and cuDNN's (issue 15). W is the results dir.
which ncu; ncu --version | tail -1
ncu --query-metrics 2>/dev/null | grep -i -E "tensor|gmma" > $W/ncu_tensor_metrics.txt
python3 tools/profile_attention.py list --cases $W/cases.json 2> $W/list.err; echo "list rc=$?"
ncu --clock-control none --profile-from-start off --csv --page raw \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis \
  python3 tools/profile_attention.py run > $W/counters.csv 2> $W/ncu.err; echo "ncu rc=$?"
python3 tools/profile_attention.py summarize $W/counters.csv --cases $W/cases.json > $W/counters.md 2>&1; echo "summarize rc=$?"

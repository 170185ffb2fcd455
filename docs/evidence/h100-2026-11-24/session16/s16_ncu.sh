# Nsight Compute counters of the Triton kernels and cuDNN's on every N >= 4096 cell (issue 15).
which ncu; ncu --version | tail -1
python3 -m attnkit_tools.profile list --cases $W/ncu_cases.json 2> $W/ncu_list.err; echo "list rc=$?"
ncu --clock-control none --profile-from-start off --csv --page raw \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis \
  python3 -m attnkit_tools.profile run > $W/ncu_counters.csv 2> $W/ncu.err; echo "ncu rc=$?"
python3 -m attnkit_tools.profile summarize $W/ncu_counters.csv --cases $W/ncu_cases.json --out $W/PROFILE.md; echo "summarize rc=$?"
gzip -k $W/ncu_counters.csv

#!/usr/bin/env bash
# Session-10 call 5: correctness on the GPU (the split with the merge kernel), the split's host
# and device profile, the decode table, an A/A run.
S=$(date +%s); D=${1:-585}
left() { echo $(( D - ($(date +%s) - S) )); }
WORKERS=16 bash scratch/call_s8.sh 190 ci
bash scratch/call_s8.sh 90 py:scratch/split_profile.py py:tools/decode_table.py
bash scratch/call_s8.sh $(( $(left) - 5 )) aa:1
cat /tmp/w/steps.txt

#!/usr/bin/env bash
# Session-10 call 6: correctness on the GPU with the prepared SDPA runs, and the per-call table.
WORKERS=16 bash scratch/call_s8.sh 190 ci
bash scratch/call_s8.sh 200 py:tools/per_call_cost.py
cat /tmp/w/steps.txt; grep -E "^(PASS|FAIL|UNCLEAR)" /tmp/w/per_call_cost.log

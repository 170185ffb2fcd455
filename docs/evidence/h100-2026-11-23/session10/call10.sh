#!/usr/bin/env bash
# Session-10 call 4: GPU correctness of the cuDNN split, zeroed-outputs on the B16 Triton
# benchmarks (host-bound by both sides now), an A/A run, the decode table.
S=$(date +%s); D=${1:-585}
left() { echo $(( D - ($(date +%s) - S) )); }
WORKERS=16 bash scratch/call_s8.sh 200 ci
PERF_ARGS="-k triton-bf16-B16" bash scratch/call_s8.sh 130 change:zeroed-outputs
mv /tmp/w/verify /tmp/w/verify_b16 2>/dev/null
bash scratch/call_s8.sh $(( $(left) - 80 )) aa:1
mv /tmp/w/verify /tmp/w/verify_aa 2>/dev/null
bash scratch/call_s8.sh $(( $(left) - 5 )) py:tools/decode_table.py
cat /tmp/w/steps.txt

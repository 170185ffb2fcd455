#!/usr/bin/env bash
# This GPU model's stored baseline, its stored spread and its paired A/A noise file, for the whole
# grid, in one command on one machine whose GPUs share the work (python -m attnkit_tools.gate.baselines;
# tox -e baselines). Writes baselines/<gpu_key>/{baseline,noise-stored,noise-paired}.json; commit them.
#
#   bash .ci/refresh-baselines.sh [--gpus 0,1,2,3] [--recordings 2] [--aa-runs 2] [--work DIR]
#   bash .ci/refresh-baselines.sh --cpu 2 --out build/try -- -k "naive and fwd"   # dry run, no GPU
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter would make a GPU run ~1000x slower; CI's CPU job sets it, a GPU run must not.
[ -n "${ATTNKIT_TEST_DEVICE:-}" ] || unset TRITON_INTERPRET
exec bash .ci/gpu-python.sh -m attnkit_tools.gate.baselines --tests tests/perf "$@"

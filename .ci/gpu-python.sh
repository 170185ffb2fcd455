#!/usr/bin/env bash
# Run the Python interpreter that holds the GPU build of torch, with this checkout's src/ first
# on the import path. Nothing is installed: GPU runners often reach no package registry, and the
# torch/triton they have must not be replaced. Used by .ci/gpu-gate.sh and tox's GPU envs.
#
#   bash .ci/gpu-python.sh -m pytest tests/perf ...
#
# ATTNKIT_PYTHON  the interpreter (default: python3 on PATH). Set it when torch lives in a
#                 virtual environment: a tox env made from a venv's python does not see that
#                 venv's packages, even with system_site_packages.
# ATTNKIT_ALLOW_CPU=1  run without a CUDA device (only to try the pipeline on a laptop).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${ATTNKIT_PYTHON:-python3}"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
# The compiled fast path (attnkit.fastpath): built for this torch on first import, once.
export ATTNKIT_FAST_CALLS="${ATTNKIT_FAST_CALLS:-build}"

if ! "$python" -c "import torch, pytest, pytest_benchmark, hypothesis" 2>/dev/null; then
    echo "gpu: $python cannot import torch, pytest, pytest-benchmark and hypothesis." >&2
    echo "     Point ATTNKIT_PYTHON at the interpreter that has them (docs/CI.md)." >&2
    exit 2
fi
if [ "${ATTNKIT_ALLOW_CPU:-0}" != 1 ] &&
    ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu: $python sees no CUDA device (torch.cuda.is_available() is False)." >&2
    exit 2
fi
exec "$python" "$@"

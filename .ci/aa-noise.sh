#!/usr/bin/env bash
# A/A noise of this GPU model: paired mode N times with the base a copy of this tree, then the
# per-benchmark noise file the gate reads (baselines/<gpu_key>/noise-paired.json). Commit it.
#
#   bash .ci/aa-noise.sh [N]       (default 5; tox -e aa-noise -- N)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
base="$out/base" && mkdir -p "$base" && cp -r src "$base/src"
for i in $(seq "$runs"); do
    bash .ci/gpu-python.sh -m pytest tests/perf -q -p no:cacheprovider --attnkit-base="$base" --attnkit-time-all \
        --attnkit-noise=none --attnkit-verdict-json="$out/verdict_$i.json" || true
done
key=$(bash .ci/gpu-python.sh -c "from attnkit.device import gpu_key; print(gpu_key())")
bash .ci/gpu-python.sh -m attnkit_perf.commands.noise "$out"/verdict_*.json --out "baselines/$key/noise-paired.json"

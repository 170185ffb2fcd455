#!/usr/bin/env bash
# Record this GPU model's stored-mode baseline on several machines, then pool the recordings
# (docs/PERF_GATE.md, "Recording a baseline"). A baseline of one recording cannot tell its
# machine's offset from the code's speed; the pooled one stores the spread between recordings
# (baselines/<gpu_key>/noise-stored.json) and stored mode holds each benchmark to it.
#
#   bash .ci/record-baseline.sh record DIR [N]      on each machine: N fresh processes (default 1),
#                                                   each writes DIR/recording-<host>-<i>.json
#   bash .ci/record-baseline.sh merge FILE FILE...  anywhere, no GPU: pool them into
#                                                   baselines/<gpu_key>/{baseline,noise-stored}.json
#
# Record on as many machines of the model as the fleet has (the spread's bound tightens with
# them: x9.7 the sd from 2 recordings, x2.5 from 4), all at one commit with a clean tree: the
# pooled baseline's commit is what a stored "slower" is adjudicated against in paired mode.
# PERF_ARGS: extra pytest arguments for each recording (e.g. "-k 'triton or graph'").
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash .ci/record-baseline.sh record DIR [N] | merge FILE FILE..."
step="${1:?$usage}"
shift
case "$step" in
    record)
        dir="${1:?$usage}"
        runs="${2:-1}"
        mkdir -p "$dir"
        # Recorded into a scratch baseline folder: one recording must not replace the pooled
        # baseline of the checkout.
        scratch=$(mktemp -d)
        # shellcheck disable=SC2206
        extra=(${PERF_ARGS:-})
        for i in $(seq "$runs"); do
            bash .ci/gpu-python.sh -m pytest tests/perf -q -p no:cacheprovider --attnkit-record \
                --attnkit-baseline-dir="$scratch" --benchmark-json="$dir/recording-$(hostname)-$i.json" \
                "${extra[@]}"
        done
        rm -rf "$scratch" ;;
    merge)
        [ "$#" -ge 2 ] || { echo "$usage (at least 2 recordings)" >&2; exit 2; }
        python="${ATTNKIT_PYTHON:-python3}"
        export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
        key=$("$python" -c "import json, sys; print(json.load(open(sys.argv[1]))['machine_info']['attnkit']['gpu_key'])" "$1")
        "$python" -m attnkit_perf.commands.pool "$@" --out "baselines/$key/baseline.json" ;;
    *)
        echo "$usage" >&2
        exit 2 ;;
esac

#!/usr/bin/env bash
# The GPU gate: what the self-hosted runner runs on every pull request (`tox -e gpu-gate` calls
# this; it also runs without tox, offline, on any machine whose python has a CUDA torch).
#
#   bash .ci/gpu-gate.sh [OUT_DIR]          (default: build/gpu-gate)
#
# 1. the correctness suite on the GPU           -> OUT_DIR/correctness.xml
# 2. the perf suite against this GPU's baseline -> OUT_DIR/benchmarks.json, OUT_DIR/verdict.json
# 3. the report, even when 1 or 2 failed        -> OUT_DIR/report/{report,summary}.md, *.png
#
# Exits 0 only when every step passed and a baseline was compared; otherwise non-zero, after
# every step has run, so a failing PR still gets its report.
#
# ATTNKIT_PYTHON           interpreter with torch (see .ci/gpu-python.sh)
# ATTNKIT_BASELINE_DIR     baseline root (default: the perf plugin's, baselines/)
# ATTNKIT_REQUIRE_BASELINE 1 (default): no baseline for this GPU fails the gate; 0: only warns
# ATTNKIT_PERF_ARGS        extra pytest arguments for the perf step (e.g. thresholds)
# HYPOTHESIS_PROFILE       correctness examples (default ci: derandomised, the same every run)
# ATTNKIT_TEST_WORKERS     pytest-xdist processes for the correctness step (default 4; 1: none)
set -uo pipefail
cd "$(dirname "$0")/.."

out="${1:-build/gpu-gate}"
gpu_python=(bash .ci/gpu-python.sh)
rm -rf "$out" && mkdir -p "$out"
# The interpreter would make the GPU run ~1000x slower; CI's CPU job sets it, a runner must not.
unset TRITON_INTERPRET
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"

# pytest exits 5 when it collected nothing: a suite that tests nothing has not passed.
pytest_status() {
    local status=$1
    if [ "$status" -eq 5 ]; then echo "no tests were collected" >&2; return 1; fi
    return "$status"
}

"${gpu_python[@]}" -c "import torch; print('torch', torch.__version__)" || exit $?

echo "== 1/3 correctness on the GPU"
# Most of this step is Triton compiling kernels for each drawn shape: with pytest-xdist present,
# test items compile and run in parallel processes sharing the GPU.
workers=()
if "${gpu_python[@]}" -c "import xdist" 2>/dev/null && [ "${ATTNKIT_TEST_WORKERS:-4}" -gt 1 ]; then
    workers=(-n "${ATTNKIT_TEST_WORKERS:-4}")
fi
"${gpu_python[@]}" -m pytest tests/correctness -q -p no:cacheprovider "${workers[@]}" --junitxml="$out/correctness.xml"
pytest_status $?
correctness=$?

echo "== 2/3 perf gate against this GPU's baseline"
perf_args=(--benchmark-compare --benchmark-json="$out/benchmarks.json" --attnkit-verdict-json="$out/verdict.json")
if [ -n "${ATTNKIT_BASELINE_DIR:-}" ]; then perf_args+=(--attnkit-baseline-dir="$ATTNKIT_BASELINE_DIR"); fi
# shellcheck disable=SC2086  # ATTNKIT_PERF_ARGS is a list of words on purpose
"${gpu_python[@]}" -m pytest tests/perf -p attnkit.bench.plugin -p no:cacheprovider "${perf_args[@]}" ${ATTNKIT_PERF_ARGS:-}
pytest_status $?
perf=$?
baseline=0
if [ ! -f "$out/verdict.json" ]; then
    echo "no verdict: nothing was compared (no baseline for this GPU?); see the perf output above" >&2
    if [ "${ATTNKIT_REQUIRE_BASELINE:-1}" = 1 ]; then baseline=1; fi
fi

echo "== 3/3 report"
report=0
if [ -f "$out/benchmarks.json" ]; then
    verdict_args=()
    if [ -f "$out/verdict.json" ]; then verdict_args=(--verdict "$out/verdict.json"); fi
    ATTNKIT_ALLOW_CPU=1 "${gpu_python[@]}" -m attnkit.bench.report \
        --benchmarks "$out/benchmarks.json" "${verdict_args[@]}" --out-dir "$out/report"
    report=$?
    [ "$report" -eq 0 ] && echo "report: $out/report/report.md"
else
    echo "no benchmark JSON: the perf step ended before writing it; no report" >&2
    report=1
fi

echo "== gpu-gate: correctness=$correctness perf=$perf baseline-missing=$baseline report=$report (0 = ok)"
[ "$correctness" -eq 0 ] && [ "$perf" -eq 0 ] && [ "$baseline" -eq 0 ] && [ "$report" -eq 0 ]

#!/usr/bin/env bash
# The GPU gate: what the self-hosted runner runs on every pull request (`tox -e gpu-gate` calls
# this; it also runs without tox, offline, on any machine whose python has a CUDA torch).
#
#   bash .ci/gpu-gate.sh [OUT_DIR]          (default: build/gpu-gate)
#
# 0. what the diff against ATTNKIT_BASE can affect  -> OUT_DIR/selection.json, decided once and
#    read by steps 1 and 2 (--attnkit-selection)
# 1. the correctness suite on the GPU                -> OUT_DIR/correctness.xml
#    what only a GPU can show: tests marked device_independent are left to the CPU CI. With
#    ATTNKIT_BASE: the PR tier, the tests of the backends the diff reaches (and every test when
#    shared code changed), without those marked nightly; otherwise, and with ATTNKIT_SELECT=all,
#    the nightly tier too (docs/TESTING.md, "Tiers"). The 25 slowest tests are printed.
# 2. the perf gate                                  -> OUT_DIR/verdict.json (+ benchmarks.json)
#    paired mode against ATTNKIT_BASE (the PR's merge base) when it is set, on the rows the diff
#    can affect; else stored mode against this GPU model's committed baseline, every row
# 3. the report, even when 1 or 2 failed            -> OUT_DIR/report/{report,summary}.md, *.png
#
# Exits 0 only when every step passed and a comparison was made; otherwise non-zero, after every
# step has run, so a failing PR still gets its report.
#
# ATTNKIT_PYTHON           interpreter with torch (see .ci/gpu-python.sh)
# ATTNKIT_BASE             git ref or checkout to compare with (paired mode); unset: stored mode
# ATTNKIT_SELECT           affected (default with ATTNKIT_BASE): run what the diff can affect
#                          (python -m attnkit_perf.select); all: every test and row
# ATTNKIT_PERF_WORKERS     pytest-xdist processes for paired mode, one per GPU (default: the GPU count)
# ATTNKIT_PERF_ARGS        extra pytest arguments for the perf step (e.g. thresholds)
# ATTNKIT_GATE_BUDGET      the PR tier's seconds for the whole gate (default 600): the perf step gets
#                          what the steps before it left, less 30 s for the report
# ATTNKIT_PERF_BUDGET      paired perf step's seconds (--attnkit-time-budget): default what
#                          ATTNKIT_GATE_BUDGET leaves (at least 60) for the PR tier
#                          (ATTNKIT_SELECT=affected), none with ATTNKIT_SELECT=all (nightly)
# ATTNKIT_PERF_OUT_OF_TIME rows the budget left undecided: pass (PR tier default: named, not
#                          failing; nightly measures them) or fail (default with ATTNKIT_SELECT=all)
# ATTNKIT_TEST_WORKERS     pytest-xdist processes for the correctness step (default 8; 1: none)
# ATTNKIT_TEST_TIER        pr: the GPU tests without the nightly ones (default with ATTNKIT_BASE and
#                          ATTNKIT_SELECT=affected); nightly: every GPU test (default otherwise);
#                          all: the device-independent tests as well
# ATTNKIT_SHARD            I/N: this runner's shard of the correctness tests and perf rows split over
#                          N runners (--attnkit-shard); merge the N verdicts with
#                          python -m attnkit_perf.report merge (docs/CI.md)
# HYPOTHESIS_PROFILE       correctness examples (default ci: derandomised, the same every run; the
#                          PR tier's default is pr, a third of ci's examples)
set -uo pipefail
# Stopped with SIGINT (Ctrl-C, or a caller's time limit): the running pytest reports what it ran,
# then the gate stops instead of going on to its next step.
trap 'echo "gpu-gate: interrupted after $SECONDS s" >&2; exit 130' INT
cd "$(dirname "$0")/.."

out="${1:-build/gpu-gate}"
gpu_python=(bash .ci/gpu-python.sh)
rm -rf "$out" && mkdir -p "$out"
# The interpreter would make the GPU run ~1000x slower; CI's CPU job sets it, a runner must not.
unset TRITON_INTERPRET
# A profile the caller names is kept; otherwise ci, or pr for the PR tier (step 1).
profile_given="${HYPOTHESIS_PROFILE:-}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"

# pytest exits 5 when it collected nothing: a suite that tests nothing has not passed.
pytest_status() {
    local status=$1
    if [ "$status" -eq 5 ]; then echo "no tests were collected" >&2; return 1; fi
    return "$status"
}

"${gpu_python[@]}" -c "import torch; print('torch', torch.__version__, '| GPUs', torch.cuda.device_count())" || exit $?
has_xdist=0
"${gpu_python[@]}" -c "import xdist" 2>/dev/null && has_xdist=1

select="${ATTNKIT_SELECT:-affected}"
case "$select" in affected|all) ;; *) echo "ATTNKIT_SELECT: expected affected or all, got '$select'" >&2; exit 2;; esac
selection_args=()
if [ -n "${ATTNKIT_BASE:-}" ] && [ "$select" = affected ] && [ ! -d "$ATTNKIT_BASE" ]; then
    echo "== 0/3 what the diff against $ATTNKIT_BASE can affect"
    "${gpu_python[@]}" -m attnkit_perf.select --base "$ATTNKIT_BASE" --json-out "$out/selection.json" || exit $?
    selection_args=(--attnkit-selection="$out/selection.json")
elif [ -n "${ATTNKIT_BASE:-}" ]; then
    echo "== every test and row runs (ATTNKIT_SELECT=$select, base $ATTNKIT_BASE)"
fi

echo "== 1/3 correctness on the GPU"
t0=$(date +%s)
shard=()
if [ -n "${ATTNKIT_SHARD:-}" ]; then shard=(--attnkit-shard="$ATTNKIT_SHARD"); fi
workers=()
if [ "$has_xdist" = 1 ] && [ "${ATTNKIT_TEST_WORKERS:-8}" -gt 1 ]; then
    workers=(-n "${ATTNKIT_TEST_WORKERS:-8}")
fi
tier="${ATTNKIT_TEST_TIER:-}"
if [ -z "$tier" ]; then
    if [ -n "${ATTNKIT_BASE:-}" ] && [ "$select" = affected ]; then tier=pr; else tier=nightly; fi
fi
case "$tier" in
    pr) tier_args=(-m "not device_independent and not nightly") ;;
    nightly) tier_args=(-m "not device_independent") ;;
    all) tier_args=() ;;
    *) echo "ATTNKIT_TEST_TIER: expected pr, nightly or all, got '$tier'" >&2; exit 2 ;;
esac
# The PR tier draws fewer hypothesis examples (each drawn shape compiles kernels); nightly keeps ci.
if [ "$tier" = pr ] && [ -z "$profile_given" ]; then
    export HYPOTHESIS_PROFILE=pr
fi
echo "tier: $tier ${tier_args[*]} (hypothesis profile $HYPOTHESIS_PROFILE)"
"${gpu_python[@]}" -m pytest tests/correctness -q -p no:cacheprovider "${workers[@]}" "${tier_args[@]}" \
    "${selection_args[@]}" "${shard[@]}" --durations=25 --junitxml="$out/correctness.xml"
pytest_status $?
correctness=$?
echo "correctness: $(( $(date +%s) - t0 )) s"

echo "== 2/3 perf gate"
t0=$(date +%s)
perf_args=(--attnkit-verdict-json="$out/verdict.json" "${shard[@]}")
report_args=(--verdict "$out/verdict.json")
if [ -n "${ATTNKIT_BASE:-}" ]; then
    gpus=$("${gpu_python[@]}" -c "import torch; print(torch.cuda.device_count())")
    n="${ATTNKIT_PERF_WORKERS:-$gpus}"
    perf_args+=(--attnkit-base="$ATTNKIT_BASE" --attnkit-select="$select")
    # The PR tier plans its rows within a time budget; every row runs nightly, with none.
    if [ "$select" = affected ]; then
        # What the whole gate's budget leaves once the steps before ran, 30 s kept for the report.
        budget=$(( ${ATTNKIT_GATE_BUDGET:-600} - SECONDS - 30 ))
        [ "$budget" -ge 60 ] || budget=60
        out_of_time=pass
    else
        budget=none out_of_time=fail
    fi
    budget="${ATTNKIT_PERF_BUDGET:-$budget}"
    out_of_time="${ATTNKIT_PERF_OUT_OF_TIME:-$out_of_time}"
    echo "perf time budget: $budget s; rows not decided in it: $out_of_time"
    perf_args+=(--attnkit-time-budget="$budget" --attnkit-out-of-time="$out_of_time")
    if [ "$has_xdist" = 1 ] && [ "$n" -gt 1 ]; then perf_args+=(-n "$n"); fi
else
    perf_args+=(--benchmark-compare --benchmark-json="$out/benchmarks.json")
    report_args+=(--benchmarks "$out/benchmarks.json")
fi
# shellcheck disable=SC2086  # ATTNKIT_PERF_ARGS is a list of words on purpose
"${gpu_python[@]}" -m pytest tests/perf -p no:cacheprovider "${perf_args[@]}" "${selection_args[@]}" ${ATTNKIT_PERF_ARGS:-}
pytest_status $?
perf=$?
echo "perf: $(( $(date +%s) - t0 )) s"
compared=0
if [ ! -f "$out/verdict.json" ]; then
    echo "no verdict: nothing was compared; see the perf output above" >&2
    compared=1
fi

echo "== 3/3 report"
t0=$(date +%s)
report=1
if [ -f "$out/verdict.json" ]; then
    ATTNKIT_ALLOW_CPU=1 "${gpu_python[@]}" -m attnkit_perf.report "${report_args[@]}" --out-dir "$out/report"
    report=$?
fi
echo "report: $(( $(date +%s) - t0 )) s"
echo "gpu-gate: $SECONDS s in all"

echo "== gpu-gate: correctness=$correctness perf=$perf not-compared=$compared report=$report (0 = ok)"
[ "$correctness" -eq 0 ] && [ "$perf" -eq 0 ] && [ "$compared" -eq 0 ] && [ "$report" -eq 0 ]

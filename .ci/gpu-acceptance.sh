#!/usr/bin/env bash
# The gate proven on a GPU, in one command (docs/CI.md, "Proving the gate on a GPU"). Run it after
# any change to the gate, the tests, or the kernels' dispatch.
#
#   bash .ci/gpu-acceptance.sh [--dry-run] [--step-timeout S] [--shards N | --side-by-side] OUT [STEP...]
#
# Steps (default: aa stored change:host-3us), each from cold caches (fresh Triton, Inductor and
# attnkit caches under a scratch folder), each writing OUT/<step>/ (the gate's folder, its log,
# its wall times), then OUT/summary.md (python -m attnkit_tools.gate.acceptance):
#
#   aa           the whole gate (.ci/gpu-gate.sh) on unchanged code against a copy of itself: a
#                scratch clone of this tree whose head commit adds a comment to src/attnkit/api.py
#                (shared code: the default selection runs every test and row), ATTNKIT_BASE the
#                tree's own commit. Every failure is a false alarm.
#   aa-all       the same with ATTNKIT_SELECT=all (the nightly tier: every test and row runs)
#   stored       stored mode on unchanged code: pytest tests/perf --benchmark-compare against this
#                GPU model's committed baseline. Every row not same or faster is a false alarm.
#   change:NAME  tests/perf/gate_changes/NAME.patch committed in a scratch clone, the whole gate
#                run on it, then its true effect measured side by side on the cases its first
#                line names (python -m attnkit_tools.gate.ab_dobench: alternating fresh processes;
#                python -m attnkit_tools.gate.detection: the gate's verdict beside it). Passes when the
#                gate failed on a row those cases name. (tests/perf/verify_gate_on_gpu.sh runs
#                the same patches through paired mode alone, many times.)
#
# The tree under test is this checkout's HEAD plus its uncommitted changes to tracked files.
# --dry-run prints each step's commands and runs nothing. --step-timeout S stops a step S seconds
# after it began, whichever of its commands is running (its verdict is then incomplete and the
# step fails). --shards N runs each step as N shards side by side (ATTNKIT_SHARD=I/N), each on a
# GPU and an equal share of the cores of its own, into OUT/shard-I/<step>/; the summary judges
# each step on its shards' merged verdict (OUT/<step>-merged/). --side-by-side runs the steps
# themselves side by side, each on a GPU and an equal share of the cores of its own (as many GPUs
# as steps), into OUT/<step>/ as usual. AB_ROUNDS: ab_dobench's rounds (3).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dry=0
step_timeout=
shards=1
side_by_side=0
usage() { echo "usage: bash .ci/gpu-acceptance.sh [--dry-run] [--step-timeout S] [--shards N | --side-by-side] OUT [aa|aa-all|stored|change:NAME ...]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1; shift ;;
        --step-timeout) [ $# -ge 2 ] || usage; step_timeout=$2; shift 2 ;;
        --step-timeout=*) step_timeout=${1#*=}; shift ;;
        --shards) [ $# -ge 2 ] || usage; shards=$2; shift 2 ;;
        --shards=*) shards=${1#*=}; shift ;;
        --side-by-side) side_by_side=1; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || usage
case $shards in ''|*[!0-9]*|0) echo "--shards: expected a count of GPUs (1 or more), got '$shards'" >&2; exit 2 ;; esac
if [ "$side_by_side" = 1 ] && [ "$shards" -gt 1 ]; then
    echo "--side-by-side and --shards $shards: give one (the steps side by side, or each step's shards)" >&2
    exit 2
fi
case $step_timeout in ''|*[!0-9]*) [ -z "$step_timeout" ] || { echo "--step-timeout: expected seconds, got '$step_timeout'" >&2; exit 2; } ;; esac
out=$(realpath -m "$1"); shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(aa stored change:host-3us)
# Every step is checked before anything runs: a typo must not cost a GPU run.
for step in "${steps[@]}"; do
    case $step in
        aa|aa-all|stored) ;;
        change:*)
            [ -f "$root/tests/perf/gate_changes/${step#change:}.patch" ] || {
                echo "$step: no tests/perf/gate_changes/${step#change:}.patch; there are:" \
                    "$(cd "$root/tests/perf/gate_changes" && ls -- *.patch | sed 's/\.patch$//' | tr '\n' ' ')" >&2
                exit 2
            } ;;
        *) echo "unknown step '$step': expected aa, aa-all, stored or change:NAME" >&2; exit 2 ;;
    esac
done

run() {  # print the command; run it unless --dry-run
    local line
    printf -v line '%q ' "$@"  # quoted where the shell needs it: a printed line can be pasted
    echo "+ ${line% }" >&2
    [ "$dry" = 1 ] || "$@"
}
limited() {  # a step's long command, within what --step-timeout leaves of the step ($t0: its start)
    [ -n "$step_timeout" ] || { run "$@"; return; }
    local left=$(( t0 + step_timeout - $(date +%s) ))
    if [ "$left" -lt 1 ]; then echo "no time left within --step-timeout $step_timeout for: $*" >&2; return 124; fi
    # SIGINT, as Ctrl-C: pytest then writes its JUnit file (the tests that finished, with their
    # seconds) and prints its slowest tests before it exits, where SIGTERM leaves nothing.
    run timeout --signal=INT --kill-after=30 "$left" "$@"
}
python=${ATTNKIT_PYTHON:-python3}  # the interpreter with the CUDA torch, as .ci/gpu-python.sh
git_id=(-c user.name=attnkit-acceptance -c user.email=acceptance@localhost)
# The scratch commits are dated as the tree's HEAD: the same step run on several runners (each
# with its ATTNKIT_SHARD) makes the same head commit, and their verdicts merge as one run's.
GIT_AUTHOR_DATE=$(git -C "$root" log -1 --format=%cI HEAD) GIT_COMMITTER_DATE=$(git -C "$root" log -1 --format=%cI HEAD)
export GIT_AUTHOR_DATE GIT_COMMITTER_DATE

# A scratch clone of the tree under test, its commit in $base: HEAD, plus a commit of the
# uncommitted changes to tracked files when there are any.
clone_tree() {  # $1: folder
    run git clone --quiet --no-hardlinks "$root" "$1"
    if [ "$dry" = 1 ]; then  # the commit the run would compare with (its tree's uncommitted changes aside)
        base=$(git -C "$root" rev-parse HEAD)
        git -C "$root" diff --quiet HEAD || echo "(the run commits the uncommitted changes too; base is that commit)" >&2
        return
    fi
    if ! git -C "$root" diff --quiet HEAD; then
        git -C "$root" diff --binary HEAD | git -C "$1" apply --index || return 1
        git "${git_id[@]}" -C "$1" commit --quiet -m "the tree under test" || return 1
    fi
    base=$(git -C "$1" rev-parse HEAD)
}

cold_env() {  # $1: cache folder; fresh caches for one step
    export ATTNKIT_CACHE_DIR=$1/attnkit TRITON_CACHE_DIR=$1/triton TORCHINDUCTOR_CACHE_DIR=$1/inductor
    run mkdir -p "$ATTNKIT_CACHE_DIR" "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/attnkit-acceptance.XXXXXX")
trap 'rm -rf "$scratch"' EXIT  # also when the run is stopped
if [ "$dry" = 1 ]; then
    # Nothing is written under OUT: an earlier run's results there stay as they are.
    echo "(dry run: nothing runs; OUT/... below stands for $out/...)"
    out=$scratch/OUT
fi
run_step() {  # $1: the step, $2: its folder, $3: a scratch folder of its own
    local step=$1 dir=$2 work=$3 name=${1/:/-}
    local tree=$work/$name
    rm -rf "$dir" && mkdir -p "$dir" "$work"
    echo "== $step${ATTNKIT_SHARD:+ (shard $ATTNKIT_SHARD)} -> $dir"
    t0=$(date +%s)
    (
        cold_env "$work/cache-$name"
        clone_tree "$tree" || exit 1
        case $step in
            aa|aa-all)
                run sh -c "echo '# unchanged code: the same source with one more comment' >> '$tree/src/attnkit/api.py'"
                run git "${git_id[@]}" -C "$tree" commit --quiet -am "no-op change"
                select=affected; [ "$step" = aa-all ] && select=all
                echo "cd $tree && ATTNKIT_SELECT=$select ATTNKIT_BASE=$base bash .ci/gpu-gate.sh $dir/gate" > "$dir/command"
                run cd "$tree" && limited env ATTNKIT_SELECT="$select" ATTNKIT_BASE="$base" bash .ci/gpu-gate.sh "$dir/gate" ;;
            stored)
                echo "cd $tree && bash .ci/gpu-python.sh -m pytest tests/perf -p no:cacheprovider --benchmark-compare" \
                    "--attnkit-verdict-json=$dir/verdict.json" > "$dir/command"
                run cd "$tree" && limited bash .ci/gpu-python.sh -m pytest tests/perf -p no:cacheprovider --benchmark-compare \
                    --attnkit-verdict-json="$dir/verdict.json" --benchmark-json="$dir/benchmarks.json" ;;
            change:*)
                patch=$root/tests/perf/gate_changes/${step#change:}.patch
                head -1 "$patch" | sed 's/^# cases: //' > "$dir/cases"
                # patch(1), as tests/perf/verify_gate_on_gpu.sh applies them: it takes a shifted context
                (run cd "$tree" && run patch -s -p1 -i "$patch") || exit 1
                run git "${git_id[@]}" -C "$tree" commit --quiet -am "planted change ${step#change:}"
                run git -C "$tree" worktree add --quiet --detach "$work/$name-base" "$base"
                echo "cd $tree && ATTNKIT_BASE=$base bash .ci/gpu-gate.sh $dir/gate" > "$dir/command"
                (run cd "$tree" && limited env ATTNKIT_BASE="$base" bash .ci/gpu-gate.sh "$dir/gate")
                gate=$?
                read -r -a words < "$dir/cases"
                run cd "$tree" && limited env PYTHONPATH="$tree/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -m attnkit_tools.gate.ab_dobench \
                    --base "$work/$name-base/src" --head "$tree/src" --match "${words[@]}" \
                    --rounds "${AB_ROUNDS:-3}" --out "$dir/ab.json" > "$dir/ab.txt"
                if [ -f "$dir/ab.json" ] && [ -f "$dir/gate/verdict.json" ]; then
                    run env PYTHONPATH="$tree/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -m attnkit_tools.gate.detection --effects "$dir/ab.json" \
                        --verdict "$dir/gate/verdict.json" --out "$dir/detection.md" > /dev/null
                fi
                exit "$gate" ;;
        esac
    ) 2>&1 | tee "$dir/log.txt"
    local status=${PIPESTATUS[0]}
    [ "$dry" = 1 ] && return
    echo "$status" > "$dir/status"
    {
        echo "wall time: $(( $(date +%s) - t0 )) s"
        grep -E '^(correctness|perf|report): [0-9]+ s$|^gpu-gate: [0-9]+ s in all$' "$dir/log.txt"
    } > "$dir/times"
    echo "== $step${ATTNKIT_SHARD:+ (shard $ATTNKIT_SHARD)}: exit $status, $(head -1 "$dir/times")"
}

mkdir -p "$out"
folders=()
# Lanes: a GPU and an equal share of the cores each, for the shards of a step or for the steps.
lanes=1
[ "$shards" -gt 1 ] && lanes=$shards
[ "$side_by_side" = 1 ] && lanes=${#steps[@]}
if [ "$lanes" -gt 1 ]; then
    if [ "$dry" = 1 ]; then
        read -r -a gpus <<< "$(seq 0 $(( lanes - 1 )) | tr '\n' ' ')"
    else
        read -r -a gpus <<< "$(PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH} "$python" -c 'from attnkit_perf.bench import visible_gpus; print(*visible_gpus())')"
    fi
    read -r -a cores <<< "$("$python" -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
    if [ "${#gpus[@]}" -lt "$lanes" ] || [ "${#cores[@]}" -lt "$lanes" ]; then
        what="--shards $shards"; [ "$side_by_side" = 1 ] && what="--side-by-side with ${#steps[@]} steps"
        echo "$what: needs $lanes GPUs and cores; ${#gpus[@]} GPU(s) (${gpus[*]}) and ${#cores[@]} core(s) visible" >&2
        exit 2
    fi
    per=$(( ${#cores[@]} / lanes ))
fi
lane() {  # $1: the lane (from 0), $2: what runs there; this subshell takes that lane's GPU and cores
    local share
    share=$(IFS=,; echo "${cores[*]:$(( $1 * per )):$per}")
    export CUDA_VISIBLE_DEVICES=${gpus[$1]}
    echo "+ $2: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES taskset -c $share" >&2
    [ "$dry" = 1 ] || taskset -cp "$share" "$BASHPID" > /dev/null
}
consoles=()
for step in "${steps[@]}"; do
    name=${step/:/-}
    if [ "$side_by_side" = 1 ]; then
        i=${#consoles[@]}
        folders+=("$out/$name")
        consoles+=("$out/$name.console")
        ( lane "$i" "$step"; run_step "$step" "$out/$name" "$scratch/step-$i" ) > "$out/$name.console" 2>&1 &
        [ "$dry" = 1 ] && wait  # printed one step after the other
        continue
    fi
    if [ "$shards" -le 1 ]; then
        run_step "$step" "$out/$name" "$scratch/step"
        folders+=("$out/$name")
        continue
    fi
    for i in $(seq "$shards"); do
        folders+=("$out/shard-$i/$name")
        mkdir -p "$out/shard-$i"
        (
            export ATTNKIT_SHARD=$i/$shards
            lane $(( i - 1 )) "shard $i/$shards"
            run_step "$step" "$out/shard-$i/$name" "$scratch/shard-$i"
        ) > "$out/shard-$i/$name.console" 2>&1 &
        [ "$dry" = 1 ] && wait  # printed one shard after the other
    done
    wait
    for i in $(seq "$shards"); do
        if [ "$dry" = 1 ]; then cat "$out/shard-$i/$name.console"; else tail -n 1 "$out/shard-$i/$name.console"; fi
    done
done
if [ "${#consoles[@]}" -gt 0 ]; then
    wait
    for console in "${consoles[@]}"; do
        if [ "$dry" = 1 ]; then cat "$console"; else tail -n 1 "$console"; fi
    done
fi
[ "$dry" = 1 ] && { rm -rf "$scratch"; exit 0; }
rm -rf "$scratch"
PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH} "$python" -m attnkit_tools.gate.acceptance "$out" "${folders[@]}"

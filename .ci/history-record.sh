#!/usr/bin/env bash
# Append one perf-suite run to the performance history and rebuild the dashboard: the nightly
# job's last step (docs/HISTORY.md). Needs no GPU.
#
#   bash .ci/history-record.sh RESULTS [OUT_DIR]          (default OUT_DIR: build/history)
#
# RESULTS is the pytest-benchmark JSON of a perf-suite run of this checkout's HEAD
# (`pytest tests/perf --benchmark-json=RESULTS`). The store is the orphan branch perf-history
# (runs only, no code); it is checked out into OUT_DIR/store, started when the remote has none,
# the run recorded as one new file, committed and pushed; the site is written to OUT_DIR/site.
#
# HISTORY_REMOTE   remote to fetch from and push to (default: origin)
# HISTORY_BRANCH   the store's branch (default: perf-history)
# GH_TOKEN         when set, sent as the HTTP credentials of fetch and push (the job's checkout
#                  keeps none)
# ATTNKIT_PYTHON   interpreter with jsonschema, asv and plotly (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

results="${1:?usage: bash .ci/history-record.sh RESULTS [OUT_DIR]}"
out="${2:-build/history}"
remote="${HISTORY_REMOTE:-origin}"
branch="${HISTORY_BRANCH:-perf-history}"
python="${ATTNKIT_PYTHON:-python3}"
store="$out/store"
history() { PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$python" -m attnkit_perf.history "$@"; }
git_auth() {
    if [ -n "${GH_TOKEN:-}" ]; then
        local basic
        basic=$(printf 'x-access-token:%s' "$GH_TOKEN" | base64 -w0)
        git -c "http.extraheader=AUTHORIZATION: basic $basic" "$@"
    else
        git "$@"
    fi
}

mkdir -p "$out"
git worktree remove --force "$store" 2>/dev/null || rm -rf "$store"
git worktree prune
if git_auth fetch --quiet "$remote" "+refs/heads/$branch:refs/remotes/$remote/$branch" 2>/dev/null; then
    git worktree add --quiet -B "$branch" "$store" "$remote/$branch"
else
    echo "history: $remote has no branch $branch; starting the store"
    git worktree add --quiet --detach "$store"
    git -C "$store" checkout --quiet --orphan "$branch"
    git -C "$store" rm -rfq .
fi

history record --results "$results" --store "$store"
git -C "$store" add -A
git -C "$store" -c user.name="attnkit perf history" -c user.email="perf-history@users.noreply.github.com" \
    commit --quiet -m "Record the perf suite at $(git rev-parse --short HEAD)"
# Every run is a file of its own, so a push that lost a race rebases without conflict.
for attempt in 1 2 3; do
    if git_auth -C "$store" push --quiet "$remote" "$branch"; then break; fi
    [ "$attempt" = 3 ] && { echo "history: could not push $branch" >&2; exit 1; }
    git_auth -C "$store" pull --quiet --rebase "$remote" "$branch"
done

history publish --store "$store" --out "$out/site"

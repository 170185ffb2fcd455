#!/usr/bin/env bash
# Validate the GitHub workflows offline: schema (check-jsonschema's vendored GitHub schema) and
# security audit (zizmor, no network). One script so .ci/run, `tox -e lint` and the CPU workflow
# check the same things.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
if [ "${#workflows[@]}" -eq 0 ]; then echo "no workflows under .github/workflows" >&2; exit 1; fi
check-jsonschema --builtin-schema vendor.github-workflows "${workflows[@]}"
# Any finding fails, whatever its severity: the workflows are small enough to keep clean.
zizmor --offline --no-progress .github/workflows

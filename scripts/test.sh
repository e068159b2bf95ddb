#!/usr/bin/env bash
# Runs every test of the suite: formatting, lints, then the unit,
# integration, binary and conformance tests (the root-only ones use real
# loop devices and mounts, and clean up after themselves).
set -euo pipefail
cd "$(dirname "$0")/.."

phase() {
  local name=$1; shift
  local start=$SECONDS
  echo "== $name"
  "$@"
  echo "== $name: $((SECONDS - start)) s"
}

phase "prerequisites" bash scripts/install-test-deps.sh
phase "cargo fmt --check" cargo fmt --all -- --check
phase "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
phase "cargo test" bash -o pipefail -c 'cargo test --workspace --locked 2>&1 | tee "$0"' "$log"

# one closing line for the whole run (cargo ends on per-crate summaries,
# often a doc-test one with nothing in it)
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"

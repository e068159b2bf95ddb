#!/usr/bin/env bash
# Runs every test of the suite: formatting, lints, the unit, integration,
# binary and conformance tests against the OpenStack emulator (the
# root-only ones use real loop devices and mounts, and clean up after
# themselves), then the contract tests against a real OpenStack brought up
# on loopback by tests/openstack/cloud.py and taken down again.
set -euo pipefail
cd "$(dirname "$0")/.."

cloud_profile=${OS_TEST_CLOUD_PROFILE:-all}
log=$(mktemp)
cloud_started=
cleanup() {
  if [[ -n $cloud_started ]]; then
    python3 tests/openstack/cloud.py down || true
  fi
  rm -f "$log"
}
trap cleanup EXIT

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
phase "manifests (deploy/)" python3 deploy/validate.py
phase "cargo test (emulator tier)" bash -o pipefail -c 'cargo test --workspace --locked 2>&1 | tee -a "$0"' "$log"

cloud_started=1
phase "real OpenStack up ($cloud_profile)" python3 tests/openstack/cloud.py up "$cloud_profile"
phase "contract tests (real OpenStack)" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p openstack-client --test contract 2>&1 | tee -a "$0"' "$log"
phase "KMS plugin against real Keystone + Barbican" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p kms-barbican --test plugin 2>&1 | tee -a "$0"' "$log"
phase "Cinder CSI conformance (real OpenStack)" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p csi-sanity --test drivers cinder_conforms_on_the_real_cloud -- --nocapture 2>&1 | tee -a "$0"' "$log"
phase "Cinder credentials rotated under a running controller (real Keystone)" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p csi-sanity --test drivers cinder_credentials_rotate_on_the_real_cloud -- --ignored --nocapture 2>&1 | tee -a "$0"' "$log"
phase "Manila CSI on real Manila + Ceph (ceph-fuse)" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p csi-manila --test real_cloud -- --ignored 2>&1 | tee -a "$0"' "$log"
phase "Manila CSI conformance (real Manila + Ceph)" bash -o pipefail -c \
  'OPENSTACK_TEST_BACKEND=real cargo test --locked -p csi-sanity --test drivers manila_cephfs_conforms_on_the_real_cloud -- --ignored --nocapture 2>&1 | tee -a "$0"' "$log"
phase "real OpenStack down" python3 tests/openstack/cloud.py down
cloud_started=

# one closing line for the whole run (cargo ends on per-crate summaries,
# often a doc-test one with nothing in it)
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"

#!/usr/bin/env bash
# The suite's main job on one machine, with no cloud: builds the three
# plugins and `suite-walk` once (debug profile: the quickest way to a first
# result), then walks them on the embedded OpenStack emulator the way
# Kubernetes drives them: a Cinder volume (a real loop device, formatted,
# mounted, written, grown, snapshotted, restored), a Manila share published
# to two pods, and KMS v2 encryption under a Barbican key with a rotation.
# As root the node steps mount for real; otherwise they are skipped and
# said so. Everything it starts is stopped, unmounted and detached at the
# end, also on failure or Ctrl-C.
#
#   bash scripts/run-local.sh                      # the walk on the emulator
#   bash scripts/run-local.sh --cloud-config FILE  # preflight of a real cloud
#   bash scripts/run-local.sh --help               # every option
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
echo "== building the plugins and suite-walk (first build: a few minutes)"
cargo build --locked --bins -p csi-cinder -p csi-manila -p kms-barbican -p suite-walk
exec target/debug/suite-walk "$@"

#!/usr/bin/env bash
# The suite's main job on one machine, with no cloud: starts the OpenStack
# emulator, takes the client library through a full Keystone → Cinder →
# Nova → Manila → Barbican tour against it, runs the Cinder CSI driver's
# full conformance suite against it (as root: attachments become loop
# devices, staging formats and mounts for real), and checks the Manila
# plugin's Identity service.
# Everything it starts is stopped at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
cargo build --release --locked --bins --examples -p openstack-emulator -p openstack-client -p csi-cinder -p csi-manila -p csi-sanity
bin=target/release

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/openstack-emulator" --listen 127.0.0.1:0 --write-cloud-conf "$work/cloud.conf" \
  --write-clouds-yaml "$work/clouds.yaml" >"$work/emulator.out" 2>"$work/emulator.log" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$work/emulator.out" && break; sleep 0.05; done
grep listening "$work/emulator.out"

echo "== client library tour against the emulator"
server=$(curl -fsS -X POST -H 'Content-Type: application/json' \
  -d '{"name":"local-node"}' "$(awk '{print $NF}' "$work/emulator.out")_admin/servers" 2>/dev/null \
  | sed -n 's/.*"id":"\([^"]*\)".*/\1/p' || true)
if [[ -n "$server" ]]; then
  "$bin/examples/tour" --cloud-config "$work/cloud.conf" --server "$server"
else
  "$bin/examples/tour" --cloud-config "$work/cloud.conf"
fi

echo "== Cinder CSI driver: conformance suite against the emulator"
if [[ $(id -u) == 0 ]]; then
  bash tests/sanity/cinder/run-on-emulator.sh
else
  echo "(not root: controller only, Identity checks; the node service needs loop devices and mounts)"
  "$bin/cinder-csi-plugin" --endpoint "unix://$work/cinder.sock" --cloud-config "$work/cloud.conf" \
    --provide-node-service=false 2>"$work/cinder.log" &
  pids+=($!)
  for _ in $(seq 100); do [[ -S $work/cinder.sock ]] && break; sleep 0.05; done
  "$bin/csi-sanity" --endpoint "unix://$work/cinder.sock"
fi

echo "== Manila CSI plugin (Identity) against the emulator"
"$bin/manila-csi-plugin" --endpoint "unix://$work/manila.sock" --share-protocol-selector NFS \
  --drivername nfs.manila.csi.openstack.org 2>"$work/manila.log" &
pids+=($!)
for _ in $(seq 100); do [[ -S $work/manila.sock ]] && break; sleep 0.05; done
"$bin/csi-sanity" --endpoint "unix://$work/manila.sock"
echo "all good"

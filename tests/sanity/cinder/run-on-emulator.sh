#!/usr/bin/env bash
# Starts cinder-csi-plugin (controller and node) against the OpenStack
# emulator, whose hypervisor turns attachments into loop devices, and runs
# a conformance suite against it. Needs root. Everything started is
# stopped, unmounted and detached at the end, also on failure.
#
#   tests/sanity/cinder/run-on-emulator.sh            # our csi-sanity, full suite
#   tests/sanity/cinder/run-on-emulator.sh upstream   # the community's csi-sanity ($CSI_SANITY)
#   tests/sanity/cinder/run-on-emulator.sh -- CMD...  # any command; it gets
#       CSI_ENDPOINT, CSI_MOUNT_DIR, CSI_STAGING_DIR, CSI_PARAMETERS, CSI_SECRETS
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
cd "$repo"

[[ $(id -u) == 0 ]] || { echo "needs root (loop devices, mounts)" >&2; exit 2; }
# the community's csi-sanity: $CSI_SANITY, else master from $CSI_SANITY_DIR
# (README: "Supplying the Kubernetes and csi-sanity binaries"), else
# csi-sanity-upstream on PATH
upstream_bin=${CSI_SANITY:-${CSI_SANITY_DIR:-/nonexistent}/csi-sanity-master}
[[ -x $upstream_bin ]] || upstream_bin=$(command -v csi-sanity-upstream || true)
if [[ ${1:-} == upstream && -z $upstream_bin ]]; then
  echo "no community csi-sanity: set CSI_SANITY (a binary) or CSI_SANITY_DIR (a folder holding" >&2
  echo "csi-sanity-master), or put csi-sanity on PATH as csi-sanity-upstream" >&2
  exit 2
fi
# the same profile and packages as scripts/run-local.sh and the tests: built once
cargo build --locked --bins -p openstack-emulator -p csi-cinder -p csi-sanity
bin=$repo/target/debug

work=$(mktemp -d /tmp/cinder-sanity.XXXXXX)
pids=()
status=0
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # anything the run left mounted below the work directory, deepest first
  { findmnt -rn -o TARGET | grep "^$work/" | sort -r | while read -r m; do umount -l "$m" || true; done; } || true
  if [[ $rc == 0 && $status == 0 ]]; then
    rm -rf "$work"
  else
    # a failed run keeps its logs (the plugin's and the emulator's)
    find "$work" -mindepth 1 -maxdepth 1 ! -name '*.log' -exec rm -rf {} + 2>/dev/null || true
    echo "logs of the failed run kept in $work (plugin.log, emulator.log)" >&2
  fi
}
trap cleanup EXIT

"$bin/openstack-emulator" --listen 127.0.0.1:0 --availability-zones nova \
  --hypervisor-by-id-dir "$work/by-id" --hypervisor-image-dir "$work/images" \
  --write-cloud-conf "$work/cloud.conf" >"$work/emulator.out" 2>"$work/emulator.log" &
pids+=($!)
for _ in $(seq 200); do grep -q listening "$work/emulator.out" && break; sleep 0.05; done
url=$(awk '/listening/ {print $NF}' "$work/emulator.out")
server=$(curl -fsS -X POST -H 'Content-Type: application/json' -d '{"name":"sanity-node"}' "${url}_admin/servers" \
  | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
curl -fsS -X PUT -H 'Content-Type: application/json' -d "{\"server_id\":\"$server\"}" "${url}_admin/metadata-instance"
printf '\n[Metadata]\nsearch-order = metadataService\n' >>"$work/cloud.conf"

mkdir -p "$work/kubelet/mount" "$work/kubelet/staging"
"$bin/cinder-csi-plugin" --endpoint "unix://$work/csi.sock" --cloud-config "$work/cloud.conf" \
  --by-id-dir "$work/by-id" --metadata-url "$url" --path-root "$work/kubelet" \
  --cluster sanity 2>"$work/plugin.log" &
pids+=($!)
for _ in $(seq 200); do [[ -S $work/csi.sock ]] && break; sleep 0.05; done
echo "plugin on unix://$work/csi.sock (node $server); log: $work/plugin.log (kept if the run fails)"

export CSI_ENDPOINT=unix://$work/csi.sock CSI_MOUNT_DIR=$work/kubelet/mount CSI_STAGING_DIR=$work/kubelet/staging \
  CSI_PARAMETERS=$here/parameters.yaml CSI_SECRETS=$here/secrets.yaml
case "${1:-}" in
  "")
    "$bin/csi-sanity" --endpoint "$CSI_ENDPOINT" --mount-dir "$work/kubelet/sanity" \
      --parameters "$CSI_PARAMETERS" --secrets "$CSI_SECRETS" \
      --mutable-parameters "$here/mutable-parameters.yaml" \
      --expansion-fs-type "${EXPANSION_FS_TYPE:-xfs}" || status=$?
    ;;
  upstream)
    "$upstream_bin" --csi.endpoint="$CSI_ENDPOINT" --csi.mountdir="$CSI_MOUNT_DIR/target" \
      --csi.stagingdir="$CSI_STAGING_DIR/target" --csi.testvolumeparameters="$CSI_PARAMETERS" \
      --csi.testvolumemutableparameters="$here/mutable-parameters.yaml" \
      --csi.testnodevolumeattachlimit || status=$?
    ;;
  --)
    shift
    "$@" || status=$?
    ;;
  *) echo "usage: $0 [upstream | -- CMD...]" >&2; exit 2 ;;
esac
[[ $status == 0 ]] || { echo "--- plugin log (tail)"; tail -40 "$work/plugin.log"; }
exit $status

#!/usr/bin/env bash
# Builds one OCI image per plugin without any container registry or
# daemon: a minimal Debian bookworm root filesystem from Debian's packages
# (mmdebstrap, essential variant plus what the plugin runs), the plugin's
# binary in /usr/local/bin as the entrypoint, written as an OCI layout with
# umoci. Then checks each image: its binary runs inside its root filesystem
# (--version, --help), the host tools its node service calls are there,
# and every container of deploy/suite and of the KMS plugin (DaemonSet and
# static pod) that uses
# the image names a binary the image holds with flags that binary accepts.
#
#   deploy/images/build.sh [OUT_DIR]     (default target/images)
#
# IMAGE_PROFILE=release (default) or debug picks the cargo profile of the
# binaries (CI reuses the debug build of its tests). IMAGE_BASE_CACHE: a
# folder where Debian's root filesystems are kept for a week (see
# base_root; unset, each build makes them afresh). Load an image into a
# runtime or registry with e.g. `skopeo copy
# oci:target/images/oci:cinder-csi-plugin docker://REGISTRY/cinder-csi-plugin:0.1.0`. Needs root (mmdebstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-target/images}
profile=${IMAGE_PROFILE:-release}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

[[ $(id -u) == 0 ]] || { echo "needs root (mmdebstrap, chroot)" >&2; exit 2; }
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v umoci >/dev/null || need+=(umoci)
command -v kubectl >/dev/null || { echo "kubectl is needed to render deploy/suite" >&2; exit 2; }
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade "${need[@]}" >/dev/null
fi

if [[ $profile == release ]]; then
  cargo build --release --locked --bins -p csi-cinder -p csi-manila -p kms-barbican
  bin_dir=target/release
else
  # the binaries of the tests' single build (scripts/test.sh)
  bin_dir=target/debug
fi

# plugin binary | Debian packages | host tools the binary calls
images=(
  "cinder-csi-plugin|ca-certificates,util-linux,mount,e2fsprogs,xfsprogs,btrfs-progs,udev|blkid mkfs.ext4 mkfs.xfs mkfs.btrfs btrfs resize2fs xfs_growfs udevadm"
  "manila-csi-plugin|ca-certificates,util-linux,mount,ceph-fuse,ceph-common,nfs-common,fuse3|ceph-fuse mount mount.ceph mount.nfs fusermount3"
  "barbican-kms-plugin|ca-certificates|"
)

# base_root PACKAGES DIR: Debian's root filesystem with PACKAGES in DIR,
# from mmdebstrap; with IMAGE_BASE_CACHE set (the test command sets it),
# from a tarball of it made there by an earlier run, while that is less
# than IMAGE_BASE_MAX_DAYS (7) old: mmdebstrap took 66 to 101 s an image,
# on the cluster tier's critical path. The tarball's name carries a hash
# of what it was made from (suite, mirror, packages, options,
# mmdebstrap's version), so a changed package list makes a new one.
base_root() {
  local packages=$1 dir=$2 key tarball
  local options=(--quiet --variant=essential --include="$packages"
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*')
  if [[ -z ${IMAGE_BASE_CACHE:-} ]]; then
    mmdebstrap "${options[@]}" "$suite" "$dir" "$mirror"
    return
  fi
  mkdir -p "$IMAGE_BASE_CACHE"
  key=$(printf '%s\n' "$suite" "$mirror" "${options[@]}" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)
  tarball=$IMAGE_BASE_CACHE/$suite-$key.tar
  if [[ -n $(find "$tarball" -mtime -"${IMAGE_BASE_MAX_DAYS:-7}" 2>/dev/null) ]]; then
    echo "   base: $tarball (made $(date -r "$tarball" +%F))"
  else
    # another image's stale tarballs go first (each is 150 to 230 MB)
    find "$IMAGE_BASE_CACHE" -name "$suite-*.tar" -mtime +"${IMAGE_BASE_MAX_DAYS:-7}" -delete
    rm -f "$tarball.partial.tar"
    mmdebstrap "${options[@]}" "$suite" "$tarball.partial.tar" "$mirror"
    mv "$tarball.partial.tar" "$tarball"
    echo "   base: made $tarball"
  fi
  mkdir -p "$dir"
  tar -xpf "$tarball" -C "$dir" --numeric-owner
}

rm -rf "$out/oci" "$out/bundles"
mkdir -p "$out/bundles"
# the unpacked root filesystems are only for the checks below
trap 'rm -rf "$out/bundles"' EXIT
umoci init --layout "$out/oci"
for spec in "${images[@]}"; do
  IFS='|' read -r name packages tools <<<"$spec"
  start=$SECONDS
  bundle=$out/bundles/$name
  rootfs=$out/bundles/$name.rootfs
  echo "-- image $name: Debian $suite + $packages"
  base_root "$packages" "$rootfs"
  install -D -m 0755 "$bin_dir/$name" "$rootfs/usr/local/bin/$name"
  # upstream's image keeps its binary at /bin/NAME, which its charts and
  # manifests name (in `args`, or in a `sh -c` command): here too, so that
  # they run ours unchanged (/bin is /usr/bin in Debian)
  ln -s "../local/bin/$name" "$rootfs/usr/bin/$name"
  umoci new --image "$out/oci:$name"
  umoci unpack --image "$out/oci:$name" "$bundle" >/dev/null
  rm -rf "$bundle/rootfs"
  mv "$rootfs" "$bundle/rootfs"
  umoci repack --image "$out/oci:$name" "$bundle"
  umoci config --image "$out/oci:$name" \
    --config.entrypoint "/usr/local/bin/$name" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version"
  echo "   $(du -sh "$bundle/rootfs" | cut -f1) unpacked, $((SECONDS - start)) s"

  # the binary runs in its own root filesystem
  chroot "$bundle/rootfs" "/usr/local/bin/$name" --version
  chroot "$bundle/rootfs" "/usr/local/bin/$name" --help >/dev/null
  chroot "$bundle/rootfs" "/bin/$name" --version >/dev/null
  for tool in $tools; do
    chroot "$bundle/rootfs" /bin/sh -c "command -v $tool" >/dev/null \
      || { echo "image $name lacks $tool" >&2; exit 1; }
  done
done

# every container of the suite that runs one of these images: its binary
# is in the image, and its flags are accepted (`--help` after them parses
# them all first)
kubectl kustomize deploy/suite >"$out/suite.yaml"
kubectl kustomize deploy/kms/base >"$out/kms.yaml"
py=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
  # PyYAML comes with the manifest validator's tools
  tools_venv=${DEPLOY_VALIDATE_VENV:-.venv-tools}
  [[ -x $tools_venv/bin/python ]] || python3 deploy/validate.py >/dev/null
  py=$tools_venv/bin/python
fi
"$py" - "$out" <<'EOF'
import subprocess, sys
import yaml
out = sys.argv[1]
ours = {"cinder-csi-plugin", "manila-csi-plugin", "barbican-kms-plugin"}
checked = 0
# the whole suite as rendered, and the KMS plugin's static pod
docs = [*yaml.safe_load_all(open(f"{out}/suite.yaml")), *yaml.safe_load_all(open(f"{out}/kms.yaml")),
        *yaml.safe_load_all(open("deploy/kms/barbican-kms-plugin.pod.yaml"))]
for d in docs:
    if not d or d.get("kind") not in ("Deployment", "DaemonSet", "Pod"):
        continue
    spec = d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]
    for c in spec["containers"]:
        image = c["image"].rsplit("/", 1)[-1].split(":")[0]
        if image not in ours:
            continue
        binary = (c.get("command") or [f"/usr/local/bin/{image}"])[0]
        root = f"{out}/bundles/{image}/rootfs"
        r = subprocess.run(["chroot", root, binary, *c.get("args", []), "--help"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{d['kind']}/{d['metadata']['name']} container {c['name']}: {binary} refuses its flags:\n{r.stderr}")
        checked += 1
if checked < 8:
    sys.exit(f"only {checked} containers of deploy/ run our images")
print(f"images: {checked} containers of deploy/suite and of the KMS plugin checked against their images")
EOF
# upstream's own manifests (UPSTREAM_CPO_DIR, never kept here: another
# project's source), their image swapped for ours: each container that
# runs one of our images starts our binary with upstream's command line.
# Kubernetes expands $(VAR) from the container's env before the runtime
# sees it; a `sh -c` line runs through the image's shell.
if [[ -n ${UPSTREAM_CPO_DIR:-} ]]; then
  [[ -d $UPSTREAM_CPO_DIR/manifests ]] || { echo "UPSTREAM_CPO_DIR=$UPSTREAM_CPO_DIR holds no manifests/" >&2; exit 1; }
  "$py" - "$out" "$UPSTREAM_CPO_DIR/manifests" <<'EOF'
import glob, re, subprocess, sys
import yaml
out, manifests = sys.argv[1], sys.argv[2]
ours = {"cinder-csi-plugin", "manila-csi-plugin", "barbican-kms-plugin"}
checked = set()
for path in sorted(glob.glob(f"{manifests}/*/*.yaml")):
    for d in yaml.safe_load_all(open(path)):
        if not d or d.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet", "Pod"):
            continue
        spec = d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            image = c["image"].rsplit("/", 1)[-1].split(":")[0]
            if image not in ours:
                continue
            env = {e["name"]: e.get("value", "from-a-reference") for e in c.get("env", [])}
            def expand(a):
                a = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
                # upstream's Manila manifests are templates: the operator
                # writes the protocol and the partner plugin in
                return a.replace("SHARE-PROTOCOL", "NFS").replace("FWD-NODEPLUGIN", "csi-nfsplugin")
            argv = [expand(a) for a in (c.get("command") or [f"/usr/local/bin/{image}"]) + c.get("args", [])]
            if argv[:2] == ["/bin/sh", "-c"]:
                argv = ["/bin/sh", "-c", " ".join(argv[2:]) + " --help"]
            else:
                argv.append("--help")
            r = subprocess.run(["chroot", f"{out}/bundles/{image}/rootfs", *argv], capture_output=True, text=True)
            where = f"{path.split('/manifests/')[-1]}: {d['kind']}/{d['metadata']['name']} container {c['name']}"
            if r.returncode != 0 or "Usage" not in r.stdout:
                sys.exit(f"upstream's {where}: our image refuses its command line {argv}:\n{r.stderr}")
            checked.add(where)
if len(checked) < 5:
    sys.exit(f"only {len(checked)} containers of upstream's manifests run our images: {sorted(checked)}")
print(f"images: {len(checked)} containers of upstream's manifests (UPSTREAM_CPO_DIR) run ours with their command lines")
EOF
else
  echo "images: upstream's manifests not checked (UPSTREAM_CPO_DIR unset)"
fi
rm -rf "$out/bundles"
echo "OCI layout: $out/oci (tags: $(umoci ls --layout "$out/oci" | tr '\n' ' '))"

"""The images the nodes run: ours (from deploy/images/build.sh's OCI
layout), the sidecars and Kubernetes' pause and the test pods' busybox,
each a one-layer OCI archive imported into every node's containerd."""

import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

from .config import (
    APP_IMAGE,
    CONTAINERD_SOCK,
    ClusterError,
    IMAGES_OCI,
    OVERLAY,
    PAUSE_IMAGE,
    REPO,
    SIDECARS,
    STATE,
    TARGET,
    binary,
    log,
    run,
    sidecar_version,
)
from .pki import kubectl
from .suite import addons


def layer_from_files(files):
    """A gzipped tar layer of (path in image, source file or None for a
    directory, symlink target or None, mode); returns (blob, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, src, link, mode in files:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mtime = 0
            info.uid = info.gid = 0
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                info.mode = 0o777
                tar.addfile(info)
            elif src is None:
                info.type = tarfile.DIRTYPE
                info.mode = mode
                tar.addfile(info)
            else:
                data = Path(src).read_bytes()
                info.size = len(data)
                info.mode = mode
                tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    blob = gzip.compress(raw.getvalue(), compresslevel=1, mtime=0)
    return blob, diff_id


def oci_archive(path, images):
    """An OCI image layout tar holding `images`: name → (layer blob,
    diff_id, image config dict). Each manifest is named for containerd
    (`io.containerd.image.name`)."""
    blobs, manifests = {}, []

    def put(data):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    for name, (layer, diff_id, config) in images.items():
        cfg = {"architecture": "amd64", "os": "linux", "config": config,
               "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               **put(json.dumps(cfg).encode())},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(layer)}]}
        m = put(json.dumps(manifest).encode())
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
                          "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}})
    write_layout_tar(path, blobs, {"schemaVersion": 2, "manifests": manifests})


def write_layout_tar(path, blobs, index):
    with tarfile.open(path, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest}", data)


def single_binary_image(binary_path, name_in_image, entrypoint_args=()):
    layer, diff_id = layer_from_files([
        ("/tmp", None, None, 0o1777),
        (f"/{name_in_image}", binary_path, None, 0o755),
    ])
    config = {"Entrypoint": [f"/{name_in_image}", *entrypoint_args],
              "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    return layer, diff_id, config


def busybox_image():
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    files = [("/bin", None, None, 0o755), ("/tmp", None, None, 0o1777), ("/bin/busybox", "/bin/busybox", None, 0o755)]
    files += [(f"/bin/{a}", None, "busybox", 0) for a in applets if a != "busybox"]
    layer, diff_id = layer_from_files(files)
    return layer, diff_id, {"Cmd": ["sh"], "Env": ["PATH=/bin"]}


def our_images_archive(path, names):
    """Our three images, from deploy/images/build.sh's OCI layout, named as
    deploy/ names them."""
    index = json.loads((IMAGES_OCI / "index.json").read_text())
    by_tag = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m for m in index["manifests"]}
    manifests = []
    for tag, full_name in names.items():
        m = by_tag.get(tag)
        if m is None:
            raise ClusterError(f"{IMAGES_OCI} has no image {tag}: run deploy/images/build.sh")
        manifests.append({**m, "annotations": {"io.containerd.image.name": full_name,
                                               "org.opencontainers.image.ref.name": full_name.rsplit(":", 1)[-1]}})
    blobs = {}
    needed = [m["digest"] for m in manifests]
    while needed:
        digest = needed.pop().split(":", 1)[1]
        if digest in blobs:
            continue
        data = (IMAGES_OCI / "blobs" / "sha256" / digest).read_bytes()
        blobs[digest] = data
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and "layers" in doc:
            needed += [doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]
    write_layout_tar(path, blobs, {"schemaVersion": 2, "manifests": manifests})


def images_wanted():
    """Every image the rendered overlay, the add-ons and the KMS static pod
    name."""
    texts = [kubectl("kustomize", OVERLAY), addons(),
             (REPO / "deploy" / "kms" / "barbican-kms-plugin.pod.yaml").read_text()]
    names = {n for t in texts for n in re.findall(r"^\s*(?:- )?image:\s*(\S+)\s*$", t, re.M)}
    return {n.strip("'\"") for n in names}


def ctr(*args, check=True, timeout=300, node=None):
    sock = node.containerd_sock if node else CONTAINERD_SOCK
    cmd = ["ctr", "--address", sock, "--namespace", "k8s.io", *args]
    if check:
        return run(cmd, timeout=timeout)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def import_images(all_nodes):
    """Builds and imports every image the nodes run (trap 5: nothing can be
    pulled): the pause image (catatonit -P), the CSI sidecars from their
    binaries, a busybox for test pods, and ours from deploy/images."""
    if not (IMAGES_OCI / "index.json").exists():
        log("no OCI layout of our images: building them (deploy/images/build.sh, debug binaries)")
        run(["cargo", "build", "--locked", "--bins", "-p", "csi-cinder", "-p", "csi-manila", "-p", "kms-barbican"],
            cwd=REPO, timeout=3600)
        run(["bash", REPO / "deploy" / "images" / "build.sh", TARGET / "images"], cwd=REPO, timeout=3600,
            env={**os.environ, "IMAGE_PROFILE": "debug"})
    out = STATE / "images"
    out.mkdir(exist_ok=True)
    wanted = images_wanted() | {PAUSE_IMAGE, APP_IMAGE}
    built, ours = {}, {}
    for name in sorted(wanted):
        repo, _, tag = name.rpartition(":")
        base = repo.rsplit("/", 1)[-1]
        if name == PAUSE_IMAGE:
            built[name] = single_binary_image("/usr/bin/catatonit", "pause", ["-P"])
        elif name == APP_IMAGE:
            built[name] = busybox_image()
        elif repo.startswith("registry.k8s.io/sig-storage/") and base in SIDECARS:
            have = sidecar_version(base)
            if have and have != tag:
                raise ClusterError(f"deploy/ pins {base} {tag}, but the binary tested here is {have}: "
                                   "pin what is tested")
            built[name] = single_binary_image(binary(base), base)
        elif base in ("cinder-csi-plugin", "manila-csi-plugin", "barbican-kms-plugin"):
            ours[base] = name
        else:
            raise ClusterError(f"no way to make image {name} here (nothing can be pulled)")
    archive = out / "built.tar"
    oci_archive(archive, built)
    ours_archive = out / "ours.tar"
    our_images_archive(ours_archive, ours)
    def import_into(node):
        for a in (archive, ours_archive):
            ctr("images", "import", a, timeout=600, node=node)
        for name in [*built, *ours.values()]:
            # kubelet's image GC never removes a pinned image
            ctr("images", "label", name, "io.cri-containerd.pinned=pinned", node=node)

    # each node's containerd of its own: imported side by side
    with concurrent.futures.ThreadPoolExecutor(len(all_nodes)) as pool:
        list(pool.map(import_into, all_nodes))
    log(f"imported {len(built) + len(ours)} images into {len(all_nodes)} node(s)")

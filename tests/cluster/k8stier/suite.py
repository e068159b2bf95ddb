"""The suite on the cluster: the overlay's inputs, the snapshot CRDs and
controller, deploy/suite applied, and waiting until every driver is
registered on every node."""

import json
import os
import string
from pathlib import Path

from .config import (
    CLOUD,
    ClusterError,
    DRIVERS,
    HERE,
    HOST,
    NAMESPACE,
    OVERLAY,
    PORTS,
    SERVICES,
    SHARED_K8S,
    STATE,
    Skipped,
    nodes,
)
from .control_plane import read_conf
from .pki import kubectl


def write_overlay_inputs():
    """What an operator writes for deploy/suite: the cloud.conf Secrets
    (the test cloud's member credentials) and the node's cloud.conf. The
    overlay itself (tests/cluster/overlay) is committed."""
    gen = OVERLAY / "generated"
    gen.mkdir(exist_ok=True)
    limit = ""
    if (CLOUD / "max-disk-devices").exists():
        # the disks Nova lets the server take, its root included: the
        # controller's and the node's cloud.conf agree on it
        limit = f"node-volume-attach-limit = {int((CLOUD / 'max-disk-devices').read_text())}\n"
    # Both controllers run as the project member `demo`, as production
    # does (the node servers are the member's); both reach the cloud
    # through its fault proxy (whose Keystone names
    # the proxy for every service), where the tests throttle, delay or
    # lose the cloud's answers
    via_proxy = {who: CLOUD / f"cloud-{who}-via-proxy.conf" for who in ("admin", "member")}
    for f in via_proxy.values():
        if not f.exists():
            raise ClusterError(f"{f} is missing: the test cloud predates its fault proxy (run cloud.py up again)")
    member = via_proxy["member"].read_text()
    (gen / "cinder-cloud.conf").write_text(f"{member}\n[BlockStorage]\nignore-volume-az = false\n{limit}")
    (gen / "manila-cloud.conf").write_text(via_proxy["member"].read_text())
    (gen / "node-cloud.conf").write_text(
        f"[Metadata]\nsearch-order = configDrive,metadataService\n\n[BlockStorage]\n{limit}")
    (gen / "addresses.env").write_text(
        f"KUBERNETES_SERVICE_HOST={HOST}\nKUBERNETES_SERVICE_PORT={PORTS['apiserver']}\n"
        f"METADATA_URL=http://{HOST}:{PORTS['metadata']}/\n")
    secrets = read_conf(via_proxy["member"])
    (gen / "csi-secrets.env").write_text("\n".join([
        f"os-authURL={secrets['auth-url']}",
        f"os-region={secrets.get('region', 'RegionOne')}",
        f"os-userName={secrets['username']}",
        f"os-password={secrets['password']}",
        f"os-projectName={secrets['tenant-name']}",
        f"os-domainName={secrets.get('user-domain-name', 'Default')}",
    ]) + "\n")
    for f in gen.iterdir():
        f.chmod(0o600)


def snapshot_crds():
    """The snapshot CRDs of external-snapshotter v8.6: $KUBE_BIN_DIR/crds,
    else ../shared/k8s/crds."""
    explicit = os.environ.get("KUBE_BIN_DIR")
    for d in ([Path(explicit) / "crds"] if explicit else []) + [SHARED_K8S / "crds"]:
        if d.is_dir():
            return d
    raise Skipped(f"no snapshot CRDs: neither $KUBE_BIN_DIR/crds nor {SHARED_K8S / 'crds'} exists")


def apply_addons():
    """What a cluster brings before the suite (deploy/README.md): the
    snapshot CRDs of external-snapshotter v8.6 and its controller."""
    kubectl("apply", "--server-side", "-f", snapshot_crds())
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    kubectl("apply", "-f", "-", input=addons())


def addons():
    """tests/cluster/addons with this node's apiserver port filled in."""
    texts = [string.Template(f.read_text()).substitute(APISERVER_PORT=PORTS["apiserver"])
             for f in sorted((HERE / "addons").glob("*.yaml"))]
    return "\n---\n".join(texts)


def apply_suite():
    kubectl("apply", "-k", OVERLAY, timeout=300)


def drivers_registered():
    for node in nodes():
        r = kubectl("get", "csinode", node.name, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        names = {d["name"] for d in json.loads(r.stdout)["spec"].get("drivers") or []}
        if not all(d in names for d in DRIVERS):
            return False
    return True


def startup_taints_left():
    """The nodes still carrying a startup taint (`<driver>/agent-not-ready`)."""
    r = kubectl("get", "nodes", "-o", "json", check=False)
    if r.returncode != 0:
        return ["(the API did not answer)"]
    return [n["metadata"]["name"] for n in json.loads(r.stdout)["items"]
            if any(t["key"].endswith("/agent-not-ready") for t in n["spec"].get("taints") or [])]


def wait_suite():
    def rolled_out():
        for kind, name in deployments():
            r = kubectl("rollout", "status", f"{kind}/{name}", "-n", NAMESPACE, "--timeout=5s", check=False)
            if r.returncode != 0:
                return False
        # the node plugins removed their startup taints
        return drivers_registered() and not startup_taints_left()
    try:
        SERVICES.wait_until("the suite", rolled_out, 300, log_file=STATE / "logs" / "kubelet.log")
    except ClusterError as e:
        raise ClusterError(f"{e}\n{describe_failures()}")


def deployments():
    r = kubectl("get", "deployments,daemonsets", "-n", NAMESPACE, "-o", "json", check=False)
    if r.returncode != 0:
        return []
    return [(i["kind"].lower(), i["metadata"]["name"]) for i in json.loads(r.stdout)["items"]]


def describe_failures():
    """The pods that are not running, and their containers' last words."""
    r = kubectl("get", "pods", "-A", "-o", "json", check=False)
    if r.returncode != 0:
        return r.stderr
    lines = []
    for p in json.loads(r.stdout)["items"]:
        statuses = p["status"].get("containerStatuses") or []
        if p["status"].get("phase") == "Running" and all(s.get("ready") for s in statuses):
            continue
        lines.append(f"pod {p['metadata']['namespace']}/{p['metadata']['name']}: {p['status'].get('phase')}")
        # a Pending pod says why in its PodScheduled condition
        for c in p["status"].get("conditions") or []:
            if c.get("status") != "True" and c.get("message"):
                lines.append(f"  {c['type']}: {c['message']}")
        for s in statuses:
            state = s.get("state", {})
            lines.append(f"  {s['name']}: {json.dumps(state)}")
    lines += describe_nodes()
    return "\n".join(lines)


def describe_nodes():
    """Each node's taints and its conditions that are not as they should be
    (DiskPressure on a shared disk leaves every new pod Pending)."""
    r = kubectl("get", "nodes", "-o", "json", check=False)
    if r.returncode != 0:
        return [r.stderr]
    lines = []
    for n in json.loads(r.stdout)["items"]:
        taints = [f"{t['key']}:{t['effect']}" for t in n["spec"].get("taints") or []]
        bad = [f"{c['type']}={c['status']} ({c.get('message', '')})"
               for c in n["status"].get("conditions") or []
               if (c["type"] == "Ready") != (c["status"] == "True")]
        lines.append(f"node {n['metadata']['name']}: taints {taints or 'none'}; "
                     f"conditions not as they should be: {bad or 'none'}")
    return lines

#!/usr/bin/env python3
"""Validates every manifest under deploy/: Kubernetes objects against the
strict upstream JSON schemas shipped by the `kubernetes-validate` package,
EncryptionConfiguration against deploy/schemas/encryption-configuration.json,
and the cloud.conf inside the KMS Secret with the suite's own parser rules
(sections and keys). Installs its tools into a venv ($DEPLOY_VALIDATE_VENV,
default .venv-tools) on first use. Exits 1 listing every problem."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = Path(os.environ.get("DEPLOY_VALIDATE_VENV", REPO / ".venv-tools"))
K8S_VERSION = "1.33.0"
# kustomize's content hash: ten characters of its alphabet
HASH_SUFFIX = re.compile(r"-[245-9bcdfghkmt]{10}$")
OUR_IMAGES = ("cinder-csi-plugin", "manila-csi-plugin", "barbican-kms-plugin")
# helm-python-sdk: Helm v4's own engine, for the charts (charts/, tests/helm)
PINS = ["kubernetes-validate==1.37.0", "jsonschema==4.26.0", "PyYAML==6.0.3", "helm-python-sdk==0.2.2"]


def ensure_tools():
    py = VENV / "bin" / "python"
    marker = VENV / ".pins"
    if py.exists() and marker.exists() and marker.read_text() == "\n".join(PINS):
        return py
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *PINS], check=True)
    marker.write_text("\n".join(PINS))
    return py


def documents():
    """Plain manifests as they are; kustomizations as `kubectl kustomize`
    renders them (the files inside are then not read on their own)."""
    import yaml

    kustomized = sorted(p.parent for p in HERE.rglob("kustomization.yaml"))
    for path in sorted(HERE.rglob("*.yaml")):
        if any(d in path.parents or d == path.parent for d in kustomized):
            continue
        for n, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                yield f"{path.relative_to(REPO)}#{n}", doc
    for d in kustomized:
        out = subprocess.run(["kubectl", "kustomize", str(d)], capture_output=True, text=True)
        if out.returncode != 0:
            yield f"{d.relative_to(REPO)} (kustomize)", {"kind": "KustomizeError", "error": out.stderr.strip()}
            continue
        rendered = [doc for doc in yaml.safe_load_all(out.stdout) if doc is not None]
        for n, doc in enumerate(rendered):
            yield f"{d.relative_to(REPO)} (rendered)#{n} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}", doc
        for problem in rendering_rules(rendered):
            yield f"{d.relative_to(REPO)} (rendered)", {"kind": "KustomizeError", "error": problem}


def pod_templates(docs):
    """(namespace, labels, container ports by name, images) of every workload's pods."""
    for doc in docs:
        if doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
            tpl = doc["spec"]["template"]
            containers = tpl["spec"].get("containers", []) + tpl["spec"].get("initContainers", [])
            ports = {p.get("name") for c in containers for p in c.get("ports", []) if p.get("name")}
            yield (doc["metadata"].get("namespace"), tpl["metadata"].get("labels", {}), ports,
                   [c["image"] for c in containers])


def selects(selector, labels):
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        has, val = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and val in e.get("values", []), "NotIn": not has or val not in e.get("values", []),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


def rendering_rules(docs):
    """Rules across the objects of one rendering: every ServiceAccount a
    binding names exists there (a namespace change in an overlay must reach
    the subjects), every PodMonitor selects pods that have its port, every
    dashboard parses, and every image is pinned to a tag."""
    accounts = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs if d.get("kind") == "ServiceAccount"}
    for d in docs:
        if d.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            for sub in d.get("subjects", []):
                if sub.get("kind") == "ServiceAccount" and accounts and (sub.get("namespace"), sub["name"]) not in accounts:
                    yield f"{d['kind']}/{d['metadata']['name']} binds ServiceAccount {sub.get('namespace')}/{sub['name']}, which is not rendered here"
    templates = list(pod_templates(docs))
    for d in docs:
        if d.get("kind") == "PodMonitor":
            ns = d["metadata"].get("namespace")
            # the namespaces it looks in: its own, or those it names
            where = set((d["spec"].get("namespaceSelector") or {}).get("matchNames") or [ns])
            rendered_here = {t[0] for t in templates}
            chosen = [t for t in templates if t[0] in where and selects(d["spec"]["selector"], t[1])]
            if where & rendered_here and not chosen:
                yield f"PodMonitor/{d['metadata']['name']} selects no pod in namespace {', '.join(sorted(where))}"
            for ep in d["spec"].get("podMetricsEndpoints", []):
                for t in chosen:
                    if ep["port"] not in t[2]:
                        yield f"PodMonitor/{d['metadata']['name']}: pods labelled {t[1]} have no port named {ep['port']}"
        if d.get("kind") == "ConfigMap" and (d["metadata"].get("labels") or {}).get("grafana_dashboard") == "1":
            for key, text in (d.get("data") or {}).items():
                try:
                    dash = json.loads(text)
                    assert dash.get("panels") and dash.get("uid")
                except (ValueError, AssertionError):
                    yield f"ConfigMap/{d['metadata']['name']}: {key} is not a Grafana dashboard"
    for t in templates:
        for image in t[3]:
            if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
                yield f"image {image!r} (pods labelled {t[1]}) has no tag: set it in the kustomization's images"
    for d in docs:
        if d.get("kind") in ("Secret", "ConfigMap") and HASH_SUFFIX.search(d["metadata"]["name"]):
            yield (f"{d['kind']}/{d['metadata']['name']} has a content-hash suffix: every edit would roll the pods "
                   "that mount it instead of letting the plugins re-read it (generatorOptions: disableNameSuffixHash)")
    # the Cinder controller keeps servers within the limit its nodes report
    limits = {}
    for d in docs:
        if d.get("kind") == "Secret" and d["metadata"]["name"] in ("cloud-config", "cloud-config-node"):
            text = secret_text(d, "cloud.conf")
            if text is not None:
                limits[d["metadata"]["name"]] = attach_limit_of(text)
    if len(limits) == 2 and len(set(limits.values())) > 1:
        yield (f"node-volume-attach-limit differs between the controller's cloud.conf ({limits['cloud-config']}) "
               f"and the nodes' ({limits['cloud-config-node']}): they must agree")
    # every workload of one rendering can run on the host network of one node
    owners = {}
    for d in docs:
        if d.get("kind") in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                for port in c.get("ports", []):
                    key = (port["containerPort"], port.get("protocol", "TCP"))
                    if key in owners and owners[key] != d["metadata"]["name"]:
                        yield (f"port {key[0]} of {d['kind']}/{d['metadata']['name']} is also "
                               f"{owners[key]}'s: they cannot share a node's host network")
                    owners[key] = d["metadata"]["name"]
    yield from mount_pod_policy_rules(docs)


def cel_strings(expression):
    """The string literals of a CEL expression written as '...' (what
    the mount pod policy's copied variables hold)."""
    return re.findall(r"'([^']*)'", expression)


def mount_pod_policy_rules(docs):
    """The mount pod policy holds the mount pod template's image, kubelet
    directory and name (written in, not read as a parameter): a rendering
    in which they differ refuses every mount pod, so it is refused here."""
    templates = [d for d in docs if d.get("kind") == "PodTemplate"
                 and (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "ceph-fuse-mount-template"]
    policies = [d for d in docs if d.get("kind") == "ValidatingAdmissionPolicy"
                and any(v["name"] == "templateImage" for v in d["spec"].get("variables", []))]
    for policy in policies:
        name = policy["metadata"]["name"]
        if len(templates) != 1:
            yield f"ValidatingAdmissionPolicy/{name} needs the one mount pod template in the same rendering, found {len(templates)}"
            continue
        template = templates[0]
        spec = template["template"]["spec"]
        image = next((c["image"] for c in spec["containers"] if c["name"] == "ceph-fuse"), None)
        paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
        held = {v["name"]: cel_strings(v["expression"]) for v in policy["spec"]["variables"]}
        if held.get("templateImage") != [image]:
            yield (f"ValidatingAdmissionPolicy/{name} admits the image {held.get('templateImage')} but the mount pod "
                   f"template runs {image!r}: repeat the mount pod policy's replacements after `images:`")
        if sorted(held.get("hostPaths", [])) != sorted(paths):
            yield (f"ValidatingAdmissionPolicy/{name} admits the host paths {held.get('hostPaths')} but the mount pod "
                   f"template mounts {paths}: repeat the mount pod policy's replacements after a patch of the template")
        if held.get("templateName") != [template["metadata"]["name"]]:
            yield (f"ValidatingAdmissionPolicy/{name} wants mount pods owned by {held.get('templateName')} but the "
                   f"template is {template['metadata']['name']!r}: repeat the mount pod policy's replacements after `namePrefix:`")


def secret_text(doc, key):
    """A Secret's value, from stringData or data."""
    import base64
    if key in (doc.get("stringData") or {}):
        return doc["stringData"][key]
    if key in (doc.get("data") or {}):
        return base64.b64decode(doc["data"][key]).decode()
    return None


def attach_limit_of(cloud_conf):
    """[BlockStorage] node-volume-attach-limit (25 when unset, as the plugins)."""
    section = None
    for line in cloud_conf.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").split()[0]
        elif section == "BlockStorage" and line.startswith("node-volume-attach-limit"):
            return int(line.split("=", 1)[1].strip().strip('"'))
    return 25


def cinder_rules(doc):
    """What the Cinder driver needs of its objects beyond schema validity."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name")
    if kind == "CSIDriver" and name == "cinder.csi.openstack.org":
        spec = doc.get("spec", {})
        if spec.get("attachRequired") is not True or spec.get("fsGroupPolicy") != "File":
            yield "the Cinder CSIDriver needs attachRequired: true and fsGroupPolicy: File"
    if kind == "ClusterRole" and name == "csi-cinder-provisioner":
        verbs = {v for r in doc.get("rules", []) if "volumesnapshots" in r.get("resources", [])
                 for v in r.get("verbs", [])}
        if not {"watch", "update"} <= verbs:
            yield "csi-provisioner v6 needs watch and update on volumesnapshots (snapshot protection)"
    if kind == "DaemonSet" and name == "csi-cinder-nodeplugin":
        pod = doc["spec"]["template"]["spec"]
        plugin = next((c for c in pod["containers"] if c["name"] == "cinder-csi-plugin"), None)
        if plugin is None:
            yield "no cinder-csi-plugin container"
            return
        if not (plugin.get("securityContext") or {}).get("privileged"):
            yield "the node plugin must be privileged (it formats and mounts)"
        mounts = {m["mountPath"]: m for m in plugin.get("volumeMounts", [])}
        # the kubelet directory: --path-root's (a chart's kubeletDir)
        root = next((a.split("=", 1)[1] for a in plugin.get("args", []) if a.startswith("--path-root=")),
                    "/var/lib/kubelet")
        if (mounts.get(root) or {}).get("mountPropagation") != "Bidirectional":
            yield "the kubelet directory must be mounted with Bidirectional propagation"
        if "/dev" not in mounts:
            yield "the node plugin needs /dev"


def policy_rules(doc):
    """No admission policy takes a parameter of a built-in kind: an
    apiserver stops watching that kind for good once no binding names it
    for a second, and then admits against the parameter it last saw, or
    refuses everything, until it restarts (kubernetes/kubernetes#133827,
    #130887; what a reinstall met)."""
    if doc.get("kind") != "ValidatingAdmissionPolicy":
        return
    param = (doc.get("spec") or {}).get("paramKind")
    if not param:
        return
    api_version = param.get("apiVersion", "")
    group = api_version.rpartition("/")[0]
    # the core group, the dotless ones (apps, batch...) and *.k8s.io
    if "." not in group or group.endswith(".k8s.io"):
        yield (f"ValidatingAdmissionPolicy/{doc['metadata']['name']} takes a {param.get('kind')} as its parameter: "
               "write the values into the policy (Kubernetes #133827)")


def workload_rules(doc):
    """What every plugin workload needs: an explicit update strategy for
    DaemonSets, a writable /tmp under a read-only root for the node
    plugins (the config drive is mounted on a temporary directory), and
    the KMS plugin's credentials from the node, never from a Secret."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name") or ""
    if kind != "DaemonSet":
        return
    spec = doc["spec"]
    if not spec.get("updateStrategy"):
        yield "a DaemonSet must say how it is updated (updateStrategy)"
    pod = spec["template"]["spec"]
    for c in pod["containers"]:
        if c["name"] not in ("cinder-csi-plugin", "manila-csi-plugin"):
            continue
        sc = c.get("securityContext") or {}
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if sc.get("readOnlyRootFilesystem") and "/tmp" not in mounts:
            yield f"container {c['name']}: a read-only root needs a writable /tmp (the config drive is mounted there)"
    if name.startswith("csi-") and name.endswith("-nodeplugin"):
        yield from pre_stop_rules(pod)
    if name == "barbican-kms-plugin":
        if any("secret" in v for v in pod.get("volumes", [])):
            yield ("the KMS plugin must not read its credentials from a Secret: once Secrets are encrypted "
                   "a cold restart of the control plane deadlocks (use a host file)")
        if not pod.get("hostNetwork"):
            yield "the KMS plugin reaches Barbican as the apiserver does: hostNetwork"


def pre_stop_rules(pod):
    """A node plugin is the last to leave a drained node: its preStop runs
    `pre-stop-hook` for its own driver, with the node's name and a token
    to read the node and the VolumeAttachments, within a grace period
    long enough for the detaches."""
    for c in pod["containers"]:
        if c["name"] not in ("cinder-csi-plugin", "manila-csi-plugin"):
            continue
        args = c.get("args", [])
        driver = next((a.split("=", 1)[1] for a in args if a.startswith("--drivername=")),
                      "cinder.csi.openstack.org" if c["name"] == "cinder-csi-plugin" else None)
        command = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
        if "pre-stop-hook" not in command:
            yield (f"container {c['name']}: no preStop `pre-stop-hook`: on a drained node the plugin would leave "
                   "before kubelet unmounted through it")
        elif f"--driver-name={driver}" not in command:
            yield f"container {c['name']}: the pre-stop hook must wait for its own driver ({driver})"
        env = {e["name"]: e for e in c.get("env", [])}
        if ((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
            yield f"container {c['name']}: the pre-stop hook needs NODE_NAME from the downward API (spec.nodeName)"
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if pod.get("automountServiceAccountToken") is not True \
                and "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts:
            yield f"container {c['name']}: the pre-stop hook needs a service account token"
        local = next((a.split("=", 1)[1] for a in args if a.startswith("--pre-stop-endpoint=")), None)
        host, port = local.rsplit(":", 1) if local else (None, None)
        registrar = next((r for r in pod["containers"] if r["name"] == "node-driver-registrar"), None)
        get = (((registrar or {}).get("lifecycle") or {}).get("preStop") or {}).get("httpGet") or {}
        if registrar and (get.get("path") != "/pre-stop" or str(get.get("port")) != str(port)
                          or get.get("host") != host):
            yield ("node-driver-registrar: its preStop must wait on the plugin's /pre-stop (httpGet to the "
                   "--pre-stop-endpoint host and port): told to stop, it deregisters the driver and kubelet "
                   "unmounts nothing")
        if local and host not in ("127.0.0.1", "[::1]"):
            yield f"container {c['name']}: --pre-stop-endpoint on the node's loopback only, not {local}"

        if pod.get("terminationGracePeriodSeconds", 30) < 30:
            yield "a node plugin's grace period bounds the pre-stop hook's wait: 30 s at least"


def manila_rules(doc):
    """What the Manila driver needs of its objects: shares are not attached,
    the node mounts them itself (no partner plugin), ceph-fuse needs
    /dev/fuse, each plugin serves the protocol its driver name says."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name") or ""
    if kind == "CSIDriver" and name.endswith("manila.csi.openstack.org"):
        if (doc.get("spec") or {}).get("attachRequired") is not False:
            yield "a Manila CSIDriver needs attachRequired: false (shares are not attached)"
    if kind in ("Deployment", "DaemonSet") and name.startswith("csi-manila-"):
        pod = doc["spec"]["template"]["spec"]
        plugin = next((c for c in pod["containers"] if c["name"] == "manila-csi-plugin"), None)
        if plugin is None:
            yield "no manila-csi-plugin container"
            return
        args = plugin.get("args", [])
        flag = lambda f: next((a.split("=", 1)[1] for a in args if a.startswith(f + "=")), None)
        driver, proto = flag("--drivername"), flag("--share-protocol-selector")
        if not driver or not proto or not driver.startswith(proto.lower() + "."):
            yield f"driver name {driver!r} does not match --share-protocol-selector {proto!r}"
        if any(a.startswith("--fwdendpoint") for a in args):
            yield "--fwdendpoint: this plugin mounts shares itself, no partner plugin is needed"
        if "--mount-pods" in args or "--mount-pods=true" in args:
            env = {e["name"]: e for e in plugin.get("env", [])}
            for var, field in (("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name")):
                got = ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
                if got != field:
                    yield f"--mount-pods needs {var} from the downward API ({field})"
            mounts = {m["mountPath"] for m in plugin.get("volumeMounts", [])}
            if pod.get("automountServiceAccountToken") is not True \
                    and "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts:
                yield ("--mount-pods needs the service account token in the plugin's container (a projected "
                       "token at /var/run/secrets/kubernetes.io/serviceaccount)")
            elif pod.get("automountServiceAccountToken") is True:
                yield ("--mount-pods: automountServiceAccountToken puts the token that makes pods in every "
                       "container; mount a projected token in the plugin's container alone")
        if kind == "DaemonSet":
            if not (plugin.get("securityContext") or {}).get("privileged"):
                yield "the Manila node plugin must be privileged (it mounts)"
            mounts = {m["mountPath"]: m for m in plugin.get("volumeMounts", [])}
            root = flag("--path-root") or "/var/lib/kubelet"
            if (mounts.get(root) or {}).get("mountPropagation") != "Bidirectional":
                yield "the kubelet directory must be mounted with Bidirectional propagation"
            if proto == "CEPHFS" and "/dev/fuse" not in mounts:
                yield "the CephFS node plugin needs /dev/fuse for ceph-fuse"


def _daemonset(name, container, args, strategy=True, tmp=True, volumes=(), pre_stop="cinder.csi.openstack.org"):
    """A node DaemonSet as deploy/ writes them, to break one rule at a time."""
    mounts = [{"name": "k", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"},
              {"name": "f", "mountPath": "/dev/fuse"}, {"name": "d", "mountPath": "/dev"}]
    vols = [{"name": "k", "hostPath": {"path": "/var/lib/kubelet"}}, {"name": "f", "hostPath": {"path": "/dev/fuse"}},
            {"name": "d", "hostPath": {"path": "/dev"}}, *volumes]
    if tmp:
        mounts.append({"name": "t", "mountPath": "/tmp"})
        vols.append({"name": "t", "emptyDir": {}})
    spec = {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
        "hostNetwork": True, "automountServiceAccountToken": False,
        "containers": [{"name": container, "image": "i:1", "args": args,
                        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True},
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        **({"lifecycle": {"preStop": {"exec": {"command": [
                            "/usr/local/bin/p", "pre-stop-hook", f"--driver-name={pre_stop}"]}}}}
                           if pre_stop else {}),
                        "volumeMounts": mounts + [{"name": "t", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
        "volumes": vols}}}
    if strategy:
        spec["updateStrategy"] = {"type": "RollingUpdate"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name}, "spec": spec}


def _mount_pods_token_everywhere():
    """The CephFS node plugin with --mount-pods right but for its token,
    mounted by automountServiceAccountToken in every container."""
    ds = _daemonset("csi-manila-cephfs-nodeplugin", "manila-csi-plugin", [
        "--drivername=cephfs.manila.csi.openstack.org", "--share-protocol-selector=CEPHFS", "--mount-pods"],
        pre_stop="cephfs.manila.csi.openstack.org")
    pod = ds["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = True
    pod["containers"][0]["env"].append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return ds


def _with_registrar(ds, pre_stop=None):
    """The DaemonSet with a node-driver-registrar container (its preStop as given)."""
    c = {"name": "node-driver-registrar", "image": "r:1"}
    if pre_stop:
        c["lifecycle"] = {"preStop": pre_stop}
    ds["spec"]["template"]["spec"]["containers"].append(c)
    return ds


# each must be reported: proves the checks can fail
BROKEN = [
    ("admission policy with a built-in parameter kind", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"}, "spec": {"paramKind": {"apiVersion": "v1", "kind": "PodTemplate"},
                                            "validations": [{"expression": "true"}]}}),
    ("pod with an unknown field", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                    "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}}),
    ("pod without containers", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}),
    ("kms provider of API v1", {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "EncryptionConfiguration",
                                 "resources": [{"resources": ["secrets"], "providers": [
                                     {"kms": {"apiVersion": "v1", "name": "b", "endpoint": "unix:///s"}}]}]}),
    ("kms endpoint over tcp", {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "EncryptionConfiguration",
                                "resources": [{"resources": ["secrets"], "providers": [
                                    {"kms": {"apiVersion": "v2", "name": "b", "endpoint": "tcp://1.2.3.4:1"}}]}]}),
    ("cinder CSIDriver without attach", {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                                         "metadata": {"name": "cinder.csi.openstack.org"},
                                         "spec": {"attachRequired": False, "fsGroupPolicy": "File"}}),
    ("manila CSIDriver with attach", {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                                      "metadata": {"name": "nfs.manila.csi.openstack.org"},
                                      "spec": {"attachRequired": True}}),
    ("manila node plugin with a partner socket", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "csi-manila-cephfs-nodeplugin"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
            "containers": [{"name": "manila-csi-plugin", "image": "i", "securityContext": {"privileged": True},
                            "args": ["--drivername=cephfs.manila.csi.openstack.org", "--share-protocol-selector=CEPHFS",
                                     "--fwdendpoint=unix:///csi/partner.sock"],
                            "volumeMounts": [{"name": "k", "mountPath": "/var/lib/kubelet",
                                              "mountPropagation": "Bidirectional"}]}],
            "volumes": [{"name": "k", "hostPath": {"path": "/var/lib/kubelet"}}]}}}}),
    ("provisioner role without snapshot protection", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "csi-cinder-provisioner"},
        "rules": [{"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": ["get", "list"]}]}),
    ("group snapshot class of another API version", {
        "apiVersion": "groupsnapshot.storage.k8s.io/v1alpha1", "kind": "VolumeGroupSnapshotClass",
        "metadata": {"name": "g"}, "driver": "d", "deletionPolicy": "Delete"}),
    ("snapshot class with an unknown policy", {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                                                "metadata": {"name": "s"}, "driver": "d", "deletionPolicy": "Keep"}),
    ("secret cloud.conf without key-id", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                           "stringData": {"cloud.conf": "[Global]\n[KeyManager]\n"}}),
    ("DaemonSet without an update strategy", _daemonset("csi-cinder-nodeplugin", "cinder-csi-plugin", [],
                                                         strategy=False)),
    ("node plugin with a read-only root and no /tmp", _daemonset("csi-cinder-nodeplugin", "cinder-csi-plugin", [],
                                                                 tmp=False)),
    ("KMS plugin reading a Secret", _daemonset("barbican-kms-plugin", "barbican-kms-plugin", [],
                                                 volumes=[{"name": "c", "secret": {"secretName": "s"}}])),
    ("Manila with topology on", _daemonset("csi-manila-nfs-nodeplugin", "manila-csi-plugin", [
        "--drivername=nfs.manila.csi.openstack.org", "--share-protocol-selector=NFS", "--with-topology"],
        pre_stop="nfs.manila.csi.openstack.org")),
    ("mount pods without the node name", _daemonset("csi-manila-cephfs-nodeplugin", "manila-csi-plugin", [
        "--drivername=cephfs.manila.csi.openstack.org", "--share-protocol-selector=CEPHFS", "--mount-pods"],
        pre_stop="cephfs.manila.csi.openstack.org")),
    ("mount pods with the token in every container", _mount_pods_token_everywhere()),
    ("node plugin without the pre-stop hook", _daemonset("csi-cinder-nodeplugin", "cinder-csi-plugin", [],
                                                         pre_stop=None)),
    ("registrar leaving before the plugin", _with_registrar(_daemonset("csi-cinder-nodeplugin", "cinder-csi-plugin",
                                                                      ["--pre-stop-endpoint=127.0.0.1:9849"]))),
    ("registrar asking the metrics port", _with_registrar(
        _daemonset("csi-cinder-nodeplugin", "cinder-csi-plugin",
                   ["--http-endpoint=:9829", "--pre-stop-endpoint=127.0.0.1:9849"]),
        {"httpGet": {"host": "127.0.0.1", "path": "/pre-stop", "port": 9829}})),
    ("pre-stop hook waiting for another driver", _daemonset("csi-manila-nfs-nodeplugin", "manila-csi-plugin", [
        "--drivername=nfs.manila.csi.openstack.org", "--share-protocol-selector=NFS"],
        pre_stop="cephfs.manila.csi.openstack.org")),
]


def _workload(labels, port, image="registry.example.com/p:1"):
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"template": {"metadata": {"labels": labels}, "spec": {"containers": [
                {"name": "c", "image": image, "ports": [{"name": port, "containerPort": 1}]}]}}}}


def _mount_pods(image, kubelet_dir, name):
    """A mount pod template and a policy that holds image
    r.example/manila-csi-plugin:1, /var/lib/kubelet and the name t."""
    return [
        {"kind": "PodTemplate", "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "ceph-fuse-mount-template"}},
         "template": {"spec": {"containers": [{"name": "ceph-fuse", "image": image}],
                               "volumes": [{"name": "kubelet-dir", "hostPath": {"path": kubelet_dir}},
                                           {"name": "fuse", "hostPath": {"path": "/dev/fuse"}}]}}},
        {"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"}, "spec": {"variables": [
            {"name": "templateImage", "expression": "'r.example/manila-csi-plugin:1'"},
            {"name": "hostPaths", "expression": "['/var/lib/kubelet', '/dev/fuse']"},
            {"name": "templateName", "expression": "'t'"}]}}]


BROKEN_RENDERINGS = [
    ("binding to a ServiceAccount left in another namespace", [
        {"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "new"}},
        {"kind": "ClusterRoleBinding", "metadata": {"name": "b"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "kube-system"}]}]),
    ("PodMonitor selecting no pod", [
        _workload({"app": "a"}, "metrics"),
        {"kind": "PodMonitor", "metadata": {"name": "m", "namespace": "ns"},
         "spec": {"selector": {"matchLabels": {"app": "b"}}, "podMetricsEndpoints": [{"port": "metrics"}]}}]),
    ("PodMonitor on a port the pods lack", [
        _workload({"app": "a"}, "healthz"),
        {"kind": "PodMonitor", "metadata": {"name": "m", "namespace": "ns"},
         "spec": {"selector": {"matchLabels": {"app": "a"}}, "podMetricsEndpoints": [{"port": "metrics"}]}}]),
    ("image without a tag", [_workload({"app": "a"}, "metrics", image="cinder-csi-plugin")]),
    ("dashboard that is not JSON", [{"kind": "ConfigMap", "metadata": {"name": "d", "labels": {"grafana_dashboard": "1"}},
                                     "data": {"d.json": "{"}}]),
    ("Secret with a content-hash suffix", [{"kind": "Secret", "metadata": {"name": "cloud-config-2h8bk5m6gc"}}]),
    ("controller and nodes with other attach limits", [
        {"kind": "Secret", "metadata": {"name": "cloud-config"},
         "stringData": {"cloud.conf": "[BlockStorage]\nnode-volume-attach-limit = 9\n"}},
        {"kind": "Secret", "metadata": {"name": "cloud-config-node"}, "stringData": {"cloud.conf": "[Metadata]\n"}}]),
    ("two workloads on one host port", [_workload({"app": "a"}, "metrics"),
                                        {**_workload({"app": "b"}, "metrics"), "metadata": {"name": "v", "namespace": "ns"}}]),
    ("mount pod policy behind the template's image", _mount_pods("r.example/manila-csi-plugin:2", "/var/lib/kubelet", "t")),
    ("mount pod policy behind the template's kubelet directory", _mount_pods("r.example/manila-csi-plugin:1", "/srv/kubelet", "t")),
    ("mount pod policy behind the template's name", _mount_pods("r.example/manila-csi-plugin:1", "/var/lib/kubelet", "prefix-t")),
]
BROKEN_IMAGE_SETS = [
    ("our images from two registry paths", [
        ("a", {"kind": "Pod", "spec": {"containers": [{"image": "r.example/openstack/barbican-kms-plugin:1"}]}}),
        ("b", {"kind": "Pod", "spec": {"containers": [{"image": "r.example/openstack-csi/cinder-csi-plugin:1"}]}})]),
    ("a sidecar pinned to two versions", [
        ("a", {"kind": "Pod", "spec": {"containers": [{"image": "registry.k8s.io/sig-storage/livenessprobe:v2.17.0"}]}}),
        ("b", {"kind": "Pod", "spec": {"containers": [{"image": "registry.k8s.io/sig-storage/livenessprobe:v2.19.0"}]}})]),
]


def deploy_choice_rules(doc):
    """What deploy/ chooses where a chart's values may choose otherwise:
    Manila's topology off, as upstream's default (it pins each share to
    the zones of its creation)."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name") or ""
    if kind in ("Deployment", "DaemonSet") and name.startswith("csi-manila-"):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "manila-csi-plugin" and ("--with-topology" in c.get("args", [])
                                                     or "--with-topology=true" in c.get("args", [])):
                yield "--with-topology is off by default, as upstream's (it pins each share to the zones of its creation)"


def validate(docs, deploy=True):
    import jsonschema
    import kubernetes_validate

    problems = []
    checked = 0
    enc_schema = json.loads((HERE / "schemas" / "encryption-configuration.json").read_text())
    vsc_schema = json.loads((HERE / "schemas" / "volumesnapshotclass.json").read_text())
    vgsc_schema = json.loads((HERE / "schemas" / "volumegroupsnapshotclass.json").read_text())
    podmonitor_schema = json.loads((HERE / "schemas" / "podmonitor.json").read_text())
    for where, doc in docs:
        checked += 1
        if doc.get("kind") == "KustomizeError":
            problems.append(f"{where}: {doc['error']}")
            continue
        choices = deploy_choice_rules(doc) if deploy else []
        for p in [*cinder_rules(doc), *manila_rules(doc), *workload_rules(doc), *policy_rules(doc), *choices]:
            problems.append(f"{where}: {p}")
        class_schemas = {"VolumeSnapshotClass": vsc_schema, "VolumeGroupSnapshotClass": vgsc_schema,
                         "PodMonitor": podmonitor_schema}
        if doc.get("kind") in class_schemas:
            for e in jsonschema.Draft202012Validator(class_schemas[doc["kind"]]).iter_errors(doc):
                problems.append(f"{where}: {'/'.join(map(str, e.path))}: {e.message}")
            continue
        if doc.get("kind") == "EncryptionConfiguration":
            for e in jsonschema.Draft202012Validator(enc_schema).iter_errors(doc):
                problems.append(f"{where}: {'/'.join(map(str, e.path))}: {e.message}")
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {e.message} at {'/'.join(map(str, e.path))}")
        except Exception as e:  # unknown kinds, schema lookups
            problems.append(f"{where}: {e}")
        if doc.get("kind") == "Secret" and "cloud.conf" in (doc.get("stringData") or {}):
            text = doc["stringData"]["cloud.conf"]
            sections = [l.strip() for l in text.splitlines() if l.strip().startswith("[")]
            known = {"[Global]", "[BlockStorage]", "[Metadata]", "[KeyManager]"}
            for sec in sections:
                if sec not in known and not sec.startswith("[Global \""):
                    problems.append(f"{where}: cloud.conf section {sec} is not one the plugins read")
            if "[KeyManager]" in sections and "key-id" not in text:
                problems.append(f"{where}: cloud.conf lacks [KeyManager] key-id")
            if "kms" in where and ("[Global]" not in sections or "[KeyManager]" not in sections):
                problems.append(f"{where}: the KMS cloud.conf needs [Global] and [KeyManager]")
    return checked, problems


def image_rules(docs):
    """Across everything deploy/ ships: our images live under one
    registry path, and each sidecar is pinned to one version."""
    ours, sidecars = {}, {}
    for where, doc in docs:
        kind = doc.get("kind")
        if kind == "Pod":
            spec = doc.get("spec") or {}
        elif kind in ("Deployment", "DaemonSet", "StatefulSet"):
            spec = doc["spec"]["template"]["spec"]
        else:
            continue
        for c in spec.get("containers", []):
            image = c["image"]
            repo, _, tag = image.rpartition(":")
            base = repo.rsplit("/", 1)[-1]
            if base in OUR_IMAGES:
                ours.setdefault(repo.rsplit("/", 1)[0], set()).add(where.split(" ")[0])
            elif repo.startswith("registry.k8s.io/sig-storage/"):
                sidecars.setdefault(base, {}).setdefault(tag, set()).add(where.split(" ")[0])
    if len(ours) > 1:
        yield "our images come from several registry paths: " + "; ".join(
            f"{p} ({', '.join(sorted(w))})" for p, w in sorted(ours.items()))
    for base, tags in sorted(sidecars.items()):
        if len(tags) > 1:
            yield f"{base} is pinned to several versions: " + "; ".join(
                f"{t} ({', '.join(sorted(w))})" for t, w in sorted(tags.items()))


def main():
    if os.environ.get("_DEPLOY_VALIDATE_INNER") != "1":
        py = ensure_tools()
        env = {**os.environ, "_DEPLOY_VALIDATE_INNER": "1"}
        return subprocess.run([str(py), __file__], env=env).returncode
    missed = [name for name, doc in BROKEN if not validate([(name, doc)])[1]]
    missed += [name for name, docs in BROKEN_RENDERINGS if not list(rendering_rules(docs))]
    missed += [name for name, docs in BROKEN_IMAGE_SETS if not list(image_rules(docs))]
    if missed:
        print(f"the validator accepted broken documents: {', '.join(missed)}")
        return 1
    docs = list(documents())
    checked, problems = validate(docs)
    problems += list(image_rules(docs))
    for p in problems:
        print(f"INVALID {p}")
    print(f"manifests: {checked} checked, {len(problems)} problems; "
          f"{len(BROKEN) + len(BROKEN_RENDERINGS) + len(BROKEN_IMAGE_SETS)} broken examples rejected")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

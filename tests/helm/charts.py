#!/usr/bin/env python3
"""The charts of charts/ through Helm's own engine (PyPI's helm-python-sdk,
Helm v4's SDK): each is linted, rendered with value fixtures (upstream's
defaults, an operator's values shaped like upstream's examples, a
multi-cloud one, a custom kubelet directory, ...) and checked for what each
must produce; every rendering goes through deploy/validate.py's checks;
and the default rendering is compared, object by object, with deploy/'s
kustomization (a difference that is not a stated one fails).

`--cluster`: the charts in the cluster tier instead (tests/helm/in_cluster.py:
every rendering through the apiserver, install, upgrade under writers,
rollback, uninstall; the KMS chart's plugin through a cold start of the
control plane). `--cluster WORD...`: only the tests whose names hold one.

Prints one line per test (`test helm/<name> ... ok|FAILED`) and exits 1
when one failed. Runs in deploy/validate.py's tool venv."""

import copy
import difflib
import os
import subprocess
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHARTS = REPO / "charts"
FIXTURES = HERE / "fixtures"
sys.path.insert(0, str(REPO / "deploy"))

import validate  # noqa: E402  (deploy/validate.py: its venv and its checks)

NAMESPACE = "openstack-system"
# labels Helm's conventions add to every object's metadata: the stated
# difference between a chart's rendering and deploy/'s
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
UPSTREAM_CHART_POD_LABELS = ("component", "release", "chart", "heritage")


class Rendering:
    """One chart rendered with one set of values: its objects by kind and
    name, and its NOTES."""

    def __init__(self, chart, values, release="suite", namespace=NAMESPACE):
        self.namespace = namespace
        import helm_python
        import yaml

        self.chart_name = chart
        self.values = values
        self.release = release
        self.chart_version = yaml.safe_load((CHARTS / chart / "Chart.yaml").read_text())["version"]
        loaded = helm_python.Chart.load(CHARTS / chart)
        out = loaded.render(values, name=release, namespace=namespace, is_install=True)
        self.notes = ""
        self.docs = []
        for path, text in sorted(out.items()):
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    self.docs.append((path, doc))

    def objects(self, kind=None):
        return [d for _, d in self.docs if kind is None or d["kind"] == kind]

    def get(self, kind, name):
        found = [d for d in self.objects(kind) if d["metadata"]["name"] == name]
        if len(found) != 1:
            raise AssertionError(f"{len(found)} {kind}/{name} rendered; names: "
                                 f"{sorted(d['metadata']['name'] for d in self.objects(kind))}")
        return found[0]

    def granted(self, service_account):
        """What the rendering's role bindings give a service account of its
        namespace: (API group, resource, verb) triples."""
        roles = {(d["kind"], d["metadata"]["name"]): d for d in self.objects()
                 if d["kind"] in ("Role", "ClusterRole")}
        out = set()
        for b in self.objects():
            if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            if not any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                       for s in b.get("subjects", [])):
                continue
            role = roles.get((b["roleRef"]["kind"], b["roleRef"]["name"]))
            for rule in (role or {}).get("rules", []):
                for g in rule.get("apiGroups", []):
                    for res in rule.get("resources", []):
                        for v in rule.get("verbs", []):
                            out.add((g, res, v))
        return out

    def container(self, kind, name, container):
        pod = self.get(kind, name)["spec"]["template"]["spec"]
        found = [c for c in pod["containers"] if c["name"] == container]
        if len(found) != 1:
            raise AssertionError(f"{kind}/{name} has no container {container}: "
                                 f"{[c['name'] for c in pod['containers']]}")
        return found[0]

    def pod(self, kind, name):
        return self.get(kind, name)["spec"]["template"]["spec"]


def load_fixture(name):
    import yaml

    return yaml.safe_load((FIXTURES / name).read_text())


def check_rendering(r):
    """deploy/validate.py's checks: the strict schemas, the drivers' rules,
    the rules across one rendering."""
    docs = [(f"{r.chart_name}:{path}#{d['kind']}/{d['metadata']['name']}", d) for path, d in r.docs]
    _, problems = validate.validate(docs, deploy=False)
    problems += list(validate.rendering_rules([d for _, d in docs]))
    problems += list(validate.image_rules(docs))
    if problems:
        raise AssertionError("the rendering fails deploy/validate.py's checks:\n  " + "\n  ".join(problems))


def lint(chart, values, namespace):
    import helm_python

    result = helm_python.lint(CHARTS / chart, values, strict=True, namespace=namespace)
    messages = [m for m in result.get("messages") or [] if (m.get("severity") or 0) >= 2
                or str(m.get("severity", "")).lower() in ("warning", "error")]
    if messages or result.get("errors"):
        raise AssertionError(f"helm lint {chart}: {messages or result.get('errors')}")


def kustomize(path):
    import yaml

    out = subprocess.run(["kubectl", "kustomize", str(REPO / path)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# kinds without a namespace: kustomize writes its namespace into those it
# does not know (the admission policies), the apiserver ignores it
CLUSTER_SCOPED = {"CSIDriver", "ClusterRole", "ClusterRoleBinding", "StorageClass", "VolumeSnapshotClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Namespace"}


def comparable(doc, chart):
    """An object as the apiserver would take it, for the comparison: Helm's
    labels set aside (the chart's), no namespace on a cluster-scoped
    kind, and a container's pull policy left to Kubernetes' default when
    it is that default (IfNotPresent for a tagged image)."""
    doc = copy.deepcopy(doc)
    if chart:
        labels = doc["metadata"].get("labels") or {}
        for key in HELM_LABELS:
            labels.pop(key, None)
        if not labels:
            doc["metadata"].pop("labels", None)
    if doc["kind"] in CLUSTER_SCOPED:
        doc["metadata"].pop("namespace", None)
    template = (doc.get("spec") or {}).get("template") or {}
    if chart and template.get("metadata", {}).get("labels"):
        # upstream's chart's pod labels, the chart's alone (deploy/ is
        # upstream's manifests' counterpart, which have none of them)
        for key in UPSTREAM_CHART_POD_LABELS:
            template["metadata"]["labels"].pop(key, None)
    pod = template.get("spec") or {}
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        tag = c["image"].rsplit("/", 1)[-1].partition(":")[2]
        if c.get("imagePullPolicy") == "IfNotPresent" and tag and tag != "latest":
            del c["imagePullPolicy"]
    return doc


def drift(rendered, deployed, what):
    """Object by object: the same kinds and names, and each the same as
    the apiserver takes it (`comparable`). Returns the differences."""
    import yaml

    def key(d):
        return (d["kind"], d["metadata"]["name"])

    mine = {key(d): comparable(d, chart=True) for d in rendered}
    theirs = {key(d): comparable(d, chart=False) for d in deployed}
    problems = []
    for k in sorted(set(mine) - set(theirs)):
        problems.append(f"{k[0]}/{k[1]} is rendered by the chart, not in {what}")
    for k in sorted(set(theirs) - set(mine)):
        problems.append(f"{k[0]}/{k[1]} is in {what}, not rendered by the chart")
    for k in sorted(set(mine) & set(theirs)):
        if mine[k] != theirs[k]:
            a = yaml.safe_dump(theirs[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(mine[k], sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(a, b, what, "chart", lineterm="", n=2))
            problems.append(f"{k[0]}/{k[1]} differs:\n{diff}")
    return problems


def fails_to_render(chart, values, message):
    import helm_python

    try:
        Rendering(chart, values)
    except helm_python.HelmError as e:
        if message not in str(e):
            raise AssertionError(f"render failed, but not saying {message!r}: {e}")
        return
    raise AssertionError(f"rendered, though it must fail saying {message!r}")


def run(tests):
    failed = skipped = 0
    for name, test in tests:
        try:
            renderings = test() or []
            for r in renderings:
                check_rendering(r)
                lint(r.chart_name, r.values, r.namespace)
            print(f"test helm/{name} ... ok", flush=True)
        except Exception as e:  # a test's failure, whatever raised it
            if type(e).__name__ == "Skipped":
                # its inputs are missing: counted as skipped, never passed
                print(f"test helm/{name} ... ignored, {e}", flush=True)
                skipped += 1
                continue
            failed += 1
            print(f"test helm/{name} ... FAILED", flush=True)
            print("   | " + traceback.format_exc().strip().replace("\n", "\n   | "), flush=True)
    print(f"charts: {len(tests) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def main():
    if os.environ.get("_DEPLOY_VALIDATE_INNER") != "1":
        py = validate.ensure_tools()
        env = {**os.environ, "_DEPLOY_VALIDATE_INNER": "1"}
        return subprocess.run([str(py), __file__, *sys.argv[1:]], env=env).returncode
    sys.path.insert(0, str(HERE))
    if "--cluster" in sys.argv[1:]:
        import in_cluster
        import migration

        # further words: only the tests whose names hold one of them;
        # --skip=WORD: not those whose names hold WORD (the test command
        # runs the KMS chart's test in an earlier lane)
        wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
        skipped = [a.removeprefix("--skip=") for a in sys.argv[1:] if a.startswith("--skip=")]
        return run([(n, t) for n, t in in_cluster.TESTS + migration.TESTS
                    if (not wanted or any(w in n for w in wanted)) and not any(w in n for w in skipped)])
    import cinder_cases
    import kms_cases
    import manila_cases

    return run(cinder_cases.TESTS + manila_cases.TESTS + kms_cases.TESTS)


if __name__ == "__main__":
    sys.exit(main())

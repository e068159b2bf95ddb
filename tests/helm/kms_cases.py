"""What the barbican-kms-plugin chart must render."""

import yaml

from charts import Rendering, drift, fails_to_render, kustomize, load_fixture

import validate

CHART = "barbican-kms-plugin"
PLUGIN = ("DaemonSet", "barbican-kms-plugin")


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def encryption_configuration(notes):
    """The EncryptionConfiguration NOTES.txt tells the operator to write."""
    lines = notes.splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip().startswith("apiVersion: apiserver.config.k8s.io/v1"))
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for l in lines[start:]:
        if not l.strip():
            break
        block.append(l[indent:])
    return yaml.safe_load("\n".join(block))


def the_default_rendering_is_deploy_kms_base():
    r = Rendering(CHART, None, namespace="kube-system")
    problems = drift([d for _, d in r.docs], kustomize("deploy/kms/base"), "deploy/kms/base")
    expect(not problems, "the chart and deploy/ drifted:\n" + "\n".join(problems))
    return [r]


def the_notes_give_an_encryption_configuration_for_this_socket():
    """What NOTES.txt says to give the apiserver is a valid
    EncryptionConfiguration naming the socket the plugin serves."""
    for values in (None, load_fixture("kms-operator.yaml")):
        r = Rendering(CHART, values)
        config = encryption_configuration(r.notes)
        _, problems = validate.validate([("NOTES.txt", config)])
        expect(not problems, problems)
        endpoint = config["resources"][0]["providers"][0]["kms"]["endpoint"]
        args = r.container(*PLUGIN, "barbican-kms-plugin")["args"]
        socket = next(a.split("=", 1)[1] for a in args if a.startswith("--socketpath="))
        expect(endpoint == f"unix://{socket}", f"the apiserver dials {endpoint}, the plugin serves {socket}")


def an_operators_values_take_effect():
    r = Rendering(CHART, load_fixture("kms-operator.yaml"))
    plugin = r.container(*PLUGIN, "barbican-kms-plugin")
    args = plugin["args"]
    for arg in ("--socketpath=/run/kms/barbican.sock", "--cloud-config=/etc/kubernetes/cloud-config/kms.conf",
                "--previous-key-id=11111111-2222-4333-8444-555555555555", "--log-level=debug"):
        expect(arg in args, f"{arg} not in {args}")
    pod = r.pod(*PLUGIN)
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    expect(paths == {"kms-socket": "/run/kms", "cloud-config": "/etc/barbican/kms.conf"}, paths)
    expect("--http-endpoint=0.0.0.0:9899" in args, args)
    expect({"name": "kms-socket", "mountPath": "/run/kms"} in plugin["volumeMounts"], plugin["volumeMounts"])
    expect(pod["nodeSelector"] == {"node-role.kubernetes.io/master": "true"}, "nodeSelector")
    expect(not any("secret" in v for v in pod["volumes"]), "credentials never from a Secret")
    monitor = r.get("PodMonitor", "barbican-kms-plugin")
    expect(monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack", "additionalLabels")
    expect("imagePullSecrets are Secrets, and this plugin encrypts Secrets" in r.notes,
           "the NOTES warn that a pull Secret cannot be read on a cold start")
    return [r]


def the_plugin_boots_a_cold_control_plane():
    """Nothing the plugin needs to start may need the apiserver, which
    needs the plugin: no cluster DNS, no Secret; its port on loopback; its
    cloud.conf alone, never the folder around it; the node's
    not-yet-initialised taint tolerated."""
    for values in (None, {"cloudConfig": {"hostDir": "/etc/kubernetes"}}):
        r = Rendering(CHART, values)
        pod = r.pod(*PLUGIN)
        plugin = r.container(*PLUGIN, "barbican-kms-plugin")
        expect(pod.get("dnsPolicy") == "Default", f"dnsPolicy {pod.get('dnsPolicy')}: cluster DNS needs the apiserver")
        expect("--http-endpoint=127.0.0.1:9899" in plugin["args"], plugin["args"])
        expect(plugin["livenessProbe"]["httpGet"].get("host") == "127.0.0.1", plugin["livenessProbe"])
        expect("ports" not in plugin, "no port declared for a loopback listener")
        config = next(v["hostPath"] for v in pod["volumes"] if v["name"] == "cloud-config")
        expect(config["type"] == "File" and config["path"].endswith("/cloud.conf"),
               f"cloud.conf alone, never a folder (with /etc/kubernetes, the cluster's keys): {config}")
        mount = next(m for m in plugin["volumeMounts"] if m["name"] == "cloud-config")
        expect(mount["mountPath"] == "/etc/kubernetes/cloud-config/cloud.conf", mount)
        expect({"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists",
                "effect": "NoSchedule"} in pod["tolerations"], pod["tolerations"])
        expect(not pod.get("imagePullSecrets"), "no pull Secret by default")
        expect("imagePullSecrets are Secrets" not in r.notes, "the warning only where it applies")
    fails_to_render(CHART, {"podMonitor": {"enabled": True}}, "Prometheus cannot scrape")
    fails_to_render(CHART, {"httpEndpoint": {"address": "127.0.0.1; rm -rf /"}}, "/httpEndpoint/address")
    return [r]


def a_cloud_conf_that_is_not_a_host_path_is_refused():
    fails_to_render(CHART, {"cloudConfig": {"hostDir": "cloud-config-secret"}}, "never a Secret")
    fails_to_render(CHART, {"socketDir": "kms"}, "/socketDir")
    fails_to_render(CHART, {"refreshInterval": 300}, "/refreshInterval")


TESTS = [(f"{CHART}/{f.__name__}", f) for f in (
    the_default_rendering_is_deploy_kms_base,
    the_notes_give_an_encryption_configuration_for_this_socket,
    an_operators_values_take_effect,
    the_plugin_boots_a_cold_control_plane,
    a_cloud_conf_that_is_not_a_host_path_is_refused,
)]

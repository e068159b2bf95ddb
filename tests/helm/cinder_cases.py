"""What the openstack-cinder-csi chart must render for each fixture."""

from charts import Rendering, drift, fails_to_render, kustomize, load_fixture

CHART = "openstack-cinder-csi"
CONTROLLER = ("Deployment", "csi-cinder-controllerplugin")
NODE = ("DaemonSet", "csi-cinder-nodeplugin")
SIDECARS = ("csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "liveness-probe")


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def volume(pod, name):
    found = [v for v in pod["volumes"] if v["name"] == name]
    expect(len(found) == 1, f"one volume {name}, not {found}")
    return found[0]


def the_default_rendering_is_deploy_cinder_base():
    """The chart with deploy/'s Secrets and classes left out renders
    exactly what `kubectl kustomize deploy/cinder/example` does, but its
    namespace, Secrets and classes (each cluster's own), once Helm's
    labels are set aside."""
    r = Rendering(CHART, load_fixture("cinder-deploy.yaml"))
    deployed = [d for d in kustomize("deploy/cinder/example")
                if d["kind"] not in ("Namespace", "Secret", "StorageClass", "VolumeSnapshotClass")]
    problems = drift([d for _, d in r.docs], deployed, "deploy/cinder/example")
    expect(not problems, "the chart and deploy/ drifted:\n" + "\n".join(problems))
    return [r]


def the_defaults_differ_from_deploy_only_in_the_stated_values():
    """The chart's own defaults: the cloud.conf from the hosts'
    /etc/config and their CA bundles from /etc/cacert (upstream's
    defaults), and upstream's two classes; nothing else differs from
    deploy/'s rendering (cinder-deploy.yaml sets just these)."""
    r = Rendering(CHART, None)
    for kind, name in (CONTROLLER, NODE):
        cc = volume(r.pod(kind, name), "cloud-config")
        expect(cc == {"name": "cloud-config", "hostPath": {"path": "/etc/config"}}, f"{name}: {cc}")
        ca = volume(r.pod(kind, name), "cacert")
        expect(ca == {"name": "cacert", "hostPath": {"path": "/etc/cacert"}}, f"{name}: {ca}")
    classes = {c["metadata"]["name"]: c for c in r.objects("StorageClass")}
    expect(set(classes) == {"csi-cinder-sc-delete", "csi-cinder-sc-retain"}, f"classes {sorted(classes)}")
    expect(classes["csi-cinder-sc-retain"]["reclaimPolicy"] == "Retain", "the retain class retains")
    expect(all(c["allowVolumeExpansion"] is True and c["volumeBindingMode"] == "WaitForFirstConsumer"
               for c in classes.values()), "classes expand and wait for their first consumer")
    expect("credentials included" in r.notes, "NOTES warns that the node plugins read the credentials")
    # the hosts' cloud.conf is root's: the controller's plugin, and only
    # it, reads it as root, with no capability
    plugin = r.container(*CONTROLLER, "cinder-csi-plugin")["securityContext"]
    expect(plugin.get("runAsUser") == 0 and plugin.get("runAsNonRoot") is False
           and plugin.get("capabilities") == {"drop": ["ALL"]} and plugin.get("allowPrivilegeEscalation") is False,
           f"the plugin reading the hosts' cloud.conf: {plugin}")
    for c in r.pod(*CONTROLLER)["containers"]:
        if c["name"] != "cinder-csi-plugin":
            expect("runAsUser" not in c.get("securityContext", {}), f"{c['name']} keeps the pod's user")
    expect(r.pod(*CONTROLLER)["securityContext"]["runAsUser"] == 65532, "the pod's user")
    expect("reads the hosts' cloud.conf as root" in r.notes, f"NOTES: {r.notes}")
    return [r]


def upstreams_values_file_installs_unchanged():
    """Every key of upstream's values at upstream's defaults: its sidecar
    pins, host-mounted cloud.conf, CA mount, no metrics endpoint, and its
    plugin repository (named in NOTES: upstream's Go image takes other
    flags)."""
    r = Rendering(CHART, load_fixture("cinder-upstream-defaults.yaml"))
    images = {c["name"]: c["image"] for c in r.pod(*CONTROLLER)["containers"]}
    expect(images["csi-attacher"] == "registry.k8s.io/sig-storage/csi-attacher:v4.10.0", images)
    expect(images["csi-provisioner"] == "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0", images)
    expect(images["cinder-csi-plugin"] == "registry.k8s.io/provider-os/cinder-csi-plugin:0.1.0", images)
    # a flag provisioner v5.3 does not know is left out (it would not start)
    expect(not any(a.startswith("--snapshot-orphan-sweep-interval")
                   for a in r.container(*CONTROLLER, "csi-provisioner")["args"]), "no v6.3 flag for v5.3")
    expect("is upstream's Go plugin" in r.notes, f"NOTES names the upstream image: {r.notes}")
    plugin = r.container(*CONTROLLER, "cinder-csi-plugin")
    expect(not any(a.startswith("--http-endpoint") for a in plugin["args"]), "httpEndpoint off: no --http-endpoint")
    expect({m["mountPath"] for m in plugin["volumeMounts"]} == {"/csi", "/etc/cacert", "/etc/config"},
           plugin["volumeMounts"])
    for kind, name in (CONTROLLER, NODE):
        expect(volume(r.pod(kind, name), "cacert") == {"name": "cacert", "hostPath": {"path": "/etc/cacert"}},
               "the CA bundle from the host")
        for c in r.pod(kind, name)["containers"]:
            if c["name"] != "cinder-csi-plugin":
                expect("-v=2" in c["args"], f"{c['name']}: -v=2")
    # upstream's empty security contexts leave this chart's own in place
    expect(r.pod(*CONTROLLER)["securityContext"]["runAsNonRoot"] is True, "the controller runs as non-root")
    expect(r.container(*NODE, "cinder-csi-plugin")["securityContext"]["privileged"] is True, "the node plugin")
    return [r]


def an_operators_values_take_effect():
    r = Rendering(CHART, load_fixture("cinder-operator.yaml"))
    secrets = {s["metadata"]["name"]: s for s in r.objects("Secret")}
    expect(set(secrets) == {"cinder-csi-cloud-config", "cinder-csi-cloud-config-node"}, sorted(secrets))
    expect("application-credential-secret" in secrets["cinder-csi-cloud-config"]["stringData"]["cloud.conf"],
           "the controller's Secret holds the credentials")
    expect("[Global]" not in secrets["cinder-csi-cloud-config-node"]["stringData"]["cloud.conf"],
           "the node's holds none")
    expect(volume(r.pod(*CONTROLLER), "cloud-config")["secret"]["secretName"] == "cinder-csi-cloud-config", "")
    expect(volume(r.pod(*NODE), "cloud-config")["secret"]["secretName"] == "cinder-csi-cloud-config-node", "")
    expect("credentials included" not in r.notes, "no warning once the nodes have their own Secret")

    provisioner = r.container(*CONTROLLER, "csi-provisioner")
    expect(provisioner["args"][-2:] == ["--worker-threads=20", "--kube-api-qps=50"], provisioner["args"])
    expect(provisioner["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"}}, provisioner["resources"])
    expect(r.container(*CONTROLLER, "csi-attacher")["args"][-1] == "--worker-threads=20", "list form")
    expect(r.container(*CONTROLLER, "csi-resizer")["args"][-1] == "--workers=5", "map form")
    expect({"name": "GOMAXPROCS", "value": "2"} in r.container(*CONTROLLER, "csi-snapshotter")["env"], "extraEnv")
    snapshotter_role = r.get("ClusterRole", "csi-cinder-snapshotter")
    expect({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]} in snapshotter_role["rules"],
           "extraRbac")

    for kind, name in (CONTROLLER, NODE):
        plugin = r.container(kind, name, "cinder-csi-plugin")
        expect(plugin["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
               f"{name}: csi.plugin.resources")
        expect({"name": "OS_CCM_REGIONAL", "value": "true"} in plugin["env"], f"{name}: csi.plugin.extraEnv")
        pod = r.pod(kind, name)
        expect(pod["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["keystone.example.com"]}], "hostAliases")
        expect(pod["priorityClassName"] == "system-cluster-critical", "priorityClassName")
        expect(pod["imagePullSecrets"] == [{"name": "my-imagepull-secret"}], "imagePullSecrets")
        expect(r.get(kind, name)["metadata"]["annotations"] == {"owner": "platform-team"}, "commonAnnotations")
    controller = r.get(*CONTROLLER)
    expect(controller["spec"]["replicas"] == 2, "replicas")
    tpl = controller["spec"]["template"]
    expect(tpl["metadata"]["annotations"] == {"team": "storage", "owner": "platform-team"}, tpl["metadata"])
    # deploy/'s app (the selector), upstream's chart's pod labels and
    # extraLabels (which reach upstream's pods too), podLabels
    for kind, name in (CONTROLLER, NODE):
        labels = r.get(kind, name)["spec"]["template"]["metadata"]["labels"]
        component = name.removeprefix("csi-cinder-")
        want = {"app": name, "component": component, "release": r.release,
                "chart": f"openstack-cinder-csi-{r.chart_version}", "heritage": "Helm", "team": "storage"}
        expect({k: labels.get(k) for k in want} == want, f"{name}: pod labels {labels}")
    expect(tpl["metadata"]["labels"]["tier"] == "control", "podLabels")
    expect(controller["spec"]["selector"]["matchLabels"] == {"app": "csi-cinder-controllerplugin"},
           "the selector never changes with the values")
    expect(tpl["spec"]["securityContext"]["runAsUser"] == 1001, "podSecurityContext")
    expect(tpl["spec"]["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}, "nodeSelector")
    expect(tpl["spec"]["hostNetwork"] is True and tpl["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet",
           "controllerPlugin.hostNetwork")
    plugin = r.container(*CONTROLLER, "cinder-csi-plugin")
    expect("runAsUser" not in plugin["securityContext"], f"a Secret's cloud.conf: the pod's user {plugin}")
    expect("as root" not in r.notes, "no root reader named")
    expect("--http-endpoint=:8080" in plugin["args"], plugin["args"])
    expect({"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in plugin["ports"], plugin["ports"])
    expect({"name": "CLUSTER_NAME", "value": "prod-eu-1"} in plugin["env"], "clusterID")
    monitor = r.get("PodMonitor", "csi-cinder-controllerplugin")
    expect(monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack", "podMonitor.additionalLabels")
    expect(monitor["spec"].get("jobLabel") == "component", f"upstream's job label: {monitor['spec']}")
    classes = {c["metadata"]["name"]: c for c in r.objects("StorageClass")}
    expect(set(classes) == {"csi-cinder-sc-delete", "csi-cinder-sc-retain", "sas"}, sorted(classes))
    expect(classes["csi-cinder-sc-delete"]["metadata"]["annotations"]
           == {"storageclass.kubernetes.io/is-default-class": "true"}, "isDefault")
    expect(r.get("VolumeSnapshotClass", "csi-cinder-snapclass")["deletionPolicy"] == "Delete", "custom")
    return [r]


def multi_cloud_arguments_reach_the_plugins():
    r = Rendering(CHART, load_fixture("cinder-multicloud.yaml"))
    controller = r.container(*CONTROLLER, "cinder-csi-plugin")["args"]
    expect(controller[-2:] == ["--cloud-name=region-a", "--cloud-name=region-b"], controller)
    node = r.container(*NODE, "cinder-csi-plugin")["args"]
    expect(node[-2:] == ["--cloud-name=region-a", "--additional-topology=topology.kubernetes.io/region=region-a"],
           node)
    for kind, name in (CONTROLLER, NODE):
        expect(volume(r.pod(kind, name), "cloud-config")["secret"]["secretName"] == "cloud-config-multi", name)
    return [r]


def a_custom_kubelet_directory_is_used_everywhere():
    r = Rendering(CHART, load_fixture("cinder-kubelet-dir.yaml"))
    kubelet = "/var/lib/k0s/kubelet"
    pod = r.pod(*NODE)
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    expect(paths["kubelet-dir"] == kubelet, paths)
    expect(paths["socket-dir"] == f"{kubelet}/plugins/cinder.csi.openstack.org", paths)
    expect(paths["registration-dir"] == f"{kubelet}/plugins_registry", paths)
    plugin = r.container(*NODE, "cinder-csi-plugin")
    expect(f"--path-root={kubelet}" in plugin["args"], plugin["args"])
    mount = [m for m in plugin["volumeMounts"] if m["name"] == "kubelet-dir"][0]
    expect(mount == {"name": "kubelet-dir", "mountPath": kubelet, "mountPropagation": "Bidirectional"}, mount)
    registrar = r.container(*NODE, "node-driver-registrar")
    expect(f"--kubelet-registration-path={kubelet}/plugins/cinder.csi.openstack.org/csi.sock" in registrar["args"],
           registrar["args"])
    # logVerbosityLevel 5: the sidecars at -v=5, the plugins at debug
    expect("-v=5" in registrar["args"], registrar["args"])
    expect("--log-level=debug" in plugin["args"], plugin["args"])
    return [r]


def values_that_cannot_work_are_refused_when_rendered():
    fails_to_render(CHART, {"secret": {"enabled": True}}, "secret.name")
    fails_to_render(CHART, {"secret": {"enabled": True, "create": True, "name": "x"}}, "secret.data")
    fails_to_render(CHART, {"csi": {"plugin": {"httpEndpoint": {"enabled": False}, "podMonitor": {"enabled": True}}}},
                    "httpEndpoint")
    # values.schema.json: the wrong type or shape, named by its path
    fails_to_render(CHART, {"csi": {"plugin": {"controllerPlugin": {"replicas": "two"}}}},
                    "/csi/plugin/controllerPlugin/replicas")
    fails_to_render(CHART, {"csi": {"plugin": {"nodePlugin": {"kubeletDir": "var/lib/kubelet"}}}},
                    "/csi/plugin/nodePlugin/kubeletDir")
    fails_to_render(CHART, {"secret": {"filename": "../../etc/shadow"}}, "/secret/filename")
    # a VolumeSnapshotClass where no snapshot CRDs are (Helm's engine
    # offline knows no CRD): refused, naming them
    fails_to_render(CHART, {"volumeSnapshotClass": {"enabled": True}}, "snapshot CRDs")


def upstream_keys_with_no_use_here_are_named():
    r = Rendering(CHART, {"nameOverride": "cinder"})
    expect("Not used: nameOverride" in r.notes, r.notes)
    r.get(*CONTROLLER)
    return [r]


def pvc_annotations_reach_the_controller_plugin_alone():
    """pvcAnnotations: the controller plugin reads its claims' placement
    (its provisioner passes the claim, its ServiceAccount may get it)."""
    on = Rendering(CHART, {"pvcAnnotations": True})
    off = Rendering(CHART, None)
    args = lambda r, kind, name: r.container(kind, name, "cinder-csi-plugin").get("args", [])
    expect("--pvc-annotations" in args(on, *CONTROLLER), args(on, *CONTROLLER))
    expect("--pvc-annotations" not in args(off, *CONTROLLER), args(off, *CONTROLLER))
    expect("--pvc-annotations" not in args(on, *NODE), args(on, *NODE))
    expect("--extra-create-metadata" in on.container(*CONTROLLER, "csi-provisioner").get("args", []),
           "the provisioner must name the claim")
    expect(("", "persistentvolumeclaims", "get") in on.granted("csi-cinder-controller-sa"),
           "the controller must read the claim")
    expect("pvcAnnotations" not in on.notes, on.notes)
    return [on, off]


def no_policy_no_verb_it_guards():
    """The node plugins may patch Nodes only under the admission policy
    that confines the patch to lifting their own startup taint: without the
    policy, no patch of any Node."""
    on = Rendering(CHART, None)
    expect(("", "nodes", "patch") in on.granted("csi-cinder-node-sa"), "the taint lift needs the patch")
    on.get("ValidatingAdmissionPolicy", "csi-cinder-node-startup-taint")
    off = Rendering(CHART, {"csi": {"plugin": {"nodePlugin": {"startupTaintPolicy": {"enabled": False}}}}})
    expect(not off.objects("ValidatingAdmissionPolicy"), "no policy")
    granted = off.granted("csi-cinder-node-sa")
    expect(("", "nodes", "patch") not in granted, f"a node's token could taint, label or cordon any node: {granted}")
    expect(("", "nodes", "get") in granted, "the pre-stop hook still reads its node")
    return [on, off]


def the_node_plugins_get_none_of_the_credentials_the_chart_holds():
    """Upstream's way (secret.create with the cloud.conf in secret.data,
    no node Secret named): the node plugins get a Secret the chart makes
    from the same cloud.conf less its secrets, and the controller the
    whole of it."""
    conf = ("[Global]\nauth-url=https://keystone.example.com:5000/v3\nusername=csi\n"
            "Password = hunter2\napplication-credential-secret=s3cret\ntrustee-password=tr-pw-77\n"
            "[Global \"b\"]\ntoken=tok-42\n[BlockStorage]\nnode-volume-attach-limit=25\n"
            "[Metadata]\nsearch-order=configDrive,metadataService\n")
    r = Rendering(CHART, {"secret": {"enabled": True, "create": True, "name": "cc",
                                     "data": {"cloud.conf": conf, "clouds.yaml": "password: other"}}})
    secrets = {s["metadata"]["name"]: s["stringData"] for s in r.objects("Secret")}
    expect(set(secrets) == {"cc", "cc-node"}, sorted(secrets))
    expect(secrets["cc"]["cloud.conf"] == conf, "the controller's holds all")
    node = secrets["cc-node"]
    expect(set(node) == {"cloud.conf"}, f"only the cloud.conf: {sorted(node)}")
    for secret in ("hunter2", "s3cret", "tr-pw-77", "tok-42"):
        expect(secret not in node["cloud.conf"], f"{secret} reaches the nodes: {node['cloud.conf']}")
    for kept in ("node-volume-attach-limit=25", "search-order=configDrive,metadataService", "username=csi"):
        expect(kept in node["cloud.conf"], f"{kept} lost: {node['cloud.conf']}")
    expect(volume(r.pod(*NODE), "cloud-config")["secret"]["secretName"] == "cc-node", "the nodes read theirs")
    expect(volume(r.pod(*CONTROLLER), "cloud-config")["secret"]["secretName"] == "cc", "the controller the whole")
    expect("credentials included" not in r.notes and "cc-node" in r.notes, r.notes)
    # a Secret made elsewhere cannot be read here: the nodes share it, and NOTES says so
    shared = Rendering(CHART, {"secret": {"enabled": True, "create": False, "name": "cc"}})
    expect(volume(shared.pod(*NODE), "cloud-config")["secret"]["secretName"] == "cc", "")
    expect("credentials included" in shared.notes, shared.notes)
    fails_to_render(CHART, {"secret": {"enabled": True, "create": True, "name": "cc",
                                       "data": {"other.conf": "[Global]\n"}}}, "no cloud.conf (secret.filename)")
    return [r, shared]


def values_in_the_types_upstreams_chart_takes_render_what_they_mean():
    """Upstream's chart has no schema: an operator's values give numbers
    as strings (`--set`, quoted YAML), a cluster id as a number, a Go
    duration of two units. Each is taken and means what it says; a
    million or more from a values file (a float64 to Helm) renders its
    digits, not Go's exponent."""
    r = Rendering(CHART, {
        "timeout": "1m30s",
        "clusterID": 12345678,
        "logVerbosityLevel": "4",
        "csi": {"plugin": {"image": {"tag": 1.31},
                           "httpEndpoint": {"enabled": True, "port": "9090"},
                           "controllerPlugin": {"replicas": "2"}},
                "livenessprobe": {"failureThreshold": "5"}},
    })
    expect("--timeout=1m30s" in r.container(*CONTROLLER, "csi-provisioner")["args"], "the timeout")
    plugin = r.container(*CONTROLLER, "cinder-csi-plugin")
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    expect(env["CLUSTER_NAME"] == "12345678", f"the cluster id's digits: {env}")
    expect(r.get(*CONTROLLER)["spec"]["replicas"] == 2, "two replicas, a number")
    expect("--http-endpoint=:9090" in plugin["args"], plugin["args"])
    expect({"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in plugin["ports"], plugin["ports"])
    expect("--log-level=debug" in plugin["args"], f"verbosity 4 is debug: {plugin['args']}")
    expect("-v=4" in r.container(*CONTROLLER, "csi-provisioner")["args"], "the sidecars' verbosity")
    expect(plugin["image"].endswith(":1.31"), plugin["image"])
    expect(plugin["livenessProbe"]["failureThreshold"] == 5, plugin["livenessProbe"])
    # what no reading makes work is still refused, by its path
    fails_to_render(CHART, {"timeout": "90"}, "/timeout")
    fails_to_render(CHART, {"csi": {"plugin": {"httpEndpoint": {"port": "70000"}}}}, "/csi/plugin/httpEndpoint/port")
    fails_to_render(CHART, {"logVerbosityLevel": "-1"}, "/logVerbosityLevel")
    return [r]


def the_csidriver_keeps_upstreams_immutable_fields():
    """The CSIDriver fields the apiserver will not change hold upstream's
    values (chart 2.36: both lifecycle modes, attach required), so that
    `helm upgrade` of upstream's release to this chart, or `kubectl
    apply` of deploy/ over upstream's manifests, is not refused; the
    modes come from the installed object when there is one (Helm's
    `lookup`, empty when rendered offline)."""
    r = Rendering(CHART, {})
    spec = r.get("CSIDriver", "cinder.csi.openstack.org")["spec"]
    expect(spec["volumeLifecycleModes"] == ["Persistent", "Ephemeral"], spec)
    expect(spec["attachRequired"] is True, spec)
    deployed = [d for d in kustomize("deploy/cinder/example") if d["kind"] == "CSIDriver"]
    expect([d["spec"]["volumeLifecycleModes"] for d in deployed] == [["Persistent", "Ephemeral"]],
           f"deploy/: {deployed}")
    return [r]


TESTS = [(f"{CHART}/{f.__name__}", f) for f in (
    the_default_rendering_is_deploy_cinder_base,
    the_defaults_differ_from_deploy_only_in_the_stated_values,
    upstreams_values_file_installs_unchanged,
    an_operators_values_take_effect,
    multi_cloud_arguments_reach_the_plugins,
    a_custom_kubelet_directory_is_used_everywhere,
    values_that_cannot_work_are_refused_when_rendered,
    upstream_keys_with_no_use_here_are_named,
    pvc_annotations_reach_the_controller_plugin_alone,
    no_policy_no_verb_it_guards,
    the_node_plugins_get_none_of_the_credentials_the_chart_holds,
    values_in_the_types_upstreams_chart_takes_render_what_they_mean,
    the_csidriver_keeps_upstreams_immutable_fields,
)]

"""What the openstack-manila-csi chart must render for each fixture."""

from charts import Rendering, drift, fails_to_render, kustomize, load_fixture

CHART = "openstack-manila-csi"
NFS_CONTROLLER = ("Deployment", "csi-manila-nfs-controllerplugin")
CEPHFS_CONTROLLER = ("Deployment", "csi-manila-cephfs-controllerplugin")
NFS_NODE = ("DaemonSet", "csi-manila-nfs-nodeplugin")
CEPHFS_NODE = ("DaemonSet", "csi-manila-cephfs-nodeplugin")
WORKLOADS = (NFS_CONTROLLER, CEPHFS_CONTROLLER, NFS_NODE, CEPHFS_NODE)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def args_of(r, workload):
    return r.container(*workload, "manila-csi-plugin")["args"]


def the_default_rendering_is_deploy_manila_base():
    """With deploy/'s cloud.conf Secrets named, the chart renders exactly
    what `kubectl kustomize deploy/manila/example` does, its runtime
    ConfigMap included, but its namespace, Secrets and classes (each
    cluster's own), once Helm's labels are set aside."""
    r = Rendering(CHART, load_fixture("manila-deploy.yaml"))
    deployed = [d for d in kustomize("deploy/manila/example")
                if d["kind"] not in ("Namespace", "Secret", "StorageClass", "VolumeSnapshotClass")]
    problems = drift([d for _, d in r.docs], deployed, "deploy/manila/example")
    expect(not problems, "the chart and deploy/ drifted:\n" + "\n".join(problems))
    return [r]


def upstreams_values_file_installs_unchanged():
    """Upstream's defaults: NFS alone, no cloud.conf (credentials from
    each StorageClass's secrets), its sidecar pins; the partner plugin's
    endpoint and the empty cluster id named in NOTES."""
    r = Rendering(CHART, load_fixture("manila-upstream-defaults.yaml"))
    drivers = {d["metadata"]["name"]: d for d in r.objects("CSIDriver")}
    expect(set(drivers) == {"nfs.manila.csi.openstack.org"}, sorted(drivers))
    expect(drivers["nfs.manila.csi.openstack.org"]["spec"]["fsGroupPolicy"] == "None", "NFS: fsGroupPolicy None")
    expect({d["metadata"]["name"] for d in r.objects("Deployment")} == {"csi-manila-nfs-controllerplugin"}, "")
    expect({d["metadata"]["name"] for d in r.objects("DaemonSet")} == {"csi-manila-nfs-nodeplugin"}, "")
    expect(not r.objects("PodTemplate") and not r.objects("Role") or
           {d["metadata"]["name"] for d in r.objects("Role")} == {"csi-manila-leader-election"},
           "no mount pods without CephFS")
    for workload in (NFS_CONTROLLER, NFS_NODE):
        args = args_of(r, workload)
        expect(not any(a.startswith("--cloud-config") for a in args), f"no cloud.conf: {args}")
        expect(not any(a.startswith("--fwdendpoint") for a in args), "no partner plugin")
        expect(not any(a.startswith("--runtime-config-file") for a in args), "runtimeConfig off: none read")
        expect("cloud-config" not in {v["name"] for v in r.pod(*workload)["volumes"]}, "no cloud.conf volume")
    provisioner = r.container(*NFS_CONTROLLER, "csi-provisioner")
    expect(provisioner["image"] == "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0", provisioner["image"])
    expect("--extra-create-metadata" not in provisioner["args"], "extraCreateMetadata: false")
    expect(not any(a.startswith("--snapshot-orphan-sweep-interval") for a in provisioner["args"]),
           "no v6.3 flag for provisioner v5.3")
    expect("tolerations" not in r.pod(*NFS_NODE), "upstream's nodes tolerate nothing")
    expect("priorityClassName" not in r.pod(*NFS_NODE), "nor have a priority class")
    for note in ("fwdNodePluginEndpoint", "clusterID is empty", "upstream's Go plugin", "runtimeConfig is off"):
        expect(note in r.notes, f"NOTES names {note}: {r.notes}")
    return [r]


def an_operators_values_take_effect():
    r = Rendering(CHART, load_fixture("manila-operator.yaml"))
    drivers = {d["metadata"]["name"]: d["spec"]["fsGroupPolicy"] for d in r.objects("CSIDriver")}
    expect(drivers == {"nfs.manila.csi.openstack.org": "None", "cephfs.manila.csi.openstack.org": "File"}, drivers)
    config = r.get("ConfigMap", "manila-csi-runtime-config")
    expect('"defaultShareClient": "10.30.0.0/16"' in config["data"]["runtimeconfig.json"], config)
    for workload in WORKLOADS:
        args = args_of(r, workload)
        expect("--with-topology" in args, f"{workload[1]}: topology {args}")
        expect("--log-level=trace" in args, f"{workload[1]}: logVerbosityLevel 6")
        expect("--runtime-config-file=/etc/manila-runtime/runtimeconfig.json" in args, args)
        expect(any(a.startswith("--cloud-config=") for a in args), f"{workload[1]}: cloud.conf")
        pod = r.pod(*workload)
        expect(pod["imagePullSecrets"] == [{"name": "my-imagepull-secret"}], "imagePullSecrets")
        expect(r.get(*workload)["metadata"]["labels"]["team"] == "storage", "extraLabels")
        # upstream's chart's pod labels and extraLabels reach the pods
        labels = r.get(*workload)["spec"]["template"]["metadata"]["labels"]
        component = "controllerplugin" if workload[0] == "Deployment" else "nodeplugin"
        want = {"app": workload[1], "component": component, "release": r.release,
                "chart": f"openstack-manila-csi-{r.chart_version}", "heritage": "Helm", "team": "storage"}
        expect({k: labels.get(k) for k in want} == want, f"{workload[1]}: pod labels {labels}")
        env = r.container(*workload, "manila-csi-plugin")["env"]
        expect({"name": "RUST_BACKTRACE", "value": "1"} in env, f"{workload[1]}: extraEnv")
    for workload in (NFS_CONTROLLER, CEPHFS_CONTROLLER):
        env = r.container(*workload, "manila-csi-plugin")["env"]
        expect({"name": "CLUSTER_NAME", "value": "prod-eu-1"} in env, "clusterID")
        provisioner = r.container(*workload, "csi-provisioner")
        expect("--feature-gates=Topology=true" in provisioner["args"], provisioner["args"])
        expect("--extra-create-metadata" in provisioner["args"], provisioner["args"])
        expect(provisioner["resources"] == {"requests": {"cpu": "20m"}}, provisioner["resources"])
        pod = r.pod(*workload)
        expect(pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}, "controller nodeSelector")
        expect(pod["hostNetwork"] is True, "controllerplugin.hostNetwork")
        expect(r.get(*workload)["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1},
               "controllerplugin.strategy")
        expect(pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1001, "runAsGroup": 65532,
                                          "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
               f"podSecurityContext merged over this chart's: {pod['securityContext']}")
        sc = {v["name"]: v for v in pod["volumes"]}["cloud-config"]["secret"]["secretName"]
        expect(sc == "manila-cloud-config", sc)
    for workload in (NFS_NODE, CEPHFS_NODE):
        pod = r.pod(*workload)
        plugin = r.container(*workload, "manila-csi-plugin")
        expect(plugin["resources"] == {"limits": {"memory": "256Mi"}}, plugin["resources"])
        expect(plugin["args"][-1] == "--metadata-url=http://169.254.169.254/", plugin["args"])
        expect({"name": "cacert", "mountPath": "/etc/cacert", "readOnly": True} in plugin["volumeMounts"], "mounts")
        expect({"name": "cacert", "hostPath": {"path": "/etc/cacert"}} in pod["volumes"], "volumes")
        expect(pod["tolerations"] == [{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}], "tolerations")
        expect(pod["nodeSelector"] == {"storage/nodes": "true"}, "nodeSelector")
        expect(pod["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["manila.example.com"]}], "hostAliases")
        expect("priorityClassName" not in pod, "priorityClassName emptied by the operator")
        expect(r.container(*workload, "node-driver-registrar")["resources"] == {"requests": {"cpu": "5m"}}, "")
        sc = {v["name"]: v for v in pod["volumes"]}["cloud-config"]["secret"]["secretName"]
        expect(sc == "manila-cloud-config-node", sc)
    expect("--mount-pods" in args_of(r, CEPHFS_NODE), "CephFS mounts through mount pods")
    expect("--mount-pods" not in args_of(r, NFS_NODE), "NFS does not")
    for note in ("csimanila.pvcAnnotations: a claim whose annotations ask for a placement", "fwdNodePluginEndpoint"):
        expect(note in r.notes, f"NOTES names {note}")
    for workload in (NFS_CONTROLLER, CEPHFS_CONTROLLER):
        expect("--pvc-annotations" in args_of(r, workload), f"{workload}: reads its claims")
    for workload in (NFS_NODE, CEPHFS_NODE):
        expect("--pvc-annotations" not in args_of(r, workload), f"{workload}: reads no claim")
    return [r]


def a_custom_kubelet_directory_is_used_everywhere():
    """Every path of kubelet's directory follows kubeletDir: the node's
    mounts, sockets and state, and the mount pods' template, which the
    admission policy holds each mount pod to."""
    r = Rendering(CHART, load_fixture("manila-kubelet-dir.yaml"))
    kubelet = "/var/lib/k0s/kubelet"
    expect({d["metadata"]["name"] for d in r.objects("DaemonSet")} == {"csi-manila-cephfs-nodeplugin"}, "CephFS alone")
    pod = r.pod(*CEPHFS_NODE)
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    expect(paths["kubelet-dir"] == kubelet, paths)
    expect(paths["socket-dir"] == f"{kubelet}/plugins/cephfs.manila.csi.openstack.org", paths)
    expect(paths["registration-dir"] == f"{kubelet}/plugins_registry", paths)
    args = args_of(r, CEPHFS_NODE)
    expect(f"--path-root={kubelet}" in args, args)
    expect(f"--state-dir={kubelet}/plugins/cephfs.manila.csi.openstack.org/state" in args, args)
    template = r.get("PodTemplate", "csi-manila-mount-pod")["template"]["spec"]
    expect({"name": "kubelet-dir", "hostPath": {"path": kubelet}} in template["volumes"], template["volumes"])
    expect(template["containers"][0]["image"] == r.container(*CEPHFS_NODE, "manila-csi-plugin")["image"],
           "the mount pods run the plugin's image")
    policy = r.get("ValidatingAdmissionPolicy", "csi-manila-node-startup-taint")
    taints = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["startupTaints"]
    expect(taints == "['cephfs.manila.csi.openstack.org/agent-not-ready']", taints)
    binding = r.get("ValidatingAdmissionPolicyBinding", "csi-manila-mount-pods")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    expect(selector == {"kubernetes.io/metadata.name": "openstack-system"}, selector)
    expect("paramRef" not in binding["spec"], "no parameter (Kubernetes #133827)")
    mount_pods = {v["name"]: v["expression"] for v in r.get("ValidatingAdmissionPolicy", "csi-manila-mount-pods")["spec"]["variables"]}
    expect(mount_pods["hostPaths"] == f"['{kubelet}', '/dev/fuse']", mount_pods["hostPaths"])
    expect(mount_pods["templateImage"] == f"'{template['containers'][0]['image']}'", mount_pods["templateImage"])
    return [r]


# both protocols, as deploy/ serves them (the chart's default, as
# upstream's, is NFS alone)
BOTH = {"shareProtocols": [{"protocolSelector": "NFS", "fsGroupPolicy": "None"},
                           {"protocolSelector": "CEPHFS", "fsGroupPolicy": "File"}]}


def the_defaults_are_upstreams_where_users_would_notice():
    """NFS alone (CephFS needs FUSE or the kernel's client on every node),
    and no runtime configuration: the first export location is mounted,
    and the clients a share opens to come from its class."""
    r = Rendering(CHART, None)
    drivers = {d["metadata"]["name"] for d in r.objects("CSIDriver")}
    expect(drivers == {"nfs.manila.csi.openstack.org"}, drivers)
    expect({d["metadata"]["name"] for d in r.objects("DaemonSet")} == {"csi-manila-nfs-nodeplugin"},
           [d["metadata"]["name"] for d in r.objects("DaemonSet")])
    expect(not r.objects("ConfigMap"), [c["metadata"]["name"] for c in r.objects("ConfigMap")])
    for workload in (NFS_CONTROLLER, NFS_NODE):
        expect(not any(a.startswith("--runtime-config-file") for a in args_of(r, workload)), args_of(r, workload))
    return [r]


def another_driver_name_names_every_driver():
    r = Rendering(CHART, {"driverName": "shares.example.com", **BOTH})
    drivers = {d["metadata"]["name"] for d in r.objects("CSIDriver")}
    expect(drivers == {"nfs.shares.example.com", "cephfs.shares.example.com"}, drivers)
    expect("--drivername=cephfs.shares.example.com" in args_of(r, CEPHFS_NODE), "")
    policy = r.get("ValidatingAdmissionPolicy", "csi-manila-node-startup-taint")
    taints = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["startupTaints"]
    expect(taints == "['nfs.shares.example.com/agent-not-ready', 'cephfs.shares.example.com/agent-not-ready']", taints)
    return [r]


def values_that_cannot_work_are_refused_when_rendered():
    fails_to_render(CHART, {"shareProtocols": [{"protocolSelector": "GLUSTERFS"}]}, "NFS or CEPHFS")
    fails_to_render(CHART, {"shareProtocols": []}, "/shareProtocols")
    fails_to_render(CHART, {"driverName": "Manila CSI"}, "/driverName")
    fails_to_render(CHART, {"nodeplugin": {"kubeletDir": "kubelet"}}, "/nodeplugin/kubeletDir")
    # written into the mount pod policy's CEL between quotes
    fails_to_render(CHART, {"nodeplugin": {"kubeletDir": "/var/lib/kubelet' || true || '"}}, "/nodeplugin/kubeletDir")
    # the image too: a quote in it would end the CEL string and admit any pod
    fails_to_render(CHART, {"csimanila": {"image": {"repository": "x' || true || 'y"}}},
                    "/csimanila/image/repository")
    fails_to_render(CHART, {"csimanila": {"image": {"tag": "v1' || true || '"}}}, "/csimanila/image/tag")
    fails_to_render(CHART, {"volumeSnapshotClass": {"enabled": True}}, "snapshot CRDs")


def each_protocol_has_its_own_account_and_only_cephfs_makes_mount_pods():
    """The NFS node plugin's token can make no pod (only the CephFS
    plugin's may, for its mount pods); each plugin's token is mounted in
    its plugin container alone; without the startup-taint policy no node
    plugin may patch a Node."""
    r = Rendering(CHART, BOTH)
    nfs, cephfs = r.granted("csi-manila-nfs-node-sa"), r.granted("csi-manila-cephfs-node-sa")
    expect(("", "pods", "create") in cephfs, f"the CephFS plugin makes its mount pods: {cephfs}")
    expect(("", "pods", "create") not in nfs and ("", "pods", "delete") not in nfs,
           f"the NFS plugin's token could make or delete pods: {nfs}")
    for granted in (nfs, cephfs):
        expect(("", "nodes", "get") in granted and ("", "nodes", "patch") in granted, granted)
    for proto in ("nfs", "cephfs"):
        ds = r.get("DaemonSet", f"csi-manila-{proto}-nodeplugin")["spec"]["template"]["spec"]
        expect(ds["serviceAccountName"] == f"csi-manila-{proto}-node-sa", ds["serviceAccountName"])
        expect(ds.get("automountServiceAccountToken") is False, f"{proto}: the token in every container")
        with_token = [c["name"] for c in ds["containers"]
                      if any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
                             for m in c.get("volumeMounts", []))]
        expect(with_token == ["manila-csi-plugin"], f"{proto}: the token is in {with_token}")
    off = Rendering(CHART, {"nodeplugin": {"startupTaintPolicy": {"enabled": False}}, **BOTH})
    for sa in ("csi-manila-nfs-node-sa", "csi-manila-cephfs-node-sa"):
        expect(("", "nodes", "patch") not in off.granted(sa), f"{sa} patches Nodes with no policy confining it")
    return [r, off]


def values_in_the_types_upstreams_chart_takes_render_what_they_mean():
    """Numbers as strings and a numeric cluster id, as upstream's chart
    (no schema) takes them: each means what it says."""
    r = Rendering(CHART, {
        "logVerbosityLevel": "5",
        "csimanila": {"clusterID": 12345678, "image": {"tag": 2}},
        "controllerplugin": {"replicas": "3"},
        **BOTH,
    })
    for workload in (NFS_CONTROLLER, CEPHFS_CONTROLLER):
        plugin = r.container(*workload, "manila-csi-plugin")
        env = {e["name"]: e.get("value") for e in plugin["env"]}
        expect(env["CLUSTER_NAME"] == "12345678", f"the cluster id's digits: {env}")
        expect(r.get(*workload)["spec"]["replicas"] == 3, "three replicas, a number")
        expect("--log-level=debug" in plugin["args"], plugin["args"])
        expect(plugin["image"].endswith(":2"), plugin["image"])
    fails_to_render(CHART, {"controllerplugin": {"replicas": "three"}}, "/controllerplugin")
    return [r]


TESTS = [(f"{CHART}/{f.__name__}", f) for f in (
    the_default_rendering_is_deploy_manila_base,
    the_defaults_are_upstreams_where_users_would_notice,
    upstreams_values_file_installs_unchanged,
    an_operators_values_take_effect,
    a_custom_kubelet_directory_is_used_everywhere,
    another_driver_name_names_every_driver,
    values_that_cannot_work_are_refused_when_rendered,
    each_protocol_has_its_own_account_and_only_cephfs_makes_mount_pods,
    values_in_the_types_upstreams_chart_takes_render_what_they_mean,
)]

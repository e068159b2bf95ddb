"""The Kubernetes of tests/cluster/cluster.py, by role: [config] settings,
nodes and binaries, [pki], [host] changes to this machine,
[control_plane], [images], [nodes] (containerd, kubelet, servers),
[suite] (deploy/ applied), [processes], [teardown], [faults] (restarts,
a node that dies)."""

"""Shared file systems: a single-node Ceph (mon, mgr, OSD on a sparse file,
MDS, CephFS, cephx), NFS-Ganesha on that CephFS, and Manila with its three
backends."""

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from .config import (
    CEPH_DEBIAN_PACKAGES,
    CEPH_PORT_RANGE,
    CloudError,
    DEBUG_LINE,
    HERE,
    HOST,
    PORTS,
    STATE,
    VENV,
    gunicorn,
    http,
    log,
    port_open,
    process_alive,
    run,
    start,
    stop_all,
    venv_bin,
    wait_until,
    write_wsgi,
)
from .identity import Api, Keystone, keystone_authtoken, reported_since_start
from .infra import db_url, ensure_debian_packages, rabbit_url


CEPH = STATE / "ceph"


CEPH_CONF = CEPH / "ceph.conf"


CEPH_DAEMONS = ["ceph-mds", "ceph-osd", "ceph-mgr", "ceph-mon"]


def ceph(*args, timeout=60):
    """The admin CLI against our cluster (client.admin's keyring comes from
    [client] keyring in our ceph.conf)."""
    return run(["ceph", "--conf", str(CEPH_CONF), "--connect-timeout", "10", *args], timeout=timeout)


def ceph_json(*args):
    return json.loads(ceph(*args, "--format", "json"))


def write_ceph_conf(fsid):
    lo, hi = CEPH_PORT_RANGE
    CEPH_CONF.write_text(f"""[global]
fsid = {fsid}
mon_host = [v2:{HOST}:{PORTS['ceph-mon-v2']},v1:{HOST}:{PORTS['ceph-mon-v1']}]
public_addr = {HOST}
cluster_addr = {HOST}
ms_bind_ipv6 = false
ms_bind_port_min = {lo}
ms_bind_port_max = {hi}
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = {CEPH}/run
admin_socket = {CEPH}/run/$cluster-$name.asok
pid_file = {CEPH}/run/$cluster-$name.pid
crash_dir = {CEPH}/crash
log_file = {STATE}/logs/ceph-$name.log
mon_cluster_log_file = {STATE}/logs/ceph-cluster.log
mon_data = {CEPH}/mon/$cluster-$id
mgr_data = {CEPH}/mgr/$cluster-$id
osd_data = {CEPH}/osd/$cluster-$id
mds_data = {CEPH}/mds/$cluster-$id
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_warn_on_pool_no_redundancy = false
auth_allow_insecure_global_id_reclaim = false
mon_data_avail_warn = 2
mon_data_avail_crit = 1
paxos_propose_interval = 0.1
mgr_stats_period = 1
[osd]
# the sparse block file costs ~40 MB whatever its size; Manila's scheduler
# counts a pool's free space down by every share it places and learns the
# truth only from the next capability report (every 60 s whatever
# periodic_interval says), so a 10 GiB pool refuses the tenth share of a
# minute
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = 100G
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
bdev_aio_poll_ms = 10
osd_memory_target = 939524096
[mds]
# clones wait for MDS ticks: 1 s instead of 5 s
mds_tick_interval = 1
[client]
keyring = {CEPH}/keyring/$cluster.$name.keyring
log_file = {STATE}/logs/ceph-$name.log
admin_socket = {CEPH}/run/$cluster-$name.$pid.asok
""")


def ceph_keyring(path, name, caps):
    args = ["ceph-authtool", "--create-keyring", str(path), "--gen-key", "-n", name]
    for kind, cap in caps:
        args += ["--cap", kind, cap]
    run(args)


def ceph_healthy():
    st = ceph_json("status")
    if st.get("health", {}).get("status") != "HEALTH_OK":
        return False
    by_state = st.get("pgmap", {}).get("pgs_by_state", [])
    # HEALTH_OK comes before PG stats exist (gotcha 2)
    return bool(by_state) and all(p.get("state_name") == "active+clean" for p in by_state)


def setup_ceph():
    """A real single-node Ceph: 1 mon, 1 mgr, 1 bluestore OSD on a sparse
    file, 1 MDS, CephFS `cephfs`, cephx on; every path under STATE/ceph,
    every daemon in the foreground under our PID records."""
    ensure_debian_packages(CEPH_DEBIAN_PACKAGES, recommends=False)
    fresh = not (CEPH / "mon" / "ceph-a" / "store.db").exists()
    if fresh:
        if CEPH.exists():
            shutil.rmtree(CEPH)
        for sub in ("keyring", "run", "crash", "mon", "mgr/ceph-x", "osd/ceph-0", "mds/ceph-a"):
            (CEPH / sub).mkdir(parents=True, exist_ok=True)
        fsid = run(["uuidgen"]).strip() if shutil.which("uuidgen") else __import__("uuid").uuid4().hex
        if len(fsid) == 32:
            fsid = f"{fsid[:8]}-{fsid[8:12]}-{fsid[12:16]}-{fsid[16:20]}-{fsid[20:]}"
        write_ceph_conf(fsid)
        kr = CEPH / "keyring"
        ceph_keyring(kr / "mon.keyring", "mon.", [("mon", "allow *")])
        ceph_keyring(kr / "ceph.client.admin.keyring", "client.admin",
                     [("mon", "allow *"), ("osd", "allow *"), ("mds", "allow *"), ("mgr", "allow *")])
        ceph_keyring(CEPH / "mgr/ceph-x/keyring", "mgr.x",
                     [("mon", "allow profile mgr"), ("osd", "allow *"), ("mds", "allow *")])
        ceph_keyring(CEPH / "mds/ceph-a/keyring", "mds.a",
                     [("mon", "allow profile mds"), ("osd", "allow *"), ("mds", "allow"), ("mgr", "allow profile mds")])
        for k in (kr / "ceph.client.admin.keyring", CEPH / "mgr/ceph-x/keyring", CEPH / "mds/ceph-a/keyring"):
            run(["ceph-authtool", str(kr / "mon.keyring"), "--import-keyring", str(k)])
        run(["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
             f"[v2:{HOST}:{PORTS['ceph-mon-v2']},v1:{HOST}:{PORTS['ceph-mon-v1']}]",
             "--set-min-mon-release", "pacific", "--enable-all-features", str(CEPH / "monmap")])
        run(["ceph-mon", "--conf", str(CEPH_CONF), "--mkfs", "-i", "a", "--monmap", str(CEPH / "monmap"),
             "--keyring", str(kr / "mon.keyring")])
    else:
        # the paths in ceph.conf follow STATE; keep the cluster's fsid
        fsid = next(line.split("=", 1)[1].strip() for line in CEPH_CONF.read_text().splitlines()
                    if line.startswith("fsid"))
        write_ceph_conf(fsid)
    conf = ["--conf", str(CEPH_CONF)]
    start("ceph-mon", ["ceph-mon", "-f", "-i", "a", *conf])
    wait_until("ceph-mon", lambda: ceph("mon", "stat", timeout=15) and True, 60)
    start("ceph-mgr", ["ceph-mgr", "-f", "-i", "x", *conf])
    if fresh:
        osd_uuid = str(__import__("uuid").uuid4())
        secret = run(["ceph-authtool", "--gen-print-key"]).strip()
        res = subprocess.run(["ceph", *conf, "osd", "new", osd_uuid, "-i", "-"],
                             input=json.dumps({"cephx_secret": secret}), capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise CloudError(f"ceph osd new failed: {res.stderr}")
        osd_id = res.stdout.strip()
        (CEPH / f"osd/ceph-{osd_id}/keyring").write_text(f"[osd.{osd_id}]\n\tkey = {secret}\n")
        run(["ceph-osd", *conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid])
    start("ceph-osd", ["ceph-osd", "-f", "-i", "0", *conf])
    start("ceph-mds", ["ceph-mds", "-f", "-i", "a", *conf])
    wait_until("ceph-osd", lambda: ceph_json("osd", "stat").get("num_up_osds") == 1, 120)
    wait_until("ceph-mgr", lambda: ceph_json("mgr", "stat").get("available") is True, 120)
    if fresh:
        wait_until("ceph-mgr", lambda: ceph("fs", "volume", "ls", timeout=20) is not None, 120)
        ceph("fs", "volume", "create", "cephfs")
        # a client killed without unmounting keeps its capabilities until
        # its session times out (60 s by default, 30 s at least): tests that kill
        # ceph-fuse wait that long for the files it held
        ceph("fs", "set", "cephfs", "session_timeout", "30")
        # Manila's CephFS driver talks to the mgr's volumes module
        (CEPH / "keyring" / "ceph.client.manila.keyring").write_text(
            ceph("auth", "get-or-create", "client.manila", "mon", "allow r", "mgr", "allow rw"))
    wait_until("ceph-mds", mds_active, 120)
    wait_until("ceph", ceph_healthy, 180, STATE / "logs" / "ceph-cluster.log", process="ceph-mon")


def mds_active():
    """The MDS is active; one that waits in reconnect or clientreplay for
    sessions Ganesha left to be reclaimed (its Ceph FSAL keeps them over
    its own restart) while no Ganesha runs, gets them evicted: they would
    hold it there for good."""
    states = [m.get("state") for m in ceph_json("fs", "status").get("mdsmap", [])]
    if "active" in states:
        return True
    if any(s in ("reconnect", "clientreplay") for s in states) and not process_alive("ganesha"):
        evict_ganesha_sessions()
    return False


def evict_ganesha_sessions():
    """Evicts the MDS sessions of Ganesha's per-share cephx users."""
    sessions = json.loads(ceph("tell", "mds.a", "session", "ls", "--format", "json", timeout=30))
    for session in sessions:
        entity = session.get("client_metadata", {}).get("entity_id", "")
        if entity.startswith("ganesha-"):
            ceph("tell", "mds.a", "client", "evict", f"id={session['id']}", timeout=30)
            log(f"evicted the MDS session of client.{entity}")


def stop_ceph():
    """Clients first (gotcha 6: a mount of a dead cluster hangs), then the
    daemons; the MDS needs ~5 s for a clean exit, a throw-away cluster
    does not need it."""
    kill_ceph_fuse_clients()
    stop_all(CEPH_DAEMONS, grace=1)


def kill_ceph_fuse_clients():
    """Every ceph-fuse mount on the machine goes: only tests mount here."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.startswith("fuse.ceph-fuse "):
            mount_point = left.split(" ")[4].encode().decode("unicode_escape")
            subprocess.run(["umount", "-l", mount_point], capture_output=True)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() == "ceph-fuse":
                os.kill(int(d.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def manila_ceph_modules():
    """Manila's CephFS driver imports Debian's `rados` and `ceph_argparse`:
    only those (and `cephfs`) are exposed to the venv, through a directory
    of links named in a .pth file, kept beside the venv so that a purge of
    STATE cannot leave a .pth naming a missing directory (gotcha 20)."""
    d = VENV / "ceph-python"
    d.mkdir(parents=True, exist_ok=True)
    dist = Path("/usr/lib/python3/dist-packages")
    for name in ("rados.cpython-311-x86_64-linux-gnu.so", "cephfs.cpython-311-x86_64-linux-gnu.so",
                 "ceph_argparse.py"):
        link = d / name
        if not link.exists():
            link.symlink_to(dist / name)
    site = next((VENV / "lib").glob("python3*/site-packages"))
    (site / "test-cloud-ceph.pth").write_text(str(d) + "\n")


GANESHA = STATE / "ganesha"


GANESHA_DEBIAN_PACKAGES = ["nfs-ganesha", "nfs-ganesha-ceph", "dbus", "sqlite3", "libnfs-utils"]


SYSTEM_BUS = Path("/run/dbus/system_bus_socket")


# Manila's legacy NFS helper of its CephFS driver gives every share its own
# cephx user and EXPORT block; the auth id it manages them with is its own
MANILA_NFS_AUTH_ID = "manila-nfs"


def system_bus_answers():
    import socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(SYSTEM_BUS))
        return True
    except OSError:
        return False


def start_system_bus():
    """Manila applies exports through Ganesha's D-Bus interface on the system
    bus; with no systemd here nobody else starts one. One that answers
    already (the machine's own) is used and left alone."""
    if system_bus_answers():
        return
    run(["dbus-uuidgen", "--ensure"])
    Path("/run/dbus").mkdir(parents=True, exist_ok=True)
    # a socket file left by a killed daemon makes the new one fail to bind
    SYSTEM_BUS.unlink(missing_ok=True)
    start("dbus", ["dbus-daemon", "--system", "--nofork", "--nopidfile"])
    wait_until("dbus", system_bus_answers, 30)


def setup_ganesha():
    """NFS-Ganesha exporting CephFS subvolumes through its Ceph FSAL, with
    exports Manila writes under STATE/ganesha/export.d (gotchas in issue 18:
    Graceless, no NLM, NFSv4.0 left on for libnfs, an INDEX file before the
    first start). Bound to 127.0.0.1: a test that needs a second client
    address reaches it from 127.0.0.2 through its own relay."""
    ensure_debian_packages(GANESHA_DEBIAN_PACKAGES, recommends=False)
    start_system_bus()
    for sub in ("export.d", "recovery"):
        (GANESHA / sub).mkdir(parents=True, exist_ok=True)
    index = GANESHA / "export.d" / "INDEX.conf"
    if not index.exists():
        index.write_text("")
    conf = GANESHA / "ganesha.conf"
    conf.write_text(f"""NFS_CORE_PARAM {{
    Bind_addr = {HOST};
    NFS_Port = {PORTS['nfs']};
    Protocols = 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
NFSv4 {{
    # without it every write waits out a ~90 s grace period after a start
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = {GANESHA}/recovery;
}}
NFS_KRB5 {{
    Active_krb5 = false;
}}
CEPH {{
    Ceph_Conf = {CEPH_CONF};
}}
%include {index}
""")
    # the Ceph FSAL is loaded by the first export Manila adds over D-Bus,
    # after the CEPH block was read: libcephfs then finds its conf only
    # through CEPH_CONF
    start("ganesha", ["ganesha.nfsd", "-F", "-f", conf, "-L", STATE / "logs" / "ganesha.log",
                      "-N", "NIV_EVENT", "-p", GANESHA / "ganesha.pid"],
          env={"CEPH_CONF": str(CEPH_CONF)})
    wait_until("ganesha", lambda: port_open(PORTS["nfs"]), 60, STATE / "logs" / "ganesha.log")


def stop_ganesha():
    """Before Ceph: Ganesha's FSAL is a Ceph client (gotcha 6). It leaves
    its MDS sessions open on purpose (to reclaim them when it restarts);
    with the cluster stopping too they would hold the next MDS start in
    clientreplay, so they are evicted while the MDS still answers."""
    stop_all(["ganesha"], grace=10)
    if process_alive("ceph-mds"):
        try:
            evict_ganesha_sessions()
        except (CloudError, subprocess.TimeoutExpired, ValueError) as e:
            log(f"Ganesha's MDS sessions not evicted ({e}); the next start evicts them")


def cephfs_backend(section, backend_name, helper, auth_id):
    """A manila.conf section of the CephFS driver on our Ceph."""
    return f"""[{section}]
share_driver = manila.share.drivers.cephfs.driver.CephFSDriver
share_backend_name = {backend_name}
driver_handles_share_servers = False
cephfs_protocol_helper_type = {helper}
cephfs_conf_path = {CEPH_CONF}
cephfs_auth_id = {auth_id}
cephfs_cluster_name = ceph
cephfs_filesystem_name = cephfs"""


def manila_backends(with_ceph, with_ganesha):
    """The manila.conf sections of the backends enabled."""
    return ["dummy"] + (["cephfsnative"] if with_ceph else []) + (["cephfsnfs"] if with_ganesha else [])


def setup_manila(ks, with_ceph, with_ganesha):
    d = STATE / "manila"
    (d / "locks").mkdir(parents=True, exist_ok=True)
    ks.service_user("manila")
    url = f"http://{HOST}:{PORTS['manila']}/v2/$(project_id)s"
    ks.service("sharev2", "manilav2", url)
    ks.service("shared-file-system", "manila", url)
    shutil.copy(VENV / "etc" / "manila" / "api-paste.ini", d / "api-paste.ini")
    conf = d / "manila.conf"
    backends = manila_backends(with_ceph, with_ganesha)
    conf.write_text(f"""[DEFAULT]
{DEBUG_LINE}transport_url = {rabbit_url()}
rpc_response_timeout = 15
auth_strategy = keystone
api_paste_config = {d}/api-paste.ini
enabled_share_backends = {",".join(backends)}
enabled_share_protocols = NFS,CIFS,CEPHFS
default_share_type = default
default_share_group_type = default
storage_availability_zone = nova
state_path = {d}
log_file = {STATE}/logs/manila-app.log
periodic_interval = 5
report_interval = 5
periodic_fuzzy_delay = 0
my_ip = {HOST}
host = test-manila
[database]
connection = {db_url("manila")}
[oslo_concurrency]
lock_path = {d}/locks
[dummy]
share_driver = test_cloud_manila.LoopbackDummyDriver
share_backend_name = dummy
driver_handles_share_servers = False
dummy_driver_default_driver_method_delay = 0.1
dummy_driver_driver_methods_delays = ensure_share:0.1,create_share:0.3,get_pool:0.05,do_setup:0.01,_get_pools_info:0.01,_update_share_stats:0.05
{cephfs_backend("cephfsnative", "CEPHFSNATIVE", "CEPHFS", "manila")}
# the legacy NFSProtocolHelper (deprecated in Manila 2025.1, present in the
# pinned 23.x): it writes EXPORT blocks with one CLIENT block per access
# level and no export-wide access, so a client no rule names is refused; the
# mgr-nfs helper needs an orchestrator and Ceph 16.2's mgr exports RO to
# every client no rule names
{cephfs_backend("cephfsnfs", "CEPHFSNFS", "NFS", MANILA_NFS_AUTH_ID)}
cephfs_ganesha_server_is_remote = False
cephfs_ganesha_server_ip = {HOST}
ganesha_config_dir = {GANESHA}
ganesha_db_path = {d}/ganesha-exports.db
ganesha_export_template_dir = {d}/ganesha-export-templ.d
{keystone_authtoken("manila")}
""")
    if with_ceph:
        manila_ceph_modules()
    if with_ganesha:
        keyring = CEPH / "keyring" / f"ceph.client.{MANILA_NFS_AUTH_ID}.keyring"
        if not keyring.exists():
            keyring.write_text(ceph("auth", "get-or-create", f"client.{MANILA_NFS_AUTH_ID}",
                                    "mon", "allow r", "mgr", "allow rw"))
    if not (d / ".synced").exists():
        run([venv_bin("manila-manage"), "--config-file", str(conf), "db", "sync"])
        (d / ".synced").write_text("")
    # manila's own API server needs eventlet (gotcha 1): serve the WSGI app
    write_wsgi("manila_app", f"import sys\nsys.argv = [sys.argv[0], '--config-file', {str(conf)!r}]\n"
                             "from manila.wsgi.api import application\n")
    gunicorn("manila-api", "manila_app", PORTS["manila"], {}, threads=4)
    drivers = {"PYTHONPATH": str(HERE / "drivers")}
    start("manila-scheduler", [venv_bin("manila-scheduler"), "--config-file", str(conf)], env=drivers)
    # as root (we are): the NFS helper's RootExecutor runs mv, sqlite3 and
    # dbus-send through rootwrap unless the process is root already
    start("manila-share", [venv_bin("manila-share"), "--config-file", str(conf)], env=drivers)
    wait_until("manila-api", lambda: http("GET", f"http://{HOST}:{PORTS['manila']}/")[0] in (200, 300), 120,
               STATE / "logs" / "manila-api.log")


def configure_file(with_ceph, with_ganesha):
    """A default share type (DHSS=False, snapshots) and a share service that
    reports in before tests start creating shares."""
    api = Api()
    manila = f"http://{HOST}:{PORTS['manila']}/v2/{api.project_id}"
    mv = {"X-OpenStack-Manila-API-Version": "2.65"}
    wait_until("manila-share", lambda: reported_since_start(
        "manila-share", api.call("GET", manila + "/services?binary=manila-share", headers=mv)["services"]),
        120, STATE / "logs" / "manila-app.log")
    for project in (api.project_id, Keystone().find("projects", "demo")):
        api.call("PUT", f"{manila}/quota-sets/{project}", {"quota_set": {
            "shares": -1, "gigabytes": -1, "snapshots": -1, "snapshot_gigabytes": -1,
            "share_groups": -1, "share_group_snapshots": -1}}, headers=mv)
    types = {t["name"]: t for t in api.call("GET", manila + "/types", headers=mv)["share_types"]}
    # `default` → the dummy backend (NFS), `cephfs` → the real CephFS one
    wanted = {"default": "dummy", "no-snapshots": "dummy"}
    if with_ceph:
        wanted["cephfs"] = "CEPHFSNATIVE"
    if with_ganesha:
        wanted["cephfs-nfs"] = "CEPHFSNFS"
    for name, backend in wanted.items():
        snapshots = "False" if name == "no-snapshots" else "True"
        specs = {"driver_handles_share_servers": "False", "snapshot_support": snapshots,
                 "create_share_from_snapshot_support": snapshots, "share_backend_name": backend}
        if name not in types:
            api.call("POST", manila + "/types", {"share_type": {
                "name": name, "share_type_access:is_public": True, "extra_specs": specs}}, headers=mv)
        elif types[name].get("extra_specs", {}).get("share_backend_name") != backend:
            api.call("POST", f"{manila}/types/{types[name]['id']}/extra_specs", {"extra_specs": specs}, headers=mv)
    # share groups: `default` (manila.conf's default_share_group_type)
    # holds every share type above, so a group may hold shares of any
    types = {t["name"]: t for t in api.call("GET", manila + "/types", headers=mv)["share_types"]}
    group_types = {t["name"]: t for t in api.call("GET", manila + "/share-group-types",
                                                   headers=mv)["share_group_types"]}
    type_ids = sorted(types[n]["id"] for n in wanted)
    have = sorted(group_types["default"]["share_types"]) if "default" in group_types else None
    if have is not None and have != type_ids:
        api.call("DELETE", f"{manila}/share-group-types/{group_types['default']['id']}", headers=mv)
        have = None
    if have is None:
        api.call("POST", manila + "/share-group-types", {"share_group_type": {
            "name": "default", "share_types": type_ids, "is_public": True}}, headers=mv)
    # the scheduler needs each backend's first capability report
    backends = manila_backends(with_ceph, with_ganesha)

    def pools():
        names = [p["name"] for p in api.call("GET", manila + "/scheduler-stats/pools", headers=mv)["pools"]]
        return all(any(f"@{b}" in n for n in names) for b in backends)
    wait_until("the manila pools", pools, 120, STATE / "logs" / "manila-app.log")

"""Block storage: Placement, Cinder (two zones, a fake driver keeping volume
data in image files, cinder-backup), Nova (fake driver, a compute host per
zone, servers for the cluster's nodes) and the hypervisor agent that
attaches volumes as loop devices."""

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .config import (
    COMPUTE_HOSTS,
    CloudError,
    DEBUG_LINE,
    HERE,
    HOST,
    HYPERVISOR_IMAGES,
    MAX_DISK_DEVICES,
    PORTS,
    REGION,
    REPO,
    SERVICE_PASSWORD,
    STATE,
    VENV,
    ZONES,
    gunicorn,
    http,
    log,
    process_alive,
    run,
    start,
    stop,
    venv_bin,
    wait_until,
    write_wsgi,
)
from .identity import Api, Keystone, keystone_authtoken, keystone_url, member_api, reported_since_start
from .infra import db_url, rabbit_url


def setup_placement(ks):
    d = STATE / "placement"
    d.mkdir(parents=True, exist_ok=True)
    ks.service_user("placement")
    url = f"http://{HOST}:{PORTS['placement']}"
    ks.service("placement", "placement", url)
    (d / "placement.conf").write_text(f"""[DEFAULT]
log_file = {STATE}/logs/placement-app.log
[placement_database]
connection = {db_url("placement")}
[api]
auth_strategy = keystone
{keystone_authtoken("placement")}""")
    if not (d / ".synced").exists():
        run([venv_bin("placement-manage"), "--config-file", str(d / "placement.conf"), "db", "sync"])
        (d / ".synced").write_text("")
    write_wsgi("placement_app", "import sys\nsys.argv = sys.argv[:1]\nfrom placement.wsgi.api import application\n")
    gunicorn("placement", "placement_app", PORTS["placement"], {"OS_PLACEMENT_CONFIG_DIR": str(d)}, threads=4)
    wait_until("placement", lambda: http("GET", url + "/")[0] == 200, 90, STATE / "logs" / "placement.log")


def service_auth_section(section, user):
    return f"""[{section}]
auth_type = password
auth_url = {keystone_url()}
username = {user}
password = {SERVICE_PASSWORD}
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = {REGION}
"""


def setup_cinder(ks):
    d = STATE / "cinder"
    (d / "locks").mkdir(parents=True, exist_ok=True)
    ks.service_user("cinder")
    url = f"http://{HOST}:{PORTS['cinder']}/v3/$(project_id)s"
    ks.service("block-storage", "cinderv3", url)
    ks.service("volumev3", "cinderv3-legacy", url)
    shutil.copy(VENV / "etc" / "cinder" / "api-paste.ini", d / "api-paste.ini")
    shutil.copy(VENV / "etc" / "cinder" / "resource_filters.json", d / "resource_filters.json")
    conf = d / "cinder.conf"
    # os-brick (cinder-backup attaching volumes) runs its privileged helper
    # directly: everything here already runs as root, and there is no sudo
    conf.write_text(f"""[DEFAULT]
transport_url = {rabbit_url()}
auth_strategy = keystone
api_paste_config = {d}/api-paste.ini
resource_query_filters_file = {d}/resource_filters.json
enabled_backends = fake,fake-{ZONES[1]}
state_path = {d}
log_file = {STATE}/logs/cinder-app.log
storage_availability_zone = {ZONES[0]}
default_availability_zone = {ZONES[0]}
# the affinity filters a cloud enables for scheduler hints (the Cinder
# driver's --pvc-annotations): Cinder's default list ignores the hints
scheduler_default_filters = AvailabilityZoneFilter,CapacityFilter,CapabilitiesFilter,SameBackendFilter,DifferentBackendFilter
periodic_interval = 5
report_interval = 5
periodic_fuzzy_delay = 0
glance_api_servers = http://{HOST}:9
my_ip = {HOST}
host = test-cinder
backup_driver = cinder.backup.drivers.posix.PosixBackupDriver
backup_posix_path = {d}/backups
backup_compression_algorithm = none
[database]
connection = {db_url("cinder")}
[oslo_concurrency]
lock_path = {d}/locks
[privsep_osbrick]
helper_command = {venv_bin("privsep-helper")} --config-file {conf}
[privsep]
helper_command = {venv_bin("privsep-helper")} --config-file {conf}
[fake]
volume_driver = test_cloud_cinder.MultiattachFakeDriver
volume_backend_name = fake
[fake-{ZONES[1]}]
volume_driver = test_cloud_cinder.MultiattachFakeDriver
volume_backend_name = fake-{ZONES[1]}
backend_availability_zone = {ZONES[1]}
{keystone_authtoken("cinder")}
{service_auth_section("nova", "cinder")}
""")
    if not (d / ".synced").exists():
        run([venv_bin("cinder-manage"), "--config-file", str(conf), "db", "sync"])
        (d / ".synced").write_text("")
    write_wsgi("cinder_app", f"import sys\nsys.argv = [sys.argv[0], '--config-file', {str(conf)!r}]\n"
                             "from cinder.wsgi.api import application\n")
    gunicorn("cinder-api", "cinder_app", PORTS["cinder"], {}, threads=4)
    start("cinder-scheduler", [venv_bin("cinder-scheduler"), "--config-file", str(conf)])
    # the fake driver keeps volume data where the hypervisor agent attaches
    # it from, and cinder-backup reads and writes it there
    images = {"PYTHONPATH": str(HERE / "drivers"), "TEST_CLOUD_IMAGE_DIR": str(HYPERVISOR_IMAGES)}
    (d / "backups").mkdir(exist_ok=True)
    start("cinder-volume", [venv_bin("cinder-volume"), "--config-file", str(conf)], env=images)
    start("cinder-backup", [venv_bin("cinder-backup"), "--config-file", str(conf)], env=images)
    wait_until("cinder-api", lambda: http("GET", f"http://{HOST}:{PORTS['cinder']}/")[0] in (200, 300), 120,
               STATE / "logs" / "cinder-api.log")


def setup_nova(ks):
    d = STATE / "nova"
    (d / "locks").mkdir(parents=True, exist_ok=True)
    (d / "instances").mkdir(parents=True, exist_ok=True)
    ks.service_user("nova")
    ks.service("compute", "nova", f"http://{HOST}:{PORTS['nova']}/v2.1")
    shutil.copy(VENV / "etc" / "nova" / "api-paste.ini", d / "api-paste.ini")
    common = f"""[DEFAULT]
{DEBUG_LINE}transport_url = {rabbit_url()}
rpc_response_timeout = 15
compute_driver = fake.FakeDriverWithoutFakeNodes
state_path = %(state)s
instances_path = {d}/instances
my_ip = {HOST}
host = %(host)s
periodic_fuzzy_delay = 0
report_interval = 5
log_file = %(log)s
[api]
auth_strategy = keystone
[compute]
max_disk_devices_to_attach = {MAX_DISK_DEVICES}
[oslo_concurrency]
lock_path = {d}/locks
[glance]
api_servers = http://{HOST}:9
[scheduler]
discover_hosts_in_cells_interval = -1
[conductor]
workers = 1
[cinder]
cross_az_attach = False
os_region_name = {REGION}
catalog_info = volumev3::publicURL
auth_type = password
auth_url = {keystone_url()}
username = nova
password = {SERVICE_PASSWORD}
project_name = service
user_domain_name = Default
project_domain_name = Default
[neutron]
url = http://{HOST}:{PORTS['neutron']}
auth_type = password
auth_url = {keystone_url()}
username = nova
password = {SERVICE_PASSWORD}
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = {REGION}
{service_auth_section("placement", "nova")}
{service_auth_section("service_user", "nova")}send_service_user_token = true
{keystone_authtoken("nova")}
"""
    # nova-compute must not see database URLs (gotcha 6): they live in a
    # file only the other services read
    def conf(log_name, state=d, host=COMPUTE_HOSTS[ZONES[0]]):
        return (common.replace("%(log)s", f"{STATE}/logs/{log_name}").replace("%(state)s", str(state))
                .replace("%(host)s", host))

    (d / "nova.conf").write_text(conf("nova-app.log"))
    (d / "nova-db.conf").write_text(f"[api_database]\nconnection = {db_url('nova_api')}\n"
                                    f"[database]\nconnection = {db_url('nova')}\n")
    (d / "nova-compute.conf").write_text(conf("nova-compute-app.log"))
    # the second zone's compute host: its own identity and state, its
    # configuration beside them (Nova reads compute_id from the config
    # file's directory too, and refuses two that differ)
    (d / ZONES[1]).mkdir(exist_ok=True)
    (d / ZONES[1] / "nova-compute.conf").write_text(
        conf(f"nova-compute-{ZONES[1]}-app.log", d / ZONES[1], COMPUTE_HOSTS[ZONES[1]]))
    confs = ["--config-file", str(d / "nova.conf"), "--config-file", str(d / "nova-db.conf")]
    if not (d / ".synced").exists():
        manage = [venv_bin("nova-manage"), *confs]
        run(manage + ["api_db", "sync"])
        run(manage + ["cell_v2", "map_cell0", "--database_connection", db_url("nova_cell0")])
        cells = run(manage + ["cell_v2", "list_cells"])
        if "cell1" not in cells:
            run(manage + ["cell_v2", "create_cell", "--name", "cell1", "--transport-url", rabbit_url(),
                          "--database_connection", db_url("nova")])
        run(manage + ["db", "sync"])
        (d / ".synced").write_text("")
    start("nova-conductor", [venv_bin("nova-conductor"), *confs])
    start("nova-scheduler", [venv_bin("nova-scheduler"), *confs])
    # the API reads its paste file from the first of OS_NOVA_CONFIG_FILES (gotcha 5)
    write_wsgi("nova_app", "import sys\nsys.argv = sys.argv[:1]\nfrom nova.wsgi.osapi_compute import application\n")
    gunicorn("nova-api", "nova_app", PORTS["nova"],
             {"OS_NOVA_CONFIG_DIR": str(d), "OS_NOVA_CONFIG_FILES": "api-paste.ini;nova.conf;nova-db.conf"}, threads=4)
    wait_until("nova-api", lambda: http("GET", f"http://{HOST}:{PORTS['nova']}/")[0] == 200, 120,
               STATE / "logs" / "nova-api.log")
    # the fake virt driver never writes its node identity, and a restarted
    # nova-compute without one refuses to start: provision it up front
    import uuid
    for state in (d, d / ZONES[1]):
        compute_id = state / "compute_id"
        if not compute_id.exists():
            compute_id.write_text(str(uuid.uuid4()))
    time.sleep(2)  # let the conductor register before compute starts (gotcha 7)
    start("nova-compute", [venv_bin("nova-compute"), "--config-file", str(d / "nova-compute.conf")])
    start(f"nova-compute-{ZONES[1]}",
          [venv_bin("nova-compute"), "--config-file", str(d / ZONES[1] / "nova-compute.conf")])
    # tests size their attach limits from it
    (STATE / "max-disk-devices").write_text(f"{MAX_DISK_DEVICES}\n")


def configure_block():
    """The fixtures block-storage tests need: a multiattach volume type, a
    generic group type, a flavor, and a server (booted from a bootable volume, no network) that
    volumes can be attached to."""
    api = Api()
    cinder = f"http://{HOST}:{PORTS['cinder']}/v3/{api.project_id}"
    nova = f"http://{HOST}:{PORTS['nova']}/v2.1"
    wait_until("cinder-volume service of every zone", lambda: {
        s["zone"] for s in api.call("GET", cinder + "/os-services")["services"]
        if s["binary"] == "cinder-volume" and s["state"] == "up"} >= set(ZONES), 120,
        STATE / "logs" / "cinder-volume.log")
    # unlimited quotas for the test projects, as in the emulator: the
    # defaults (10 volumes, 1000 GiB) would make parallel tests flaky
    for project in (api.project_id, Keystone().find("projects", "demo")):
        api.call("PUT", f"{cinder}/os-quota-sets/{project}",
                 {"quota_set": {"volumes": -1, "gigabytes": -1, "snapshots": -1}})
    types = api.call("GET", cinder + "/types")["volume_types"]
    if not any(t["name"] == "multiattach" for t in types):
        api.call("POST", cinder + "/types", {"volume_type": {"name": "multiattach",
                                                             "extra_specs": {"multiattach": "<is> True"}}})
    # a generic group type, for group snapshots (Cinder ships none usable:
    # default_cgsnapshot_type is reserved for migrated consistency groups)
    groups_mv = {"OpenStack-API-Version": "volume 3.11"}
    group_types = api.call("GET", cinder + "/group_types", headers=groups_mv)["group_types"]
    if not any(t["name"] == "default" for t in group_types):
        api.call("POST", cinder + "/group_types", {"group_type": {"name": "default", "is_public": True}},
                 headers=groups_mv)
    flavors = api.call("GET", nova + "/flavors")["flavors"]
    if not any(f["name"] == "m1.test" for f in flavors):
        api.call("POST", nova + "/flavors", {"flavor": {"name": "m1.test", "ram": 64, "vcpus": 1, "disk": 0,
                                                        "id": "test"}})
    server_file = STATE / "test-server-id"
    # what a guest's metadata service says of the test server's zone
    (STATE / "test-server-zone").write_text(ZONES[0] + "\n")
    # "up" must rest on a heartbeat from each nova-compute, not on one left
    # from before a restart: Nova refuses detaches while it thinks the
    # compute service is down
    for zone in ZONES:
        process = compute_process(zone)
        wait_until(process, lambda: reported_since_start(process, [
            s for s in api.call("GET", nova + "/os-services?binary=nova-compute")["services"]
            if s["host"] == COMPUTE_HOSTS[zone]]), 120, STATE / "logs" / f"{process}-app.log")
    # the test server is the member's (the drivers run as the member, and
    # attach to it); one left by an earlier cloud in the admin project is
    # replaced
    member = member_api()
    member_cinder = f"http://{HOST}:{PORTS['cinder']}/v3/{member.project_id}"
    admin_file = STATE / "admin-server-id"
    if server_file.exists():
        sid = server_file.read_text().strip()
        if owned_by(api, nova, sid, member.project_id):
            ensure_admin_server(api, cinder, nova, admin_file)
            smoke_attach(member, member_cinder, nova, sid)
            return
        # an earlier cloud's, of the admin project: the admin's server now
        if owned_by(api, nova, sid, api.project_id) and not admin_file.exists():
            admin_file.write_text(sid)
        else:
            delete_server(api, nova, sid)
        server_file.unlink()
    # map the host to its cell now rather than leave it to a periodic task;
    # os-hypervisors lists a node only once it is mapped
    d = STATE / "nova"
    discover = [venv_bin("nova-manage"), "--config-file", str(d / "nova.conf"), "--config-file",
                str(d / "nova-db.conf"), "cell_v2", "discover_hosts"]

    def mapped():
        if len(api.call("GET", nova + "/os-hypervisors")["hypervisors"]) >= len(ZONES):
            return True
        run(discover)
        return len(api.call("GET", nova + "/os-hypervisors")["hypervisors"]) >= len(ZONES)

    wait_until("the compute hosts' cell mapping", mapped, 90, STATE / "logs" / "nova-compute-app.log",
               process="nova-compute")
    zone_aggregates(api, nova)
    server = boot_server(member, member_cinder, nova, "test-server", ZONES[0])
    server_file.write_text(server["id"])
    log(f"test server {server['id']} is ACTIVE (project demo)")
    ensure_admin_server(api, cinder, nova, admin_file)
    smoke_attach(member, member_cinder, nova, server["id"])


def ensure_admin_server(api, cinder, nova, admin_file):
    """A server of the admin project (`admin-server-id`): what the
    contract tests attach the admin's volumes to, and another project's
    server as the member sees it."""
    if admin_file.exists() and owned_by(api, nova, admin_file.read_text().strip(), api.project_id):
        return
    server = boot_server(api, cinder, nova, "admin-server", ZONES[0])
    admin_file.write_text(server["id"])
    log(f"admin server {server['id']} is ACTIVE (project admin)")


def owned_by(api, nova, server_id, project_id):
    """Whether the server exists (as the admin sees it) in `project_id`."""
    code, _, body = http("GET", f"{nova}/servers/{server_id}", None, {"X-Auth-Token": api.token})
    return code == 200 and body["server"].get("tenant_id") == project_id


def delete_server(api, nova, server_id):
    """Deletes the server (as the admin) and waits until it is gone."""
    api.call("DELETE", f"{nova}/servers/{server_id}", ok=(204, 404))
    wait_until(f"server {server_id} deleted", lambda: http(
        "GET", f"{nova}/servers/{server_id}", None, {"X-Auth-Token": api.token})[0] == 404, 120,
        STATE / "logs" / "nova-compute-app.log")


def compute_process(zone):
    return "nova-compute" if zone == ZONES[0] else f"nova-compute-{zone}"


def zone_aggregates(api, nova):
    """Each compute host in an aggregate of its zone (idempotent)."""
    mv = {"X-OpenStack-Nova-API-Version": "2.41"}
    existing = {a["name"]: a for a in api.call("GET", nova + "/os-aggregates", headers=mv)["aggregates"]}
    for zone, host in COMPUTE_HOSTS.items():
        agg = existing.get(zone) or api.call("POST", nova + "/os-aggregates", {"aggregate": {
            "name": zone, "availability_zone": zone}}, headers=mv)["aggregate"]
        if host not in (agg.get("hosts") or []):
            api.call("POST", f"{nova}/os-aggregates/{agg['id']}/action", {"add_host": {"host": host}}, headers=mv)
    log(f"compute hosts in zones: {', '.join(f'{h} in {z}' for z, h in COMPUTE_HOSTS.items())}")


def boot_server(api, cinder, nova, name, zone):
    """A server of flavor m1.test in `zone`, booted from a fresh bootable
    volume of that zone (no network), ACTIVE on return."""
    if zone not in ZONES:
        raise CloudError(f"unknown zone {zone!r}: the test cloud has {', '.join(ZONES)}")
    vol = api.call("POST", cinder + "/volumes", {"volume": {"size": 1, "name": f"{name}-boot",
                                                            "availability_zone": zone}})["volume"]
    wait_until("boot volume", lambda: api.call("GET", f"{cinder}/volumes/{vol['id']}")["volume"]["status"]
               == "available", 60, STATE / "logs" / "cinder-volume.log")
    api.call("POST", f"{cinder}/volumes/{vol['id']}/action", {"os-set_bootable": {"bootable": True}})
    mv = {"X-OpenStack-Nova-API-Version": "2.37"}
    server = api.call("POST", nova + "/servers", {"server": {
        "name": name, "flavorRef": "test", "networks": "none", "availability_zone": zone,
        "block_device_mapping_v2": [{"boot_index": 0, "uuid": vol["id"], "source_type": "volume",
                                     "destination_type": "volume", "delete_on_termination": True}]}},
        headers=mv)["server"]

    def active():
        st = api.call("GET", f"{nova}/servers/{server['id']}")["server"]["status"]
        if st == "ERROR":
            api.call("DELETE", f"{nova}/servers/{server['id']}", ok=(204, 404))
            raise CloudError(f"server {name} went to ERROR (deleted); see logs/nova-app.log and nova-compute-app.log")
        return st == "ACTIVE"

    deadline = time.time() + 120
    while not active():
        if time.time() > deadline:
            raise CloudError(f"server {name} did not become ACTIVE")
        time.sleep(0.5)
    return server


# the cluster tier's further nodes: `<server-id> <by-id-dir>` lines the
# hypervisor agent follows, and the names they were booted under
NODE_SERVERS = STATE / "node-servers"


NODE_SERVER_NAMES = STATE / "node-server-names.json"


@contextlib.contextmanager
def node_servers_locked():
    """The node-server list, changed by one process at a time."""
    with open(STATE / "node-servers.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def node_servers():
    return json.loads(NODE_SERVER_NAMES.read_text()) if NODE_SERVER_NAMES.exists() else {}


def write_node_servers(servers):
    tmp = NODE_SERVER_NAMES.with_suffix(".tmp")
    tmp.write_text(json.dumps(servers, indent=1))
    tmp.rename(NODE_SERVER_NAMES)
    lines = "".join(f"{s['id']} {s['by_id_dir']}\n" for s in servers.values())
    tmp = NODE_SERVERS.with_suffix(".tmp")
    tmp.write_text(lines)
    tmp.rename(NODE_SERVERS)


def cmd_node_server(rest):
    """`node-server NAME BY_ID_DIR [ZONE]`: a further server (one per
    cluster node) in ZONE (default the first) whose disks the hypervisor
    agent links in BY_ID_DIR only; idempotent; prints the server's id."""
    if len(rest) not in (2, 3) or not Path(rest[1]).is_absolute():
        raise CloudError("usage: cloud.py node-server NAME /ABSOLUTE/BY-ID-DIR [ZONE]")
    name, by_id_dir = rest[:2]
    zone = rest[2] if len(rest) == 3 else ZONES[0]
    api = Api()
    # the member's, as the test server (the Cinder driver runs as the member)
    member = member_api()
    cinder = f"http://{HOST}:{PORTS['cinder']}/v3/{member.project_id}"
    nova = f"http://{HOST}:{PORTS['nova']}/v2.1"
    known = node_servers().get(name)
    if known and known.get("zone") == zone and owned_by(api, nova, known["id"], member.project_id):
        server_id = known["id"]
    else:
        if known:
            cmd_node_server_delete([name])
        server_id = boot_server(member, cinder, nova, name, zone)["id"]
        log(f"node server {name} {server_id} is ACTIVE in {zone}")
    # several nodes' servers are booted at once: the list is updated under
    # a lock, after the (slow) boot
    with node_servers_locked():
        servers = node_servers()
        servers[name] = {"id": server_id, "by_id_dir": by_id_dir, "zone": zone}
        write_node_servers(servers)
    print(server_id)


def cmd_node_server_power(rest):
    """`node-server-power NAME stop|start`: the node's server SHUTOFF (as a
    machine that lost power) or ACTIVE again; waits for the status."""
    if len(rest) != 2 or rest[1] not in ("stop", "start"):
        raise CloudError("usage: cloud.py node-server-power NAME stop|start")
    known = node_servers().get(rest[0])
    if not known:
        raise CloudError(f"no node server {rest[0]!r} (cloud.py node-server makes one)")
    api = Api()
    nova = f"http://{HOST}:{PORTS['nova']}/v2.1/servers/{known['id']}"
    want = "SHUTOFF" if rest[1] == "stop" else "ACTIVE"

    def status():
        code, _, body = http("GET", nova, None, {"X-Auth-Token": api.token})
        return body["server"]["status"] if code == 200 else None
    if status() != want:
        # 409: already on its way there
        api.call("POST", f"{nova}/action", {f"os-{rest[1]}": None}, ok=(202, 409))
    wait_until(f"server {rest[0]} {want}", lambda: status() == want, 120, STATE / "logs" / "nova-compute-app.log")
    log(f"node server {rest[0]} {known['id']} is {want}")


def cmd_node_server_delete(rest):
    """`node-server-delete NAME`: deletes the server (its volumes detach)
    and stops following it."""
    if len(rest) != 1:
        raise CloudError("usage: cloud.py node-server-delete NAME")
    with node_servers_locked():
        servers = node_servers()
        known = servers.pop(rest[0], None)
        write_node_servers(servers)
    if not known:
        return
    api = Api()
    nova = f"http://{HOST}:{PORTS['nova']}/v2.1"
    api.call("DELETE", f"{nova}/servers/{known['id']}", ok=(204, 404))
    wait_until(f"server {rest[0]} deleted", lambda: http(
        "GET", f"{nova}/servers/{known['id']}", None, {"X-Auth-Token": api.token})[0] == 404, 120,
        STATE / "logs" / "nova-compute-app.log")
    log(f"node server {rest[0]} {known['id']} deleted")


def smoke_attach(api, cinder, nova, server_id, timeout=180):
    """Attaches and detaches a scratch volume until both work: right after
    a restart the first RPCs from nova-api to nova-compute can time out, and
    the cloud is not healthy until they go through."""
    started = time.time()
    vol = api.call("POST", cinder + "/volumes", {"volume": {"size": 1, "name": "test-cloud-smoke"}})["volume"]
    url = f"{cinder}/volumes/{vol['id']}"

    def status():
        return api.call("GET", url)["volume"]["status"]

    wait_until("smoke volume", lambda: status() == "available", 60, STATE / "logs" / "cinder-volume.log")
    attach = f"{nova}/servers/{server_id}/os-volume_attachments"
    h = {"X-Auth-Token": api.token}
    for phase in ("attach", "detach"):
        while True:
            if phase == "attach":
                code, _, body = http("POST", attach, {"volumeAttachment": {"volumeId": vol["id"]}}, h, timeout=60)
                want = "in-use"
            else:
                code, _, body = http("DELETE", f"{attach}/{vol['id']}", None, h, timeout=60)
                want = "available"
            if code in (200, 202):
                wait_until(f"smoke volume {want}", lambda: status() == want, 60, STATE / "logs" / "nova-compute-app.log")
                break
            if time.time() - started > timeout:
                raise CloudError(f"smoke {phase} kept failing: HTTP {code}: {body}")
            log(f"smoke {phase}: HTTP {code}, retrying")
            time.sleep(2)
    api.call("DELETE", url)
    log(f"attach/detach smoke test passed in {time.time() - started:.0f}s")


def detach_hypervisor_loops():
    """The loop devices the hypervisor agent made of this cloud's volume
    images: an agent that is killed (SIGKILL, a machine restart, a session
    cut off) cannot detach them itself, and each one left holds a loop
    device and its image until the machine restarts. Their links in the
    by-id folders go with them."""
    listing = subprocess.run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True)
    images = f"{HYPERVISOR_IMAGES}/"
    for line in listing.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[1].strip().startswith(images):
            continue
        device = parts[0]
        for folder in (STATE / "by-id", Path("/dev/disk/by-id")):
            for link in folder.glob("*") if folder.is_dir() else []:
                if link.is_symlink() and os.readlink(link) == device:
                    link.unlink(missing_ok=True)
        # a device still open somewhere is detached when it is closed
        detach = subprocess.run(["losetup", "-d", device], capture_output=True, text=True)
        if detach.returncode == 0:
            log(f"detached {device} ({parts[1].strip()}), left by a hypervisor agent that was killed")
        else:
            log(f"WARNING: {device} ({parts[1].strip()}) could not be detached: {detach.stderr.strip()}")


def start_hypervisor_agent():
    """The fake Nova driver attaches nothing: this agent (tests/hypervisor-agent)
    turns every volume attached to the test server into a loop device linked
    under STATE/by-id, so that node-side tests get real block devices, and
    in /dev/disk/by-id, where the guest's udev would link it (node plugins
    in containers, the cluster tier, see it there)."""
    server = (STATE / "test-server-id").read_text().strip()
    followed = STATE / "hypervisor-agent.server"
    if process_alive("hypervisor-agent"):
        if followed.exists() and followed.read_text().strip() == server:
            return
        # it follows an earlier test server (one replaced by `up`)
        stop("hypervisor-agent")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    run(["cargo", "build", "--locked", "--quiet", "-p", "hypervisor-agent"], cwd=str(REPO), timeout=1800)
    followed.write_text(server)
    start("hypervisor-agent", [target / "debug" / "hypervisor-agent", "--cloud-config", STATE / "cloud-admin.conf",
                               "--server", server, "--by-id-dir", STATE / "by-id",
                               "--also-link-in", "/dev/disk/by-id", "--node-servers", NODE_SERVERS,
                               "--image-dir", HYPERVISOR_IMAGES])
    wait_until("hypervisor-agent", lambda: (STATE / "by-id").is_dir(), 30)

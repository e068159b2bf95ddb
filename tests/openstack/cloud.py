#!/usr/bin/env python3
"""A real OpenStack test cloud on this machine, on loopback.

    cloud.py up [kms|block|file|all]   install what is missing, start, configure
    cloud.py status [profile]          exit 0 when every service of the profile answers
    cloud.py down [--purge]            stop exactly what `up` started (and delete its data)
    cloud.py env                       print the variables tests read
    cloud.py node-server NAME DIR      boot a further server (a cluster node) whose
                                       attached disks appear in DIR only; prints its id
    cloud.py node-server-delete NAME   delete it
    cloud.py node-server-power NAME stop|start
                                       its server SHUTOFF, or ACTIVE again
    cloud.py outage stop|start SERVICE...
                                       the API of keystone, barbican, cinder, nova
                                       or manila stopped (an outage), or started
                                       again as it was

Every service is also reached through the fault proxy (openstack-fault-proxy,
its admin API at OPENSTACK_TEST_FAULT_PROXY): cloud-admin-via-proxy.conf and
cloud-member-via-proxy.conf name its Keystone, whose catalog names the proxy
for every service, so that tests can throttle, delay, hold, drop or lose
the answers of the real services.

Profiles: kms = Keystone + Barbican (sqlite, no broker); block = Keystone +
Cinder (a fake driver keeping volume data in image files) + cinder-backup
(POSIX driver) + Nova (fake driver) + Placement + MariaDB + RabbitMQ;
file = Keystone + a real single-node Ceph (mon, mgr, OSD on a sparse file,
MDS, CephFS, cephx) + NFS-Ganesha serving that CephFS (its Ceph FSAL) +
Manila with three backends (the dummy driver for NFS, Manila's CephFS
driver on that Ceph natively, and the same driver exporting through
Ganesha over NFS) + MariaDB + RabbitMQ; all = every one.

Everything lives under the state directory ($OS_TEST_CLOUD_DIR, default
.openstack-cloud in the repository): configuration, databases, logs, the
PIDs of the processes started (each in its own process group), and the
clouds.yaml / cloud.conf files the tests use. The Python packages go into
a venv ($OS_TEST_CLOUD_VENV, default .venv-openstack) pinned by
constraints.txt beside this script. Only the standard library is used here.
"""

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


from testcloud.block import (
    cmd_node_server,
    cmd_node_server_delete,
    cmd_node_server_power,
    compute_process,
    configure_block,
    detach_hypervisor_loops,
    setup_cinder,
    setup_nova,
    setup_placement,
    start_hypervisor_agent,
)
from testcloud.config import (
    ADMIN_PASSWORD,
    CloudError,
    HOST,
    LAYOUT,
    MEMBER_PASSWORD,
    PORTS,
    PROFILES,
    REGION,
    STATE,
    ZONES,
    _group,
    ensure_venv,
    group_rss_kib,
    http,
    log,
    port_open,
    process_alive,
    run_cli,
    stop_all,
)
from testcloud.file import (
    CEPH_CONF,
    CEPH_DAEMONS,
    ceph_healthy,
    configure_file,
    setup_ceph,
    setup_ganesha,
    setup_manila,
    stop_ceph,
    stop_ganesha,
    system_bus_answers,
)
from testcloud.faults import PROXY_ADMIN_PORT, cmd_outage, start_fault_proxy, write_proxied_client_files
from testcloud.identity import configure_identity, keystone_url, setup_barbican, setup_keystone
from testcloud.infra import ensure_debian_packages, setup_mariadb, setup_neutron_stub, setup_rabbitmq


USERS = {"admin": ("admin", ADMIN_PASSWORD, "admin"), "member": ("demo", MEMBER_PASSWORD, "demo")}


def write_client_files(profile):
    auth = keystone_url()
    clouds = ["clouds:"]
    for name, (user, pw, project) in USERS.items():
        clouds += [f"  test-{name}:", "    auth:", f"      auth_url: \"{auth}\"", f"      username: \"{user}\"",
                   f"      password: \"{pw}\"", f"      project_name: \"{project}\"",
                   "      user_domain_name: \"Default\"", "      project_domain_name: \"Default\"",
                   f"    region_name: \"{REGION}\"", "    interface: public", "    identity_api_version: 3"]
        (STATE / f"cloud-{name}.conf").write_text(
            f"[Global]\nauth-url = \"{auth}\"\nusername = \"{user}\"\npassword = \"{pw}\"\n"
            f"user-domain-name = \"Default\"\ntenant-name = \"{project}\"\ntenant-domain-name = \"Default\"\n"
            f"region = \"{REGION}\"\n")
    (STATE / "clouds.yaml").write_text("\n".join(clouds) + "\n")
    (STATE / "profile").write_text(profile)


def services_of(profile):
    return PROFILES[profile]


def health(service):
    checks = {
        "keystone": (["keystone"], lambda: http("GET", keystone_url())[0] == 200),
        "barbican": (["barbican"], lambda: http("GET", f"http://{HOST}:{PORTS['barbican']}/")[0] in (200, 300)),
        "cinder": (["mariadb", "rabbitmq", "cinder-api", "cinder-scheduler", "cinder-volume", "cinder-backup"],
                   lambda: http("GET", f"http://{HOST}:{PORTS['cinder']}/")[0] in (200, 300)),
        "nova": (["neutron-stub", "placement", "nova-api", "nova-conductor", "nova-scheduler",
                  *(compute_process(z) for z in ZONES), "hypervisor-agent"],
                 lambda: http("GET", f"http://{HOST}:{PORTS['nova']}/")[0] == 200
                 and (STATE / "test-server-id").exists()),
        "manila": (["mariadb", "rabbitmq", "manila-api", "manila-scheduler", "manila-share"],
                   lambda: http("GET", f"http://{HOST}:{PORTS['manila']}/")[0] in (200, 300)),
        "ceph": (CEPH_DAEMONS, lambda: CEPH_CONF.exists() and ceph_healthy()),
        "ganesha": (["ganesha"], lambda: port_open(PORTS["nfs"]) and system_bus_answers()),
    }
    processes, check = checks[service]
    try:
        return all(process_alive(p) for p in processes) and check()
    except Exception:
        return False


def cmd_up(profile):
    if profile not in PROFILES:
        raise CloudError(f"unknown profile {profile!r} (kms, block, file, all)")
    if all(health(s) for s in services_of(profile)) and (STATE / "clouds.yaml").exists():
        start_fault_proxy(services_of(profile))
        write_proxied_client_files(USERS)
        log(f"profile {profile} already up")
        return
    layout = STATE / "layout"
    if (STATE / "cinder").exists() and (not layout.exists() or layout.read_text().strip() != LAYOUT):
        raise CloudError(f"the state in {STATE} is of an older layout of the test cloud (before {LAYOUT}); "
                         "start afresh: cloud.py down --purge")
    for sub in ("logs", "pids", "wsgi"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    layout.write_text(LAYOUT + "\n")
    t0 = time.time()
    services = services_of(profile)
    needs_broker = any(s in services for s in ("cinder", "nova", "manila"))
    if needs_broker:
        ensure_debian_packages(["mariadb-server", "mariadb-client", "rabbitmq-server"])
    ensure_venv(profile)
    t1 = time.time()
    if needs_broker:
        setup_mariadb(services)
        setup_rabbitmq()
    setup_keystone()
    ks = configure_identity()
    if "barbican" in services:
        setup_barbican(ks)
    if "cinder" in services:
        setup_cinder(ks)
    if "nova" in services:
        setup_neutron_stub(ks)
        setup_placement(ks)
        setup_nova(ks)
        configure_block()
    if "ceph" in services:
        setup_ceph()
    if "ganesha" in services:
        setup_ganesha()
    if "manila" in services:
        setup_manila(ks, "ceph" in services, "ganesha" in services)
        configure_file("ceph" in services, "ganesha" in services)
    write_client_files(profile)
    start_fault_proxy(services)
    write_proxied_client_files(USERS)
    if "nova" in services:
        start_hypervisor_agent()
    log(f"profile {profile} up: install {t1 - t0:.0f}s, start {time.time() - t1:.0f}s; state in {STATE}")


def cmd_status(profile):
    profile = profile or ((STATE / "profile").read_text().strip() if (STATE / "profile").exists() else "kms")
    ok = True
    for s in services_of(profile):
        h = health(s)
        ok &= h
        print(f"{s:10} {'up' if h else 'DOWN'}")
    total = 0
    for name in SERVICE_PROCESSES + ["ganesha"] + CEPH_DAEMONS + INFRA_PROCESSES:
        pgid = _group(name) if (STATE / "pids").exists() else None
        if pgid is not None and process_alive(name):
            rss = group_rss_kib(pgid)
            total += rss
            print(f"  {name:18} {rss / 1024:6.0f} MiB")
    print(f"  {'memory in all':18} {total / 1024:6.0f} MiB")
    return 0 if ok else 1


# stopped in waves: the services, then what they depend on
SERVICE_PROCESSES = [
    "fault-proxy", "hypervisor-agent",
    "nova-compute", f"nova-compute-{ZONES[1]}", "nova-api", "nova-scheduler", "nova-conductor", "placement", "neutron-stub",
    "manila-share", "manila-scheduler", "manila-api",
    "cinder-backup", "cinder-volume", "cinder-scheduler", "cinder-api",
    "barbican", "keystone",
]


INFRA_PROCESSES = ["rabbitmq", "epmd", "mariadb", "dbus"]


def cmd_down(purge):
    if (STATE / "pids").exists():
        stop_all(SERVICE_PROCESSES)
        detach_hypervisor_loops()
        stop_ganesha()
        stop_ceph()
        stop_all(INFRA_PROCESSES, grace=30)
    if purge and STATE.exists():
        shutil.rmtree(STATE)
        log(f"removed {STATE}")


def cmd_env():
    print(f"OPENSTACK_TEST_CLOUD_DIR={STATE}")
    print(f"OPENSTACK_TEST_BY_ID_DIR={STATE / 'by-id'}")
    print(f"OPENSTACK_TEST_FAULT_PROXY={HOST}:{PROXY_ADMIN_PORT}")


def main(argv):
    return run_cli(argv, __doc__, {
        "up": lambda rest: cmd_up(rest[0] if rest else "all"),
        "status": lambda rest: cmd_status(rest[0] if rest else None),
        "down": lambda rest: cmd_down("--purge" in rest),
        "env": lambda rest: cmd_env(),
        "node-server": cmd_node_server,
        "node-server-delete": cmd_node_server_delete,
        "node-server-power": cmd_node_server_power,
        "outage": cmd_outage,
    }, "cloud", {CloudError: ("ERROR", 1)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

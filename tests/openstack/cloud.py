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

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STATE = Path(os.environ.get("OS_TEST_CLOUD_DIR", REPO / ".openstack-cloud")).resolve()
# volume data: the hypervisor agent attaches it, the Cinder driver copies it
HYPERVISOR_IMAGES = STATE / "hypervisor-images"
# Nova's disk limit per server ([compute] max_disk_devices_to_attach, the
# root disk included): the node plugin under test reports one less
MAX_DISK_DEVICES = 9
VENV = Path(os.environ.get("OS_TEST_CLOUD_VENV", REPO / ".venv-openstack")).resolve()
CONSTRAINTS = HERE / "constraints.txt"
PORT_BASE = int(os.environ.get("OS_TEST_CLOUD_PORT_BASE", "25000"))
REGION = "RegionOne"
HOST = "127.0.0.1"

PORTS = {
    "keystone": PORT_BASE + 0,
    "barbican": PORT_BASE + 1,
    "cinder": PORT_BASE + 2,
    "nova": PORT_BASE + 3,
    "placement": PORT_BASE + 4,
    "manila": PORT_BASE + 5,
    "neutron": PORT_BASE + 6,
    "mariadb": PORT_BASE + 306,
    "rabbitmq": PORT_BASE + 672,
    "epmd": PORT_BASE + 369,
    # Ceph's monitor keeps its well-known ports: Manila's CephFS driver
    # hands out the v1 address, and clients read a bare 6789 as v1 only
    "ceph-mon-v2": 3300,
    "ceph-mon-v1": 6789,
    # NFS clients (mount(8), libnfs) assume the well-known port
    "nfs": 2049,
}
# the other Ceph daemons bind within this range
CEPH_PORT_RANGE = (PORT_BASE + 100, PORT_BASE + 199)

# OS_TEST_CLOUD_DEBUG=1 turns on the services' debug logging
DEBUG_LINE = "debug = true\n" if os.environ.get("OS_TEST_CLOUD_DEBUG") else ""
ADMIN_PASSWORD = "admin-secret"
MEMBER_PASSWORD = "demo-secret"
SERVICE_PASSWORD = "service-secret"

# two availability zones, as a multi-zone cloud has them: Cinder's and
# Nova's first (each compute host in an aggregate of its zone, so that no
# server lands in a zone by default) and a second one, each with a Cinder
# backend and a compute host; no attach across them (cross_az_attach)
ZONES = ("az1", "az2")
COMPUTE_HOSTS = {"az1": "test-compute", "az2": "test-compute-az2"}
# bumped when an existing cloud's state cannot be carried over
LAYOUT = "zones-1"

PROFILES = {
    "kms": ["keystone", "barbican"],
    "block": ["keystone", "cinder", "nova"],
    "file": ["keystone", "ceph", "ganesha", "manila"],
    "all": ["keystone", "barbican", "cinder", "nova", "ceph", "ganesha", "manila"],
}

PACKAGES = {
    "keystone": ["keystone", "gunicorn"],
    "barbican": ["barbican"],
    "cinder": ["cinder", "PyMySQL"],
    "nova": ["nova", "openstack-placement", "PyMySQL"],
    "manila": ["manila", "PyMySQL"],
    "ceph": [],
    "ganesha": [],
}
CEPH_DEBIAN_PACKAGES = ["ceph-mon", "ceph-mgr", "ceph-mgr-modules-core", "ceph-osd", "ceph-mds", "ceph-fuse",
                        "python3-rados", "python3-cephfs", "ceph-common"]


def log(msg):
    print(f"[cloud] {msg}", flush=True)


class CloudError(Exception):
    pass


# ---------------------------------------------------------------- helpers

sys.path.insert(0, str(HERE.parent / "lib"))
from services import Services, group_rss_kib, http, port_open as _port_open, run_cli  # noqa: E402

SERVICES = Services(STATE, log, CloudError)
run = SERVICES.run
wait_until = SERVICES.wait_until
pid_file = SERVICES.pid_file
process_alive = SERVICES.alive
start = SERVICES.start
_group = SERVICES.group
_forget = SERVICES.forget
stop_all = SERVICES.stop_all
stop = SERVICES.stop


def venv_bin(name):
    return str(VENV / "bin" / name)


def port_open(port, host=HOST):
    return _port_open(port, host)


def gunicorn(name, module, port, env, workers=1, threads=4):
    """Serves a WSGI app through a wrapper module (gotchas 1-3)."""
    start(name, [
        venv_bin("gunicorn"), "--bind", f"{HOST}:{port}", "--workers", str(workers), "--threads", str(threads),
        "--timeout", "120", "--no-control-socket", "--pythonpath", str(STATE / "wsgi"), f"{module}:application",
    ], env=env, cwd=str(STATE))


def write_wsgi(module, body):
    d = STATE / "wsgi"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{module}.py").write_text(body)


# ---------------------------------------------------------------- venv


def ensure_venv(profile):
    wanted = sorted({p for s in PROFILES[profile] for p in PACKAGES[s]})
    marker = VENV / ".installed"
    have = set(marker.read_text().split()) if marker.exists() else set()
    # the pins' content, not the file's time: a fresh clone of the same
    # pins reuses a kept venv (.ci/run keeps it on the machine)
    constraints_stamp = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()
    stamp = VENV / ".constraints-stamp"
    if stamp.exists() and stamp.read_text() != constraints_stamp:
        have = set()
    missing = [p for p in wanted if p not in have]
    if not missing:
        return
    if not (VENV / "bin" / "python").exists():
        log(f"creating venv {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
    log(f"pip install {' '.join(missing)} (pinned)")
    t = time.time()
    run([venv_bin("pip"), "install", "-q", "--disable-pip-version-check", "-c", str(CONSTRAINTS), *missing], timeout=1200)
    log(f"pip install took {time.time() - t:.0f}s")
    marker.write_text("\n".join(sorted(have | set(missing))))
    stamp.write_text(constraints_stamp)


# ------------------------------------------------------------- keystone


def keystone_url():
    return f"http://{HOST}:{PORTS['keystone']}/v3"


def setup_keystone():
    d = STATE / "keystone"
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "keystone.conf"
    conf.write_text(f"""[DEFAULT]
log_file = {STATE}/logs/keystone-app.log
[database]
connection = sqlite:///{d}/keystone.db
[token]
provider = fernet
expiration = 3600
[fernet_tokens]
key_repository = {d}/fernet-keys
[fernet_receipts]
key_repository = {d}/fernet-keys
[credential]
key_repository = {d}/credential-keys
[identity]
password_hash_rounds = 4
[cache]
enabled = true
backend = dogpile.cache.memory
""")
    env = {"OS_KEYSTONE_CONFIG_FILES": str(conf)}
    if not (d / ".bootstrapped").exists():
        t = time.time()
        manage = [venv_bin("keystone-manage"), "--config-file", str(conf)]
        run(manage + ["db_sync"])
        run(manage + ["fernet_setup", "--keystone-user", "root", "--keystone-group", "root"])
        run(manage + ["credential_setup", "--keystone-user", "root", "--keystone-group", "root"])
        run(manage + ["bootstrap", "--bootstrap-password", ADMIN_PASSWORD,
                      "--bootstrap-admin-url", keystone_url(), "--bootstrap-public-url", keystone_url(),
                      "--bootstrap-internal-url", keystone_url(), "--bootstrap-region-id", REGION])
        (d / ".bootstrapped").write_text("")
        log(f"keystone initialised in {time.time() - t:.0f}s")
    write_wsgi("keystone_app", f"""import os, sys
sys.argv = sys.argv[:1]
os.environ["OS_KEYSTONE_CONFIG_FILES"] = {str(conf)!r}
from keystone.server.wsgi import initialize_public_application
application = initialize_public_application()
""")
    # sqlite takes one writer at a time, and a token issue writes: on fresh
    # databases, concurrent logins of the starting services answered 500
    # ("database is locked") and nova-conductor died of it; serially, as
    # Barbican
    gunicorn("keystone", "keystone_app", PORTS["keystone"], env, workers=1, threads=1)
    wait_until("keystone", lambda: http("GET", keystone_url())[0] == 200, 90, STATE / "logs" / "keystone.log")


class Keystone:
    """Just enough of the Keystone admin API to set the cloud up."""

    def __init__(self):
        body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": "admin", "domain": {"id": "default"}, "password": ADMIN_PASSWORD}}},
            "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}}
        status, headers, _ = http("POST", keystone_url() + "/auth/tokens", body)
        if status != 201:
            raise CloudError(f"cannot authenticate as admin: HTTP {status}")
        self.token = headers.get("X-Subject-Token") or headers.get("x-subject-token")

    def call(self, method, path, body=None, ok=(200, 201, 204)):
        status, _, resp = http(method, keystone_url() + path, body, {"X-Auth-Token": self.token})
        if status not in ok:
            raise CloudError(f"keystone {method} {path}: HTTP {status}: {resp}")
        return resp

    def find(self, kind, name):
        items = self.call("GET", f"/{kind}?name={name}")[kind]
        return items[0]["id"] if items else None

    def ensure(self, kind, name, body):
        found = self.find(kind, name)
        if found:
            return found
        single = kind[:-1]
        return self.call("POST", f"/{kind}", {single: body})[single]["id"]

    def project(self, name):
        return self.ensure("projects", name, {"name": name, "domain_id": "default"})

    def role(self, name):
        return self.ensure("roles", name, {"name": name})

    def user(self, name, password, project_id):
        return self.ensure("users", name, {"name": name, "password": password, "domain_id": "default",
                                           "default_project_id": project_id})

    def grant(self, project_id, user_id, role_name):
        self.call("PUT", f"/projects/{project_id}/users/{user_id}/roles/{self.role(role_name)}")

    def service(self, service_type, name, url):
        sid = None
        for s in self.call("GET", f"/services?type={service_type}")["services"]:
            sid = s["id"]
        if not sid:
            sid = self.call("POST", "/services", {"service": {"type": service_type, "name": name}})["service"]["id"]
        existing = self.call("GET", f"/endpoints?service_id={sid}")["endpoints"]
        for iface in ("public", "internal", "admin"):
            if not any(e["interface"] == iface for e in existing):
                self.call("POST", "/endpoints", {"endpoint": {"service_id": sid, "interface": iface, "url": url,
                                                              "region_id": REGION}})

    def service_user(self, name):
        service = self.project("service")
        uid = self.user(name, SERVICE_PASSWORD, service)
        self.grant(service, uid, "admin")
        self.grant(service, uid, "service")
        return uid


def configure_identity():
    ks = Keystone()
    admin_project = ks.find("projects", "admin")
    admin = ks.find("users", "admin")
    demo_project = ks.project("demo")
    demo = ks.user("demo", MEMBER_PASSWORD, demo_project)
    for r in ("member", "reader", "creator"):
        ks.grant(demo_project, demo, r)
    ks.grant(admin_project, admin, "creator")
    ks.project("service")
    ks.role("service")
    return ks


def keystone_authtoken(service_user):
    return f"""[keystone_authtoken]
www_authenticate_uri = {keystone_url()}
auth_url = {keystone_url()}
auth_type = password
username = {service_user}
password = {SERVICE_PASSWORD}
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = {REGION}
memcached_servers =
"""


# ------------------------------------------------------------- barbican


def setup_barbican(ks):
    d = STATE / "barbican"
    home = d / "home"
    (home / ".barbican").mkdir(parents=True, exist_ok=True)
    url = f"http://{HOST}:{PORTS['barbican']}"
    kek_file = d / "kek"
    if not kek_file.exists():
        kek_file.write_text(base64.b64encode(os.urandom(32)).decode())
    ks.service_user("barbican")
    ks.service("key-manager", "barbican", url)
    conf = home / ".barbican" / "barbican.conf"
    conf.write_text(f"""[DEFAULT]
host_href = {url}
log_file = {STATE}/logs/barbican-app.log
[database]
connection = sqlite:///{d}/barbican.db
[queue]
enable = false
[secretstore]
enabled_secretstore_plugins = store_crypto
[crypto]
enabled_crypto_plugins = simple_crypto
[simple_crypto_plugin]
kek = {kek_file.read_text().strip()}
[oslo_policy]
enforce_scope = false
enforce_new_defaults = false
{keystone_authtoken("barbican")}
""")
    paste = d / "barbican-api-paste.ini"
    shutil.copy(VENV / "etc" / "barbican" / "barbican-api-paste.ini", paste)
    env = {"HOME": str(home)}
    if not (d / ".migrated").exists():
        run([venv_bin("barbican-manage"), "db", "upgrade"], env={**os.environ, **env})
        (d / ".migrated").write_text("")
    # the stock WSGI entry point insists on /etc/barbican; load our copy
    write_wsgi("barbican_app", f"""import sys
sys.argv = sys.argv[:1]
from barbican.common import config  # reads $HOME/.barbican/barbican.conf
from paste import deploy
application = deploy.loadapp("config:{paste}")
""")
    # sqlite takes one writer at a time: concurrent requests on several
    # threads fail with "database is locked", so Barbican serves serially
    gunicorn("barbican", "barbican_app", PORTS["barbican"], env, workers=1, threads=1)
    wait_until("barbican", lambda: http("GET", url + "/")[0] in (200, 300), 90, STATE / "logs" / "barbican.log")


# ------------------------------------------------- MariaDB and RabbitMQ

DB_USER = "openstack"
DB_PASSWORD = "db-secret"
DATABASES = {"cinder": ["cinder"], "nova": ["nova_api", "nova", "nova_cell0", "placement"], "manila": ["manila"]}


def db_url(name):
    return f"mysql+pymysql://{DB_USER}:{DB_PASSWORD}@{HOST}:{PORTS['mariadb']}/{name}?charset=utf8"


ensure_debian_packages = SERVICES.ensure_debian_packages


def setup_mariadb(services):
    d = STATE / "mariadb"
    data = d / "data"
    sock = d / "mysqld.sock"
    if not (data / "mysql").exists():
        d.mkdir(parents=True, exist_ok=True)
        run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=socket", "--skip-test-db"])
    start("mariadb", ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={sock}",
                      f"--port={PORTS['mariadb']}", f"--bind-address={HOST}", "--user=root",
                      f"--pid-file={d}/mariadbd.pid", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                      "--skip-log-bin", "--max-connections=500", f"--log-error={STATE}/logs/mariadb-error.log"])
    wait_until("mariadb", lambda: sock.exists() and port_open(PORTS["mariadb"]), 60, STATE / "logs" / "mariadb-error.log")
    stmts = [f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{HOST}' IDENTIFIED BY '{DB_PASSWORD}';"]
    for svc in services:
        for db in DATABASES.get(svc, []):
            stmts.append(f"CREATE DATABASE IF NOT EXISTS {db} CHARACTER SET utf8mb4;")
            stmts.append(f"GRANT ALL PRIVILEGES ON {db}.* TO '{DB_USER}'@'{HOST}';")
    run(["mariadb", f"--socket={sock}", "-uroot", "-e", " ".join(stmts)])


def rabbit_url():
    return f"rabbit://guest:guest@{HOST}:{PORTS['rabbitmq']}/"


def setup_rabbitmq():
    d = STATE / "rabbitmq"
    home = d / "home"
    home.mkdir(parents=True, exist_ok=True)
    (d / "enabled_plugins").write_text("[].\n")
    env = {
        "HOME": str(home),
        "ERL_EPMD_PORT": str(PORTS["epmd"]),
        "ERL_EPMD_ADDRESS": HOST,
        "RABBITMQ_NODENAME": "rabbit-test@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(PORTS["rabbitmq"]),
        "RABBITMQ_DIST_PORT": str(PORTS["rabbitmq"] + 1),
        "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
        "RABBITMQ_LOG_BASE": str(STATE / "logs" / "rabbitmq"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq"),
        "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
        "RABBITMQ_FEATURE_FLAGS_FILE": str(d / "feature_flags"),
        "RABBITMQ_QUORUM_DIR": str(d / "quorum"),
        "RABBITMQ_STREAM_DIR": str(d / "stream"),
        "ERL_CRASH_DUMP": str(STATE / "logs" / "erl_crash.dump"),
        # the Erlang distribution port listens on every address otherwise
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    (d / "rabbitmq.conf").write_text("loopback_users.guest = false\nlisteners.tcp.default = 127.0.0.1:%d\n"
                                     % PORTS["rabbitmq"])
    # our own epmd, in the foreground, so that `down` can end it
    start("epmd", ["epmd", "-port", str(PORTS["epmd"]), "-address", HOST], env=env)
    wait_until("epmd", lambda: port_open(PORTS["epmd"]), 20)
    # /usr/sbin/rabbitmq-server switches to the rabbitmq user, who cannot
    # write our state directory: run the script it wraps, as ourselves
    start("rabbitmq", ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env)
    wait_until("rabbitmq", lambda: port_open(PORTS["rabbitmq"]), 90, STATE / "logs" / "rabbitmq.log")


# ------------------------------------------------------ network stub

NEUTRON_STUB = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Stub(BaseHTTPRequestHandler):
    # Nova asks the network service about ports and networks even for
    # servers with networks "none": every list is empty
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        parts = [p for p in path.split("/") if p]
        if not parts:
            return self._send(200, {"versions": [{"id": "v2.0", "status": "CURRENT", "links": []}]})
        if parts[0] == "v2.0" and len(parts) == 2:
            name = parts[1].replace(".json", "")
            return self._send(200, {name: []})
        return self._send(404, {"NeutronError": {"type": "NotFound", "message": "not found", "detail": ""}})

    def do_DELETE(self):
        self._send(204, {})

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Stub).serve_forever()
"""


def setup_neutron_stub(ks):
    path = STATE / "wsgi" / "neutron_stub.py"
    path.write_text(NEUTRON_STUB)
    start("neutron-stub", [sys.executable, str(path), str(PORTS["neutron"])])
    wait_until("network stub", lambda: port_open(PORTS["neutron"]), 20)
    ks.service("network", "neutron", f"http://{HOST}:{PORTS['neutron']}")


# ------------------------------------------------------------ placement


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


# --------------------------------------------------------------- cinder


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


# ----------------------------------------------------------------- nova


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


def reported_since_start(process, services):
    """Whether one of `services` (an os-services listing) is up on a
    heartbeat sent after `process` was started by us."""
    marker = STATE / "pids" / f"{process}.started"
    started = float(marker.read_text()) if marker.exists() else 0
    for svc in services:
        stamp = svc.get("updated_at") or ""
        if svc.get("state") == "up" and stamp:
            when = time.mktime(time.strptime(stamp.split(".")[0], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            if when >= started - 1:
                return True
    return False


class Api:
    """Calls OpenStack APIs as one user, with the catalog from Keystone."""

    def __init__(self, user="admin", password=ADMIN_PASSWORD, project="admin"):
        body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": user, "domain": {"id": "default"}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"id": "default"}}}}}
        status, headers, resp = http("POST", keystone_url() + "/auth/tokens", body)
        if status != 201:
            raise CloudError(f"cannot authenticate as {user}: HTTP {status}")
        self.token = headers.get("X-Subject-Token") or headers.get("x-subject-token")
        self.project_id = resp["token"]["project"]["id"]

    def call(self, method, url, body=None, ok=(200, 201, 202, 204), headers=None):
        h = {"X-Auth-Token": self.token, **(headers or {})}
        status, _, resp = http(method, url, body, h, timeout=60)
        if status not in ok:
            raise CloudError(f"{method} {url}: HTTP {status}: {resp}")
        return resp


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
    if server_file.exists():
        sid = server_file.read_text().strip()
        if http("GET", f"{nova}/servers/{sid}", None, {"X-Auth-Token": api.token})[0] == 200:
            smoke_attach(api, cinder, nova, sid)
            return
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
    server = boot_server(api, cinder, nova, "test-server", ZONES[0])
    server_file.write_text(server["id"])
    log(f"test server {server['id']} is ACTIVE")
    smoke_attach(api, cinder, nova, server["id"])


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
    cinder = f"http://{HOST}:{PORTS['cinder']}/v3/{api.project_id}"
    nova = f"http://{HOST}:{PORTS['nova']}/v2.1"
    known = node_servers().get(name)
    if (known and known.get("zone") == zone
            and http("GET", f"{nova}/servers/{known['id']}", None, {"X-Auth-Token": api.token})[0] == 200):
        server_id = known["id"]
    else:
        if known:
            cmd_node_server_delete([name])
        server_id = boot_server(api, cinder, nova, name, zone)["id"]
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



# ----------------------------------------------------------------- ceph

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

# -------------------------------------------------------------- ganesha

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


# --------------------------------------------------------------- manila


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
            "shares": -1, "gigabytes": -1, "snapshots": -1, "snapshot_gigabytes": -1}}, headers=mv)
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
    # the scheduler needs each backend's first capability report
    backends = manila_backends(with_ceph, with_ganesha)

    def pools():
        names = [p["name"] for p in api.call("GET", manila + "/scheduler-stats/pools", headers=mv)["pools"]]
        return all(any(f"@{b}" in n for n in names) for b in backends)
    wait_until("the manila pools", pools, 120, STATE / "logs" / "manila-app.log")


# ----------------------------------------------------------- hypervisor


def start_hypervisor_agent():
    """The fake Nova driver attaches nothing: this agent (tests/hypervisor-agent)
    turns every volume attached to the test server into a loop device linked
    under STATE/by-id, so that node-side tests get real block devices, and
    in /dev/disk/by-id, where the guest's udev would link it (node plugins
    in containers, the cluster tier, see it there)."""
    if process_alive("hypervisor-agent"):
        return
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    run(["cargo", "build", "--locked", "--quiet", "-p", "hypervisor-agent"], cwd=str(REPO), timeout=1800)
    server = (STATE / "test-server-id").read_text().strip()
    start("hypervisor-agent", [target / "debug" / "hypervisor-agent", "--cloud-config", STATE / "cloud-admin.conf",
                               "--server", server, "--by-id-dir", STATE / "by-id",
                               "--also-link-in", "/dev/disk/by-id", "--node-servers", NODE_SERVERS,
                               "--image-dir", HYPERVISOR_IMAGES])
    wait_until("hypervisor-agent", lambda: (STATE / "by-id").is_dir(), 30)


# ------------------------------------------------------------- outputs


def write_client_files(profile):
    auth = keystone_url()
    users = {"admin": ("admin", ADMIN_PASSWORD, "admin"), "member": ("demo", MEMBER_PASSWORD, "demo")}
    clouds = ["clouds:"]
    for name, (user, pw, project) in users.items():
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


# ---------------------------------------------------------------- verbs


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
    "hypervisor-agent",
    "nova-compute", f"nova-compute-{ZONES[1]}", "nova-api", "nova-scheduler", "nova-conductor", "placement", "neutron-stub",
    "manila-share", "manila-scheduler", "manila-api",
    "cinder-backup", "cinder-volume", "cinder-scheduler", "cinder-api",
    "barbican", "keystone",
]
INFRA_PROCESSES = ["rabbitmq", "epmd", "mariadb", "dbus"]


def cmd_down(purge):
    if (STATE / "pids").exists():
        stop_all(SERVICE_PROCESSES)
        stop_ganesha()
        stop_ceph()
        stop_all(INFRA_PROCESSES, grace=30)
    if purge and STATE.exists():
        shutil.rmtree(STATE)
        log(f"removed {STATE}")


def cmd_env():
    print(f"OPENSTACK_TEST_CLOUD_DIR={STATE}")
    print(f"OPENSTACK_TEST_BY_ID_DIR={STATE / 'by-id'}")


def main(argv):
    return run_cli(argv, __doc__, {
        "up": lambda rest: cmd_up(rest[0] if rest else "all"),
        "status": lambda rest: cmd_status(rest[0] if rest else None),
        "down": lambda rest: cmd_down("--purge" in rest),
        "env": lambda rest: cmd_env(),
        "node-server": cmd_node_server,
        "node-server-delete": cmd_node_server_delete,
        "node-server-power": cmd_node_server_power,
    }, "cloud", {CloudError: ("ERROR", 1)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

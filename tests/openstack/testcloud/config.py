"""The test cloud's settings (ports, zones, profiles, passwords, where its
state and venv live) and the helpers every part uses: logging, the
process supervisor of tests/lib/services.py, gunicorn, the venv."""

import hashlib
import os
import sys
import time
from pathlib import Path

# tests/openstack: cloud.py, constraints.txt and the drivers beside it
HERE = Path(__file__).resolve().parent.parent
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
# group_rss_kib, http and run_cli are for the other parts
from services import Services, group_rss_kib, http, port_open as _port_open, run_cli  # noqa: E402, F401

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
    """Serves a WSGI app through a wrapper module (gotchas 1-3). Without
    keep-alive: every answer says `Connection: close`, so the services'
    pooled clients never reuse a connection. Kept alive, connections
    failed calls twice under load: one reused as gunicorn's 2 s idle
    timer closed it ("Remote end closed connection without response",
    Nova's of Cinder), and, with a 75 s timer, Nova's scheduler read an
    earlier answer's body from a pooled connection to Placement
    (BadStatusLine, a node server's boot ended in NoValidHost)."""
    start(name, [
        venv_bin("gunicorn"), "--bind", f"{HOST}:{port}", "--workers", str(workers), "--threads", str(threads),
        "--timeout", "120", "--keep-alive", "0", "--no-control-socket", "--pythonpath", str(STATE / "wsgi"),
        f"{module}:application",
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

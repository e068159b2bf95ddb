#!/usr/bin/env python3
"""A real OpenStack test cloud on this machine, on loopback.

    cloud.py up [kms|block|file|all]   install what is missing, start, configure
    cloud.py status [profile]          exit 0 when every service of the profile answers
    cloud.py down [--purge]            stop exactly what `up` started (and delete its data)
    cloud.py env                       print the variables tests read

Profiles: kms = Keystone + Barbican (sqlite, no broker); block = Keystone +
Cinder (fake driver) + Nova (fake driver) + Placement + MariaDB + RabbitMQ;
file = Keystone + Manila (dummy driver) + MariaDB + RabbitMQ; all = every one.

Everything lives under the state directory ($OS_TEST_CLOUD_DIR, default
.openstack-cloud in the repository): configuration, databases, logs, the
PIDs of the processes started (each in its own process group), and the
clouds.yaml / cloud.conf files the tests use. The Python packages go into
a venv ($OS_TEST_CLOUD_VENV, default .venv-openstack) pinned by
constraints.txt beside this script. Only the standard library is used here.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STATE = Path(os.environ.get("OS_TEST_CLOUD_DIR", REPO / ".openstack-cloud")).resolve()
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
}

ADMIN_PASSWORD = "admin-secret"
MEMBER_PASSWORD = "demo-secret"
SERVICE_PASSWORD = "service-secret"

PROFILES = {
    "kms": ["keystone", "barbican"],
    "block": ["keystone", "cinder", "nova"],
    "file": ["keystone", "manila"],
    "all": ["keystone", "barbican", "cinder", "nova", "manila"],
}

PACKAGES = {
    "keystone": ["keystone", "gunicorn"],
    "barbican": ["barbican"],
    "cinder": ["cinder", "PyMySQL"],
    "nova": ["nova", "openstack-placement", "PyMySQL"],
    "manila": ["manila", "PyMySQL"],
}


def log(msg):
    print(f"[cloud] {msg}", flush=True)


class CloudError(Exception):
    pass


# ---------------------------------------------------------------- helpers


def run(cmd, env=None, cwd=None, timeout=600):
    """Runs a command, failing with its output tail."""
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
        raise CloudError(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{tail}")
    return res.stdout


def venv_bin(name):
    return str(VENV / "bin" / name)


def port_open(port, host=HOST):
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def http(method, url, body=None, headers=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, dict(r.headers), (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return e.code, dict(e.headers), parsed


def wait_until(what, check, timeout, log_file=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.25)
    tail = ""
    if log_file and Path(log_file).exists():
        tail = "\n".join(Path(log_file).read_text(errors="replace").splitlines()[-40:])
    raise CloudError(f"{what} did not come up within {timeout}s; log tail:\n{tail}")


# ------------------------------------------------------------ processes


def pid_file(name):
    return STATE / "pids" / f"{name}.pid"


def process_alive(name):
    p = pid_file(name)
    if not p.exists():
        return False
    try:
        pid = int(p.read_text().strip())
        os.kill(pid, 0)
        return True
    except (ValueError, ProcessLookupError, PermissionError):
        return False


def start(name, cmd, env=None, cwd=None):
    """Starts a service in its own process group and records its PID."""
    if process_alive(name):
        return
    (STATE / "pids").mkdir(parents=True, exist_ok=True)
    (STATE / "logs").mkdir(parents=True, exist_ok=True)
    out = open(STATE / "logs" / f"{name}.log", "ab")
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(
        [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=full_env, cwd=cwd, start_new_session=True,
    )
    pid_file(name).write_text(str(proc.pid))
    log(f"started {name} (pid {proc.pid})")


def stop(name, grace=15):
    p = pid_file(name)
    if not p.exists():
        return
    try:
        pid = int(p.read_text().strip())
    except ValueError:
        p.unlink()
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        p.unlink()
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.unlink(missing_ok=True)
    log(f"stopped {name}")


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
    constraints_stamp = str(CONSTRAINTS.stat().st_mtime_ns)
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
    gunicorn("keystone", "keystone_app", PORTS["keystone"], env, workers=2, threads=4)
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
        "keystone": lambda: http("GET", keystone_url())[0] == 200,
        "barbican": lambda: http("GET", f"http://{HOST}:{PORTS['barbican']}/")[0] in (200, 300),
    }
    check = checks.get(service)
    if check is None:
        return False
    try:
        return process_alive(service) and check()
    except Exception:
        return False


def cmd_up(profile):
    if profile not in PROFILES:
        raise CloudError(f"unknown profile {profile!r} (kms, block, file, all)")
    if all(health(s) for s in services_of(profile)) and (STATE / "clouds.yaml").exists():
        log(f"profile {profile} already up")
        return
    for sub in ("logs", "pids", "wsgi"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ensure_venv(profile)
    t1 = time.time()
    setup_keystone()
    ks = configure_identity()
    services = services_of(profile)
    if "barbican" in services:
        setup_barbican(ks)
    unsupported = [s for s in services if s not in ("keystone", "barbican")]
    if unsupported:
        raise CloudError(f"services not available in this version of the script: {', '.join(unsupported)}")
    write_client_files(profile)
    log(f"profile {profile} up: install {t1 - t0:.0f}s, start {time.time() - t1:.0f}s; state in {STATE}")


def cmd_status(profile):
    profile = profile or ((STATE / "profile").read_text().strip() if (STATE / "profile").exists() else "kms")
    ok = True
    for s in services_of(profile):
        h = health(s)
        ok &= h
        print(f"{s:10} {'up' if h else 'DOWN'}")
    return 0 if ok else 1


ALL_PROCESSES = ["barbican", "keystone"]


def cmd_down(purge):
    for name in ALL_PROCESSES:
        stop(name)
    if purge and STATE.exists():
        shutil.rmtree(STATE)
        log(f"removed {STATE}")


def cmd_env():
    print(f"OPENSTACK_TEST_CLOUD_DIR={STATE}")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    verb, rest = argv[0], argv[1:]
    try:
        if verb == "up":
            cmd_up(rest[0] if rest else "all")
        elif verb == "status":
            return cmd_status(rest[0] if rest else None)
        elif verb == "down":
            cmd_down("--purge" in rest)
        elif verb == "env":
            cmd_env()
        else:
            print(__doc__)
            return 2
    except CloudError as e:
        print(f"[cloud] ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The test cloud's identity: Keystone (its users, projects, roles, service
users and catalog), Barbican, and calls to the cloud's APIs as one of its
users."""

import base64
import os
import shutil
import time

from .config import (
    ADMIN_PASSWORD,
    CloudError,
    HOST,
    MEMBER_PASSWORD,
    PORTS,
    REGION,
    SERVICE_PASSWORD,
    STATE,
    VENV,
    gunicorn,
    http,
    log,
    run,
    venv_bin,
    wait_until,
    write_wsgi,
)


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


def member_api():
    """The project member `demo`: the drivers' credentials, as production
    runs them; the test server and the cluster's node servers are its."""
    return Api("demo", MEMBER_PASSWORD, "demo")


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

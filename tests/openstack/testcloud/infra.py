"""What the services share: MariaDB, RabbitMQ, Debian packages, and the
stand-in network service (Nova wants one)."""

import sys

from .config import HOST, PORTS, SERVICES, STATE, port_open, run, start, wait_until


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

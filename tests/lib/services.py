"""Processes the test tiers start and stop on this machine (the OpenStack
test cloud of tests/openstack, the Kubernetes node of tests/cluster): each
in its own process group, its PID and log under a state directory, so that
`down` stops exactly what `up` started. Only the standard library."""

import json
import os
import sys
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServiceError(Exception):
    pass


class Services:
    """The processes of one tier, recorded under `state`/pids, logging to
    `state`/logs/<name>.log."""

    def __init__(self, state, log, error=ServiceError):
        self.state = Path(state)
        self.log = log
        self.error = error

    # ------------------------------------------------------------ commands

    def run(self, cmd, env=None, cwd=None, timeout=600, input=None):
        """Runs a command, failing with its output tail."""
        res = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True,
                             timeout=timeout, input=input)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
            raise self.error(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{tail}")
        return res.stdout

    def wait_until(self, what, check, timeout, log_file=None, process=None):
        """Waits for `check`; fails at once, with the log tail, if `process`
        (default: the service named `what`, when it is one we started) died."""
        process = process or (what if self.pid_file(what).exists() else None)
        deadline = time.time() + timeout
        reason = f"did not come up within {timeout}s"
        while time.time() < deadline:
            try:
                if check():
                    return
            except Exception:
                pass
            if process and not self.alive(process):
                reason = "exited while starting"
                break
            time.sleep(0.25)
        log_file = log_file or self.state / "logs" / f"{what}.log"
        tail = ""
        if Path(log_file).exists():
            tail = "\n".join(Path(log_file).read_text(errors="replace").splitlines()[-40:])
        raise self.error(f"{what} {reason}; log tail ({log_file}):\n{tail}")

    def ensure_debian_packages(self, packages, recommends=True):
        """Installs the packages that are missing; never upgrades."""
        missing = [p for p in packages if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                                        text=True).stdout.strip() != "install ok installed"]
        if not missing:
            return
        self.log(f"apt-get install {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        self.run(["apt-get", "update", "-qq"], env=env, timeout=600)
        extra = [] if recommends else ["--no-install-recommends"]
        self.run(["apt-get", "install", "-y", "-qq", "--no-upgrade", *extra, *missing], env=env, timeout=1200)

    # ----------------------------------------------------------- processes

    def pid_file(self, name):
        return self.state / "pids" / f"{name}.pid"

    def alive(self, name):
        p = self.pid_file(name)
        if not p.exists():
            return False
        try:
            pid = int(p.read_text().strip())
            os.kill(pid, 0)
            return True
        except (ValueError, ProcessLookupError, PermissionError):
            return False

    def start(self, name, cmd, env=None, cwd=None, restart_always=False):
        """Starts a service in its own process group and records its PID.
        `restart_always`: started again 2 s after it exits, whatever its
        status, as kubelet does with a static pod of the control plane
        (the controller-manager exits when the apiserver is not healthy
        within 10 s of its start, as after a cold start until the KMS
        plugins are back); each exit is logged."""
        cwd = cwd or str(self.state)
        if self.alive(name):
            return
        if restart_always:
            cmd = ["sh", "-c", 'while :; do "$@"; echo "[supervisor] exited with status $?; started again in 2 s"; '
                   'sleep 2; done', name, *cmd]
        (self.state / "pids").mkdir(parents=True, exist_ok=True)
        (self.state / "logs").mkdir(parents=True, exist_ok=True)
        out = open(self.state / "logs" / f"{name}.log", "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd, start_new_session=True,
        )
        self.pid_file(name).write_text(str(proc.pid))
        (self.state / "pids" / f"{name}.started").write_text(str(time.time()))
        # how it was started, so that an outage can end as it began
        (self.state / "pids" / f"{name}.cmd").write_text(
            json.dumps({"cmd": [str(c) for c in cmd], "env": env or {}, "cwd": cwd}))
        self.log(f"started {name} (pid {proc.pid})")

    def start_again(self, name):
        """Starts a stopped service with the command it was last started
        with (its end of an outage)."""
        recorded = self.state / "pids" / f"{name}.cmd"
        if not recorded.exists():
            raise self.error(f"{name} was never started here")
        how = json.loads(recorded.read_text())
        self.start(name, how["cmd"], env=how["env"], cwd=how["cwd"])

    def group(self, name):
        p = self.pid_file(name)
        if not p.exists():
            return None
        try:
            return int(p.read_text().strip())
        except ValueError:
            p.unlink()
            return None

    def forget(self, name):
        self.pid_file(name).unlink(missing_ok=True)
        (self.state / "pids" / f"{name}.started").unlink(missing_ok=True)

    def stop_all(self, names, grace=15):
        """SIGTERM to the process groups of `names` at once, SIGKILL to what
        is left after `grace` seconds."""
        groups = {}
        for name in names:
            pgid = self.group(name)
            if pgid is None:
                continue
            try:
                os.killpg(pgid, signal.SIGTERM)
                groups[name] = pgid
            except ProcessLookupError:
                self.forget(name)
        deadline = time.time() + grace
        while groups and time.time() < deadline:
            for name, pgid in list(groups.items()):
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    del groups[name]
                    self.forget(name)
                    self.log(f"stopped {name}")
            time.sleep(0.2)
        for name, pgid in groups.items():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.forget(name)
            self.log(f"killed {name} (did not stop within {grace}s)")

    def stop(self, name, grace=15):
        self.stop_all([name], grace)


# ---------------------------------------------------------------- network


def group_rss_kib(pgid):
    """The resident memory of a process group's processes, in KiB."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError, ValueError):
            continue
    return total


def port_open(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def http(method, url, body=None, headers=None, timeout=10, context=None):
    """A JSON request: (status, headers, parsed body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, dict(r.headers), _parsed(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), _parsed(e.read())


def _parsed(raw):
    """JSON when it is, else the text."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


# ---------------------------------------------------------------- command


def run_cli(argv, doc, verbs, prefix, outcomes):
    """A script's command line: `verbs` maps a verb to a function of the
    remaining arguments (its return value, if any, is the exit status);
    `outcomes` maps an exception class to (word, exit status), e.g.
    {Skipped: ("SKIPPED", 3), CloudError: ("ERROR", 1)}."""
    if not argv or argv[0] in ("-h", "--help"):
        print(doc)
        return 0
    verb = verbs.get(argv[0])
    if verb is None:
        print(doc)
        return 2
    try:
        return verb(argv[1:]) or 0
    except tuple(outcomes) as e:
        word, status = next(v for k, v in outcomes.items() if isinstance(e, k))
        print(f"[{prefix}] {word}: {e}", file=sys.stderr)
        return status

"""Faults of the test cloud, as production clouds have them: the fault
proxy in front of its services (openstack-emulator's
`openstack-fault-proxy`: throttling with each retry hint, busy and lost
answers, delays), whose own Keystone hands out a catalog naming the proxy,
and outages of whole services (stopped, then started as they were)."""

import os
from pathlib import Path

from .config import HOST, PORTS, REGION, REPO, STATE, SERVICES, log, port_open, run, start, wait_until
from .identity import keystone_url

# each proxied service's listener is its own port plus this
PROXY_OFFSET = 500
PROXY_ADMIN_PORT = PORTS["keystone"] + 599
# the emulator's path prefix of each service the proxy carries
PROXIED = {
    "keystone": "identity",
    "barbican": "key-manager",
    "cinder": "volume",
    "nova": "compute",
    "placement": "placement",
    "manila": "share",
}
# what an outage stops: the API of each service (its workers keep their
# state; the API is what clients meet)
OUTAGE_PROCESSES = {
    "keystone": ["keystone"],
    "barbican": ["barbican"],
    "cinder": ["cinder-api"],
    "nova": ["nova-api"],
    "manila": ["manila-api"],
}


def proxy_port(service):
    return PORTS[service] + PROXY_OFFSET


def proxied_keystone_url():
    return keystone_url().replace(f":{PORTS['keystone']}", f":{proxy_port('keystone')}")


def start_fault_proxy(services):
    """The proxy in front of every service of the profile that listens on
    a port of its own (and Placement with Nova)."""
    if SERVICES.alive("fault-proxy"):
        return
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    run(["cargo", "build", "--locked", "--quiet", "-p", "openstack-emulator", "--bin", "openstack-fault-proxy"],
        cwd=str(REPO), timeout=1800)
    wanted = ["keystone", *services]
    if "nova" in services:
        wanted.append("placement")
    upstreams = []
    for s in dict.fromkeys(wanted):
        if s in PROXIED:
            upstreams += ["--upstream", f"{PROXIED[s]}={HOST}:{proxy_port(s)}={HOST}:{PORTS[s]}"]
    start("fault-proxy", [target / "debug" / "openstack-fault-proxy", *upstreams,
                          "--admin", f"{HOST}:{PROXY_ADMIN_PORT}"])
    wait_until("fault-proxy", lambda: port_open(PROXY_ADMIN_PORT), 30)
    # where tests find its admin API
    (STATE / "fault-proxy").write_text(f"{HOST}:{PROXY_ADMIN_PORT}\n")


def write_proxied_client_files(users):
    """cloud-<user>-via-proxy.conf: the same credentials, through the
    proxy's Keystone (and so through the proxy to every service)."""
    auth = proxied_keystone_url()
    for name, (user, pw, project) in users.items():
        (STATE / f"cloud-{name}-via-proxy.conf").write_text(
            f"[Global]\nauth-url = \"{auth}\"\nusername = \"{user}\"\npassword = \"{pw}\"\n"
            f"user-domain-name = \"Default\"\ntenant-name = \"{project}\"\ntenant-domain-name = \"Default\"\n"
            f"region = \"{REGION}\"\n")


def cmd_outage(rest):
    """outage stop|start SERVICE...: the API processes of each service
    stopped (a cloud whose API is down), or started again as they were."""
    if len(rest) < 2 or rest[0] not in ("stop", "start") or any(s not in OUTAGE_PROCESSES for s in rest[1:]):
        raise SystemExit(f"usage: cloud.py outage stop|start {'|'.join(OUTAGE_PROCESSES)}...")
    action, services = rest[0], rest[1:]
    names = [p for s in services for p in OUTAGE_PROCESSES[s]]
    if action == "stop":
        SERVICES.stop_all(names, grace=5)
        log(f"outage: {', '.join(services)} stopped")
    else:
        for n in names:
            SERVICES.start_again(n)
        for s in services:
            wait_until(f"{s} back", lambda s=s: port_open(PORTS[s]), 120)
        log(f"outage over: {', '.join(services)} answer again")
    return 0

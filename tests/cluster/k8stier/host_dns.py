"""The control-plane node's own DNS server, as a machine has one outside
the cluster (its /etc/resolv.conf's): it answers the test cloud's names
(every name under HOST_DNS_ZONE is 127.0.0.1) and nothing else (NXDOMAIN).
Cluster DNS, meanwhile, is down for the whole tier: kubelet's clusterDNS is
an address where nothing answers. So a pod whose lookups go to cluster DNS
(dnsPolicy ClusterFirst / ClusterFirstWithHostNet) cannot reach the cloud
by name, and one that uses the node's resolver (dnsPolicy Default) can:
the KMS chart's cold-start test tells them apart.

Each query is printed (time, name, type, answer) to the service's log, so
a test can show which lookups were answered.

    host_dns.py ADDRESS ZONE"""

import socket
import struct
import sys
import time

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
ANSWER_TTL = 5


def parse_question(packet):
    """(id, flags, name, qtype, end of the question) of a query, or None
    for what is not one question of class IN."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, i = [], 12
    while True:
        if i >= len(packet):
            return None
        n = packet[i]
        i += 1
        if n == 0:
            break
        # queries carry no compression pointers; labels are at most 63 bytes
        if n > 63 or i + n > len(packet):
            return None
        labels.append(packet[i:i + n].decode("ascii", errors="replace").lower())
        i += n
    if i + 4 > len(packet):
        return None
    qtype, qclass = struct.unpack("!HH", packet[i:i + 4])
    if qclass != CLASS_IN:
        return None
    return ident, flags, ".".join(labels), qtype, i + 4


def answer(packet, zone):
    """The reply to a query, and what it said (for the log)."""
    parsed = parse_question(packet)
    if parsed is None:
        return None, "ignored"
    ident, flags, name, qtype, end = parsed
    question = packet[12:end]
    ours = name == zone or name.endswith("." + zone)
    records = b""
    if ours and qtype == TYPE_A:
        # a pointer to the question's name, A, IN, TTL, 4 bytes: 127.0.0.1
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, ANSWER_TTL, 4) + socket.inet_aton("127.0.0.1")
        said = "127.0.0.1"
    elif ours:
        said = "no record of that type"
    else:
        said = "NXDOMAIN"
    rcode = 0 if ours else 3
    # QR, the query's RD, RA
    reply_flags = 0x8000 | (flags & 0x0100) | 0x0080 | rcode
    header = struct.pack("!HHHHHH", ident, reply_flags, 1, 1 if records else 0, 0, 0)
    return header + question + records, f"{name} type {qtype}: {said}"


def serve(address, zone):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    print(f"answering {zone} on {address}:53", flush=True)
    while True:
        packet, peer = sock.recvfrom(4096)
        reply, said = answer(packet, zone)
        print(f"{time.time():.3f} {said}", flush=True)
        if reply is not None:
            sock.sendto(reply, peer)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    serve(sys.argv[1], sys.argv[2].lower().rstrip("."))

"""Whether a containerd's CRI answers, asked as kubelet asks at its start
(runtime.v1.RuntimeService/Version). containerd serves its own API
(`ctr version`) before its CRI plugin has recovered its sandboxes and
containers; until then the CRI answers "server is not initialized yet",
and a kubelet started in that moment exits ("validate CRI v1 runtime
API"), as one did after a node's revival in a run of the test command.

The call is one gRPC request over HTTP/2 without TLS, written by hand so
that the tier needs nothing beyond the standard library: a successful
Version carries a message (a DATA frame of more than gRPC's 5-byte
prefix); a refused one ends with trailers only."""

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, RST_STREAM = 0x0, 0x1, 0x4, 0x6, 0x7, 0x3
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):
    """An HPACK literal header field without indexing, new name, no
    Huffman coding (RFC 7541 6.2.2); every string here is under 127 bytes."""
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def version_request():
    headers = b"".join(literal(n, v) for n, v in [
        (":method", "POST"), (":scheme", "http"), (":path", "/runtime.v1.RuntimeService/Version"),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")])
    # VersionRequest{} is empty: the gRPC prefix (uncompressed, length 0) alone
    return (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, headers)
            + frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00"))


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def cri_answers(sock_path, timeout=3.0):
    """True when the CRI at `sock_path` answers Version with a message;
    False when it refuses it, closes, or says nothing within `timeout`."""
    deadline = time.time() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock_path))
            conn.sendall(version_request())
            while time.time() < deadline:
                length, kind, flags, stream = struct.unpack(">IBBI", b"\x00" + read_exact(conn, 9))
                payload = read_exact(conn, length)
                if kind == SETTINGS and not flags & ACK:
                    conn.sendall(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    conn.sendall(frame(PING, ACK, 0, payload))
                elif kind == DATA and stream == 1 and length > 5:
                    return True
                elif kind == GOAWAY or (stream == 1 and (kind == RST_STREAM or flags & END_STREAM)):
                    return False
    except (OSError, ConnectionError, struct.error):
        return False
    return False

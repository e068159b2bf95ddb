#!/usr/bin/env python3
"""The instance metadata service of the test node: what 169.254.169.254
answers a Nova server, on a loopback port.

    metadata.py PORT UUID NAME ZONE

Serves `openstack/latest/meta_data.json` (and `/openstack/latest/` as a
directory listing); everything else is 404, as Nova's metadata API."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(port, uuid, name, zone):
    document = json.dumps({
        "uuid": uuid,
        "name": name,
        "hostname": name,
        "availability_zone": zone,
        "project_id": None,
        "devices": [],
    }).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/openstack/latest/meta_data.json":
                self._send(200, "application/json", document)
            elif path.rstrip("/") == "/openstack/latest":
                self._send(200, "text/plain", b"meta_data.json\n")
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, code, content_type, body):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(int(sys.argv[1]), *sys.argv[2:])

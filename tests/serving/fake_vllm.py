"""A stand-in for vLLM's API server, for launcher tests that need no model and start in a
second: run as ``fake_vllm.py -m vllm.entrypoints.openai.api_server --port N …`` (what the
launcher runs, through a shim named as the serving Python). It logs start-up lines, spawns a
child (vLLM's engine core runs in its own process), then answers ``/health`` and
``/v1/models``. SIGINT ends both, as it ends vLLM.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

START_LINES = ("fake: loading weights 1/2", "fake: loading weights 2/2", "fake: warming up")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"{}"
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode()
        elif self.path != "/health":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("-m")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args, _ = ap.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # vLLM shuts down on SIGTERM too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"fake: engine core pid {child.pid}", flush=True)
    for line in START_LINES:
        print(line, flush=True)
        time.sleep(0.2)
    server = ThreadingHTTPServer((args.host, args.port), _Handler)
    print("fake: serving", flush=True)
    try:
        server.serve_forever()
    finally:
        child.terminate()


if __name__ == "__main__":
    main()

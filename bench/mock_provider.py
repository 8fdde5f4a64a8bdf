#!/usr/bin/env python3
"""A loopback mock provider for `cargo xtask bench pools` (127.0.0.1 only): it serves at most
CAPACITY requests at once, each held HOLD seconds, and answers any request above that at once
with a 429 whose Retry-After (header and body text) is RETRY_AFTER seconds.

GET /stats gives {served, refused, busy_s, first, last, capacity}: busy_s is the sum of the
served requests' times, so busy_s / (capacity * (last - first)) is the share of its capacity
used. POST /reset zeroes them. Prints its port on stdout, then serves until killed.

Usage: mock_provider.py CAPACITY HOLD RETRY_AFTER
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CAPACITY = int(sys.argv[1])
HOLD = float(sys.argv[2])
RETRY_AFTER = float(sys.argv[3])
lock = threading.Lock()
state = {"in_flight": 0, "served": 0, "refused": 0, "busy_s": 0.0, "first": None, "last": None}


def reset():
    state.update(in_flight=0, served=0, refused=0, busy_s=0.0, first=None, last=None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def reply(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with lock:
            s = dict(state, capacity=CAPACITY)
        self.reply(200, s)

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        if self.path == "/reset":
            with lock:
                reset()
            self.reply(200, {})
            return
        now = time.monotonic()
        with lock:
            if state["in_flight"] >= CAPACITY:
                state["refused"] += 1
                admitted = False
            else:
                state["in_flight"] += 1
                admitted = True
                if state["first"] is None:
                    state["first"] = now
        if not admitted:
            wait = f"{RETRY_AFTER:g}s"
            self.reply(
                429,
                {"error": {"type": "rate_limit_error",
                           "message": f"429 rate limit exceeded; try again in {wait}"}},
                [("retry-after", f"{RETRY_AFTER:g}")],
            )
            return
        time.sleep(HOLD)
        end = time.monotonic()
        with lock:
            state["in_flight"] -= 1
            state["served"] += 1
            state["busy_s"] += end - now
            state["last"] = end
        self.reply(200, {"content": [{"type": "text", "text": "done"}]})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
server.request_queue_size = 256
print(server.server_address[1], flush=True)
server.serve_forever()

#!/usr/bin/env python3
"""A loopback mock of the Anthropic Messages API, for running the real Claude Code
(`claude -p`, with `ANTHROPIC_BASE_URL` pointing here) under sortie without any model provider.

    python3 anthropic_server.py [--model ID=KIND ...] [--default KIND] [--log FILE]
                                [--answer TEXT] [--hang-seconds N]

It binds 127.0.0.1 only, on a free port, and prints that port alone on the first line of
stdout (flushed), so a test can start it and read where it listens. It never makes a request
of its own. It runs until killed.

Endpoints: `POST /v1/messages` (with or without `?beta=true`), streamed as server-sent events
in the Messages format when the request says `"stream": true`, else one JSON message;
`POST /v1/messages/count_tokens`; anything else is a 404.

The scenario is chosen by the request's `model`: from `--model ID=KIND` (repeatable), else
`--default` (`answer`). Kinds:

    answer      streams the answer text (`--answer`), stop_reason "end_turn"
    tool        when the conversation has no tool result yet: a `Bash` tool call running
                `echo hi > out.txt` (or `--command CMD`; stop_reason "tool_use"); once it has one: the answer
    error500    HTTP 500 with an `api_error` body every time
    hang        HTTP 200 and event-stream headers, then nothing (for `--hang-seconds`, default
                an hour), then the connection is closed
    hang_once   the first request for the model hangs as `hang` does; every later one answers
                (for a crash mid-attempt: the retry's request answers)
    structured  a structured result in a fenced `json:result` block (`repair.py`): first
                `{"answer": "forty-two"}` (a string where the test's schema wants an
                integer); `{"answer": 42}` only for a request that continues the same
                conversation and carries the validation error (logged: `continues`,
                `has_error`), else the wrong one again (`unrepaired`)
    verify      #33's feedback round (`verify_fix.py`): a plain answer, the fixing `Bash` tool
                call only when the last user message holds the check's failure, and a final
                answer after its result (logged: `served`, `continues`, `has_failure`)

Fixed usage: input_tokens 100, cache_read_input_tokens 50, output_tokens 12 (answers) or 20
(tool calls).

`--log FILE` gets one JSON line per response, appended and flushed when the response has been
sent (for `hang`: when its headers have):

    {"model": "good", "kind": "answer", "status": 200, "stream": true,
     "prompt_chars": 17, "assistant_turns": 0, "served": "answer",
     "tokens": {"input": 100, "output": 12, "cache_read": 50, "cache_write": 0}}

`prompt_chars` is the length of the last user message's text (so a test can check that a long
prompt arrived whole); `user_texts` the first 200 characters of every text block of the user
messages (so a test can check that a resumed session carried the earlier conversation);
`system_tail` the last 300 characters of the system prompt (where an
appended system prompt lands). A response that served no tokens (error500, hang) has all-zero `tokens`.
Python 3 standard library only.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import repair
import verify_fix

KINDS = ("answer", "tool", "error500", "hang", "structured", "hang_once", "verify")
COMMAND = "echo hi > out.txt"
ZERO = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}


def tokens(output):
    return {"input": 100, "output": output, "cache_read": 50, "cache_write": 0}


def texts(content):
    """The text of a message's content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    out = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            out.append(str(block.get("text", "")))
    return "".join(out)


class Mock:
    def __init__(self, scenarios, default, log_path, answer, hang_seconds):
        self.scenarios = scenarios
        self.default = default
        self.log_path = log_path
        self.answer = answer
        self.hang_seconds = hang_seconds
        self.lock = threading.Lock()
        self.counter = 0
        self.seen = set()

    def first_request(self, model):
        """Whether this is the first request for `model` (counted once per model)."""
        with self.lock:
            first = model not in self.seen
            self.seen.add(model)
            return first

    def kind_for(self, model):
        return self.scenarios.get(model, self.default)

    def next_id(self, prefix):
        with self.lock:
            self.counter += 1
            return "%s_mock_%d" % (prefix, self.counter)

    def log(self, entry):
        if not self.log_path:
            return
        with self.lock:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()


def make_handler(mock):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: stderr is the test's
            pass

        def send_json(self, status, obj):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def do_GET(self):
            self.send_json(404, error_body("not_found_error", "mock: not found"))

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0].rstrip("/")
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_json(400, error_body("invalid_request_error", "mock: bad JSON"))
                return
            if path.endswith("/messages/count_tokens"):
                self.send_json(200, {"input_tokens": 100})
                return
            if not path.endswith("/messages"):
                self.send_json(404, error_body("not_found_error", "mock: not found"))
                return
            self.messages(body)

        def messages(self, body):
            model = str(body.get("model", ""))
            kind = mock.kind_for(model)
            stream = bool(body.get("stream"))
            messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
            users = [m for m in messages if m.get("role") == "user"]
            prompt_chars = len(texts(users[-1].get("content"))) if users else 0
            assistant_turns = sum(1 for m in messages if m.get("role") == "assistant")
            has_tool_result = any(
                isinstance(b, dict) and b.get("type") == "tool_result"
                for m in users
                if isinstance(m.get("content"), list)
                for b in m["content"]
            )
            entry = {
                "model": model,
                "kind": kind,
                "stream": stream,
                "prompt_chars": prompt_chars,
                "assistant_turns": assistant_turns,
                "system_tail": texts(body.get("system"))[-300:],
                "user_texts": [
                    str(b.get("text", ""))[:200]
                    for m in users
                    for b in (
                        m.get("content")
                        if isinstance(m.get("content"), list)
                        else [{"type": "text", "text": m.get("content")}]
                    )
                    if isinstance(b, dict) and b.get("type") == "text"
                ],
            }
            if kind == "hang_once":
                kind = "hang" if mock.first_request(model) else "answer"
            if kind == "error500":
                self.send_json(500, error_body("api_error", "mock: internal server error"))
                mock.log(dict(entry, status=500, served="error", tokens=ZERO))
                return
            if kind == "hang":
                self.start_stream()
                mock.log(dict(entry, status=200, served="hang", tokens=ZERO))
                deadline = time.monotonic() + mock.hang_seconds
                while time.monotonic() < deadline:
                    time.sleep(0.2)
                self.close_connection = True
                return
            if kind == "tool" and not has_tool_result:
                block = {
                    "type": "tool_use",
                    "id": mock.next_id("toolu"),
                    "name": "Bash",
                    "input": {"command": COMMAND, "description": "Write hi to out.txt"},
                }
                self.reply(model, stream, block, "tool_use", 20)
                mock.log(dict(entry, status=200, served="tool_use", tokens=tokens(20)))
                return
            if kind == "verify":
                self.verify_round(model, stream, messages, users, entry)
                return
            text = mock.answer
            served = "answer"
            checks = {}
            if kind == "structured":
                said = [texts(m.get("content")) for m in messages if m.get("role") == "assistant"]
                last = texts(users[-1].get("content")) if users else ""
                text, served, checks = repair.judge(said, last)
            self.reply(model, stream, {"type": "text", "text": text}, "end_turn", 12)
            mock.log(dict(entry, status=200, served=served, tokens=tokens(12), **checks))

        def verify_round(self, model, stream, messages, users, entry):
            """The `verify` scenario (see `verify_fix.py`)."""
            said = [texts(m.get("content")) for m in messages if m.get("role") == "assistant"]
            last = messages[-1] if messages else {}
            after_tool = last.get("role") == "user" and any(
                isinstance(b, dict) and b.get("type") == "tool_result"
                for b in (last.get("content") if isinstance(last.get("content"), list) else [])
            )
            last_text = texts(users[-1].get("content")) if users else ""
            served, text, checks = verify_fix.judge(said, last_text, after_tool)
            if text is None:
                block = {
                    "type": "tool_use",
                    "id": mock.next_id("toolu"),
                    "name": "Bash",
                    "input": {"command": verify_fix.FIX, "description": "Make add add"},
                }
                self.reply(model, stream, block, "tool_use", 20)
                mock.log(dict(entry, status=200, served=served, tokens=tokens(20), **checks))
                return
            self.reply(model, stream, {"type": "text", "text": text}, "end_turn", 12)
            mock.log(dict(entry, status=200, served=served, tokens=tokens(12), **checks))

        def reply(self, model, stream, block, stop_reason, output):
            mid = mock.next_id("msg")
            usage = {
                "input_tokens": 100,
                "output_tokens": output,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 50,
            }
            if not stream:
                self.send_json(
                    200,
                    {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [block],
                        "stop_reason": stop_reason,
                        "stop_sequence": None,
                        "usage": usage,
                    },
                )
                return
            self.start_stream()
            start = dict(usage, output_tokens=1)
            self.event(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start,
                    },
                },
            )
            if block["type"] == "text":
                opening = {"type": "text", "text": ""}
                words = block["text"].split(" ")
                deltas = [
                    {"type": "text_delta", "text": w if i == 0 else " " + w}
                    for i, w in enumerate(words)
                ]
            else:
                opening = dict(block, input={})
                args = json.dumps(block["input"])
                half = len(args) // 2
                deltas = [
                    {"type": "input_json_delta", "partial_json": part}
                    for part in (args[:half], args[half:])
                ]
            self.event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": opening},
            )
            for delta in deltas:
                self.event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
            self.event("content_block_stop", {"type": "content_block_stop", "index": 0})
            self.event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": output},
                },
            )
            self.event("message_stop", {"type": "message_stop"})

        def start_stream(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True

        def event(self, name, obj):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(obj))).encode())
            self.wfile.flush()

    return Handler


def error_body(kind, message):
    return {"type": "error", "error": {"type": kind, "message": message}}


def main():
    global COMMAND
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[], metavar="ID=KIND")
    ap.add_argument("--default", default="answer", choices=KINDS)
    ap.add_argument("--log")
    ap.add_argument("--answer", default="Hello from the mock model.")
    ap.add_argument("--hang-seconds", type=float, default=3600.0)
    ap.add_argument("--command", default=COMMAND,
                    help="the shell command of the tool call (`cargo xtask crash-matrix`)")
    args = ap.parse_args()
    COMMAND = args.command

    scenarios = {}
    for spec in args.model:
        model, sep, kind = spec.partition("=")
        if not sep:
            ap.error("--model wants ID=KIND, got %r" % spec)
        if kind not in KINDS:
            ap.error("model %r: unknown kind %r (expected one of %s)" % (model, kind, ", ".join(KINDS)))
        scenarios[model] = kind

    mock = Mock(scenarios, args.default, args.log, args.answer, args.hang_seconds)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(mock))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

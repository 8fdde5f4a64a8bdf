#!/usr/bin/env python3
"""A loopback mock of an OpenAI-compatible chat completions server, for running the real pi
(`api: "openai-completions"`) under sortie without any model provider.

    python3 server.py [--model ID=KIND ...] [--scenario-file FILE] [--default KIND]
                      [--log FILE] [--answer TEXT] [--hang-seconds N]

It binds 127.0.0.1 only, on a free port, and prints that port alone on the first line of
stdout (flushed), so a test can start it and read where it listens. It never makes a request
of its own. It runs until killed.

Endpoints: `POST /v1/chat/completions` (also `/chat/completions`), streamed as server-sent
events in the OpenAI format with the usage in a final chunk (`stream_options.include_usage`,
which pi always asks for), and `GET /v1/models`.

The scenario is chosen by the request's `model` (the id after pi's `provider/`): from
`--model ID=KIND` (repeatable), else from `--scenario-file` (a JSON object `{"ID": "KIND"}`),
else `--default` (`answer`). Kinds:

    answer    streams the answer text (`--answer`), finish_reason "stop"
    tool      when the conversation has no tool result yet: a `bash` tool call running
              `echo hi > out.txt` (or `--command CMD`; finish_reason "tool_calls"); once it has one: the answer
    error500  HTTP 500 with {"error": {"message": "mock: internal server error"}} every time
    hang      HTTP 200 and event-stream headers, then nothing (for `--hang-seconds`, default
              an hour), then the connection is closed
    structured  a structured result wrong first and right after a repair round that
              continues the conversation with the validation error (`repair.py`; logged:
              `served`, `continues`, `has_error`)
    stubborn  the same, but the wrong result every time (a repair round that does not help)
    verify    #33's feedback round (`verify_fix.py`): a plain answer, the fixing `bash` tool
              call only when the last user message holds the check's failure, and a final
              answer after its result (logged: `served`, `continues`, `has_failure`)

Fixed usage, in OpenAI terms (pi turns `prompt_tokens` into input = prompt - cached and
cacheRead = cached):

    answer     prompt_tokens 150 (50 cached), completion_tokens 12
    tool call  prompt_tokens 220 (100 cached), completion_tokens 20

`--log FILE` gets one JSON line per response, appended and flushed when the response has been
sent (for `hang`: when its headers have), so a test can sum what was served:

    {"model": "good", "kind": "answer", "status": 200,
     "usage": {"prompt_tokens": 150, "completion_tokens": 12, "cached_tokens": 50},
     "tokens": {"input": 100, "output": 12, "cache_read": 50, "cache_write": 0}}

A response that served no tokens (error500, hang) has `"usage": null` and all-zero `tokens`.
`prompt_chars` is the length of the last user message's text (0 for error500 and hang), so a
test can check that a long prompt arrived whole. Answers and tool calls also log the
conversation they were asked in: `assistant_turns` (earlier assistant messages), `user_texts`
(the first 200 characters of each user message), `system` (the last 300 characters of the
system message) and `tools` (the names of the tools offered), so a test can check that a
session was continued and what the agent was given.
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

KINDS = ("answer", "tool", "error500", "hang", "structured", "stubborn", "verify")
COMMAND = "echo hi > out.txt"
ANSWER_USAGE = {"prompt_tokens": 150, "completion_tokens": 12, "cached_tokens": 50}
TOOL_USAGE = {"prompt_tokens": 220, "completion_tokens": 20, "cached_tokens": 100}


def tokens_of(usage):
    """The usage as pi reports it (see the module doc)."""
    if usage is None:
        return {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    cached = usage["cached_tokens"]
    return {
        "input": usage["prompt_tokens"] - cached,
        "output": usage["completion_tokens"],
        "cache_read": cached,
        "cache_write": 0,
    }


def text_of(content):
    """The text of a message's content (a string or a list of parts)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content or ""


class Mock:
    def __init__(self, scenarios, default, log_path, answer, hang_seconds):
        self.scenarios = scenarios
        self.default = default
        self.log_path = log_path
        self.answer = answer
        self.hang_seconds = hang_seconds
        self.lock = threading.Lock()
        self.counter = 0

    def kind_for(self, model):
        return self.scenarios.get(model, self.default)

    def next_id(self):
        with self.lock:
            self.counter += 1
            return "chatcmpl-mock-%d" % self.counter

    def log(self, model, kind, status, usage, prompt_chars=0, conversation=None):
        if not self.log_path:
            return
        entry = {
            "model": model,
            "kind": kind,
            "status": status,
            "usage": usage,
            "tokens": tokens_of(usage),
            "prompt_chars": prompt_chars,
        }
        entry.update(conversation or {})
        line = json.dumps(entry)
        with self.lock:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()


def text_of(content):
    """The text of a message's content (a string or a list of parts)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def shape(messages, tools):
    """What a request's conversation looks like, for the log."""
    messages = [m for m in messages if isinstance(m, dict)]
    system = [text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    return {
        "assistant_turns": sum(1 for m in messages if m.get("role") == "assistant"),
        "user_texts": [text_of(m.get("content"))[:200] for m in messages if m.get("role") == "user"],
        "system": "".join(system)[-300:],
        "tools": [
            (t.get("function") or {}).get("name") or t.get("name")
            for t in tools or []
            if isinstance(t, dict)
        ],
    }


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
            if self.path.rstrip("/").endswith("/models"):
                models = [{"id": m, "object": "model"} for m in sorted(mock.scenarios)]
                self.send_json(200, {"object": "list", "data": models})
            else:
                self.send_json(404, {"error": {"message": "mock: not found"}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self.send_json(404, {"error": {"message": "mock: not found"}})
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_json(400, {"error": {"message": "mock: bad JSON"}})
                return
            model = str(body.get("model", ""))
            kind = mock.kind_for(model)
            if kind == "error500":
                self.send_json(
                    500,
                    {"error": {"message": "mock: internal server error", "type": "server_error"}},
                )
                mock.log(model, kind, 500, None)
                return
            if kind == "hang":
                self.start_stream()
                mock.log(model, kind, 200, None)
                deadline = time.monotonic() + mock.hang_seconds
                while time.monotonic() < deadline:
                    time.sleep(0.2)
                self.close_connection = True
                return
            messages = body.get("messages") or []
            has_tool_result = any(
                isinstance(m, dict) and m.get("role") == "tool" for m in messages
            )
            users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            content = users[-1].get("content") if users else ""
            if isinstance(content, list):
                content = "".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict)
                )
            prompt_chars = len(content or "")
            conversation = shape(messages, body.get("tools"))
            if kind == "tool" and not has_tool_result:
                self.stream_tool_call(model)
                mock.log(model, kind, 200, TOOL_USAGE, prompt_chars, conversation)
            elif kind in ("structured", "stubborn"):
                said = [
                    text_of(m.get("content"))
                    for m in messages
                    if isinstance(m, dict) and m.get("role") == "assistant"
                ]
                text, served, checks = repair.judge(said, content, kind == "stubborn")
                self.stream_answer(model, text)
                mock.log(
                    model, kind, 200, ANSWER_USAGE, prompt_chars,
                    dict(conversation or {}, served=served, **checks),
                )
            elif kind == "verify":
                said = [
                    text_of(m.get("content"))
                    for m in messages
                    if isinstance(m, dict) and m.get("role") == "assistant"
                ]
                last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
                served, text, checks = verify_fix.judge(said, content, last.get("role") == "tool")
                if text is None:
                    self.stream_tool_call(model, verify_fix.FIX)
                else:
                    self.stream_answer(model, text)
                mock.log(
                    model, kind, 200, ANSWER_USAGE if text else TOOL_USAGE, prompt_chars,
                    dict(conversation or {}, served=served, **checks),
                )
            else:
                self.stream_answer(model)
                mock.log(model, kind, 200, ANSWER_USAGE, prompt_chars, conversation)

        def start_stream(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True

        def event(self, obj):
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(("data: %s\n\n" % data).encode())
            self.wfile.flush()

        def chunk(self, cid, model, delta, finish=None):
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def usage_chunk(self, cid, model, usage):
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": usage["completion_tokens"],
                    "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
                    "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                },
            }

        def stream_answer(self, model, text=None):
            cid = mock.next_id()
            self.start_stream()
            self.event(self.chunk(cid, model, {"role": "assistant", "content": ""}))
            words = (mock.answer if text is None else text).split(" ")
            for i, word in enumerate(words):
                piece = word if i == 0 else " " + word
                self.event(self.chunk(cid, model, {"content": piece}))
            self.event(self.chunk(cid, model, {}, "stop"))
            self.event(self.usage_chunk(cid, model, ANSWER_USAGE))
            self.event("[DONE]")

        def stream_tool_call(self, model, command=None):
            cid = mock.next_id()
            self.start_stream()
            self.event(self.chunk(cid, model, {"role": "assistant", "content": None}))
            call = {
                "index": 0,
                "id": "call_mock_1",
                "type": "function",
                "function": {"name": "bash", "arguments": ""},
            }
            self.event(self.chunk(cid, model, {"tool_calls": [call]}))
            args = json.dumps({"command": command or COMMAND})
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                more = {"index": 0, "function": {"arguments": part}}
                self.event(self.chunk(cid, model, {"tool_calls": [more]}))
            self.event(self.chunk(cid, model, {}, "tool_calls"))
            self.event(self.usage_chunk(cid, model, TOOL_USAGE))
            self.event("[DONE]")

    return Handler


def main():
    global COMMAND
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[], metavar="ID=KIND")
    ap.add_argument("--scenario-file")
    ap.add_argument("--default", default="answer", choices=KINDS)
    ap.add_argument("--log")
    ap.add_argument("--answer", default="Hello from the mock model.")
    ap.add_argument("--hang-seconds", type=float, default=3600.0)
    ap.add_argument("--command", default=COMMAND,
                    help="the shell command of the tool call (`cargo xtask crash-matrix`)")
    args = ap.parse_args()
    COMMAND = args.command

    scenarios = {}
    if args.scenario_file:
        with open(args.scenario_file, encoding="utf-8") as f:
            scenarios.update(json.load(f))
    for spec in args.model:
        model, sep, kind = spec.partition("=")
        if not sep:
            ap.error("--model wants ID=KIND, got %r" % spec)
        scenarios[model] = kind
    for model, kind in scenarios.items():
        if kind not in KINDS:
            ap.error("model %r: unknown kind %r (expected one of %s)" % (model, kind, ", ".join(KINDS)))

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

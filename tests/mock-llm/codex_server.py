#!/usr/bin/env python3
"""A loopback mock of the OpenAI Responses API, as `codex exec` uses it.

It serves scripted scenarios so that the real Codex CLI can be observed without any model
provider: the server binds 127.0.0.1 only and never makes a request of its own.

    python3 codex_server.py --scenario ok --port 0 --port-file PORT --log requests.jsonl
    python3 codex_server.py --model-scenario good=ok --model-scenario bad=error500 --print-port

Codex is pointed at it through a custom model provider in `$CODEX_HOME/config.toml`:

    model_provider = "mock"
    [model_providers.mock]
    name = "mock"
    base_url = "http://127.0.0.1:PORT/v1"
    wire_api = "responses"
    env_key = "MOCK_API_KEY"

Endpoints: `POST /v1/responses` (streamed as server-sent events, or a JSON error) and
`GET /v1/models` (an empty model list). Every request is appended to the log as one JSON
line: time, method, path, the status answered, the model asked for, the step served with its
index, the usage its `response.completed` reports (null when none), and the request body.

Scenarios (a list of steps, one per `POST /v1/responses`; the last step repeats):

    ok            a plain answer, with usage in `response.completed`
    tool          a reasoning summary and a shell tool call (`exec_command`), then (next
                  request) an answer; usage on both responses
    tool_each     the same, chosen by each request's conversation rather than by count: the
                  tool call while its `input` holds no tool output, then the answer (several
                  conversations, and a conversation started again, on one model)
    patch         an `apply_patch` call that adds hello.txt (a custom tool call, offered only
                  for models codex knows, e.g. gpt-5.5), then an answer
    error500      HTTP 500 on every request
    ratelimit429  HTTP 429 on every request
    auth401       HTTP 401 (invalid API key) on every request
    quota429      HTTP 429 with `insufficient_quota` on every request
    ratelimit429_retry_after
                  one HTTP 429 with `retry-after: 1`, then the plain answer
    flaky500      one HTTP 500, then the plain answer
    stream_cut    headers, `response.created`, part of the answer, then the connection is
                  closed without `response.completed`
    failed        a stream that ends with `response.failed` (a server error in the stream)
    hang_once     headers and `response.created`, then nothing for two minutes (the first
                  request); then the plain answer (for a crash mid-attempt: the retry's request
                  answers)
    structured    a structured result wrong first and right after a repair round that
                  continues the conversation with the validation error (`repair.py`; the
                  log's `checks` says what it found)

The numbers: the first response of a run reports input 150 (50 cached), output 12 (4 of them
reasoning); the second reports input 250 (150 cached), output 20 (0 reasoning).
"""

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import repair

HELLO = "Hello from the mock LLM. Task complete."
DONE = "Done: I ran the command and wrote out.txt."
PATCHED = "Done: I added hello.txt."
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"
COMMAND = "echo hi > out.txt"

USAGE = [
    {
        "input_tokens": 150,
        "input_tokens_details": {"cached_tokens": 50},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 4},
        "total_tokens": 162,
    },
    {
        "input_tokens": 250,
        "input_tokens_details": {"cached_tokens": 150},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 270,
    },
]

ERRORS = {
    "500": (500, {"error": {"message": "mock: internal server error", "type": "server_error",
                            "param": None, "code": "server_error"}}),
    "429": (429, {"error": {"message": "mock: rate limit exceeded (429)",
                            "type": "rate_limit_exceeded", "param": None,
                            "code": "rate_limit_exceeded"}}),
    "429_after": (429, {"error": {"message": "mock: rate limit exceeded (429)",
                                  "type": "rate_limit_exceeded", "param": None,
                                  "code": "rate_limit_exceeded"}}),
    "401": (401, {"error": {"message": "Incorrect API key provided: mock-key.",
                            "type": "invalid_request_error", "param": None,
                            "code": "invalid_api_key"}}),
    "quota": (429, {"error": {"message": "You exceeded your current quota, please check your "
                                         "plan and billing details.",
                              "type": "insufficient_quota", "param": None,
                              "code": "insufficient_quota"}}),
}

SCENARIOS = {
    "ok": ["answer"],
    "tool": ["tool_call", "answer_after_tool"],
    "tool_each": ["tool_call", "answer_after_tool"],
    "patch": ["patch_call", "answer_after_patch"],
    "error500": ["500"],
    "ratelimit429": ["429"],
    "auth401": ["401"],
    "quota429": ["quota"],
    "ratelimit429_retry_after": ["429_after", "answer"],
    "flaky500": ["500", "answer"],
    "stream_cut": ["cut"],
    "failed": ["failed"],
    "hang_once": ["hang", "answer"],
    "structured": ["structured"],
}


class State:
    """What the server has done so far: requests are counted per scenario in use."""

    def __init__(self, scenario, per_model, log_path):
        self.scenario = scenario
        self.per_model = per_model
        self.requests = {}
        self.lock = threading.Lock()
        self.log_path = log_path

    def next_step(self, model):
        """The index of this request among its scenario's, and its step."""
        key = model if model in self.per_model else None
        steps = SCENARIOS[self.per_model.get(model, self.scenario)]
        with self.lock:
            i = self.requests.get(key, 0)
            self.requests[key] = i + 1
        return i, steps[min(i, len(steps) - 1)]

    def log(self, entry):
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def served_usage(step):
    """The usage a step's `response.completed` reports (None: no such event)."""
    if step in ("answer_after_tool", "answer_after_patch"):
        return USAGE[1]
    if step in ("answer", "tool_call", "patch_call", "structured"):
        return USAGE[0]
    return None


def shell_call(tools):
    """The name and JSON arguments of a shell tool call, in the shape the offered tool takes."""
    names = {}
    for t in tools or []:
        name = t.get("name") or (t.get("function") or {}).get("name")
        if name:
            names[name] = t
    if "exec_command" in names:
        return "exec_command", {"cmd": COMMAND}
    if "shell_command" in names:
        return "shell_command", {"command": COMMAND}
    if "shell" in names:
        return "shell", {"command": ["bash", "-lc", COMMAND]}
    # Unknown tool set: the most likely shape; the request log tells what was offered.
    return "exec_command", {"cmd": COMMAND}


def has_tool_output(body):
    """Whether a Responses request's `input` holds a tool call's output."""
    items = body.get("input") if isinstance(body, dict) else None
    return any(
        isinstance(item, dict) and str(item.get("type", "")).endswith("call_output")
        for item in items or []
    )


def structured_answer(body):
    """The structured scenario's answer to a Responses request (see `repair.py`): the texts
    of the assistant messages of its `input`, and of its last user message."""
    said, last_user = [], ""
    for item in body.get("input") or []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, list):
            text = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        else:
            text = str(content or "")
        if item.get("role") == "assistant":
            said.append(text)
        elif item.get("role") == "user":
            last_user = text
    return repair.judge(said, last_user)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-codex/1"

    def log_message(self, fmt, *args):  # quiet: everything goes to the JSON log
        pass

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            return {"_unparsed": raw[:2000].decode("latin-1")}

    def entry(self, status, body=None, step=None, index=None):
        return {
            "t": round(time.time(), 3),
            "method": self.command,
            "path": self.path,
            "status": status,
            "model": (body or {}).get("model") if isinstance(body, dict) else None,
            "step": step,
            "index": index,
            "usage": served_usage(step),
            "headers": {k: v for k, v in self.headers.items() if k.lower() != "authorization"},
            "authorization": bool(self.headers.get("Authorization")),
            "body": body,
        }

    def send_json(self, status, obj, headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def do_GET(self):
        state = self.server.state
        state.log(self.entry(200))
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self.send_json(200, {"object": "list", "data": [], "models": []})
        else:
            self.send_json(404, {"error": {"message": "mock: not found", "type": "not_found"}})

    def do_POST(self):
        state = self.server.state
        body = self.read_body()
        if not self.path.split("?")[0].rstrip("/").endswith("/responses"):
            state.log(self.entry(404, body))
            self.send_json(404, {"error": {"message": "mock: not found", "type": "not_found"}})
            return
        model = body.get("model") if isinstance(body, dict) else None
        index, step = state.next_step(model)
        if state.per_model.get(model, state.scenario) == "tool_each":
            step = "answer_after_tool" if has_tool_output(body) else "tool_call"
        if step in ERRORS:
            status, obj = ERRORS[step]
            state.log(self.entry(status, body, step, index))
            headers = [("retry-after", "1")] if step.endswith("_after") else []
            self.send_json(status, obj, headers)
            return
        text = None
        entry = self.entry(200, body, step, index)
        if step == "structured":
            text, served, checks = structured_answer(body or {})
            entry = dict(entry, served=served, checks=checks)
        state.log(entry)
        self.stream(step, body or {}, index, text)

    # -- server-sent events ------------------------------------------------------------------

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def event(self, obj):
        data = "event: {}\ndata: {}\n\n".format(obj["type"], json.dumps(obj))
        self.wfile.write(data.encode())
        self.wfile.flush()

    def stream(self, step, body, index, text=None):
        rid = "resp_mock_{}".format(index + 1)
        usage = served_usage(step)
        created = {"id": rid, "object": "response", "status": "in_progress",
                   "model": body.get("model", "mock-model")}
        try:
            self.start_stream()
            self.event({"type": "response.created", "response": created})
            if step in ("answer", "answer_after_tool", "answer_after_patch", "cut", "structured"):
                if text is None:
                    text = {"answer_after_tool": DONE, "answer_after_patch": PATCHED}.get(step, HELLO)
                mid = "msg_mock_{}".format(index + 1)
                item = {"type": "message", "role": "assistant", "id": mid, "status": "in_progress",
                        "content": []}
                self.event({"type": "response.output_item.added", "output_index": 0, "item": item})
                words = text.split(" ")
                for i, w in enumerate(words):
                    delta = w if i == 0 else " " + w
                    self.event({"type": "response.output_text.delta", "item_id": mid,
                                "output_index": 0, "content_index": 0, "delta": delta})
                    if step == "cut" and i == 2:
                        time.sleep(0.2)
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                done = dict(item, status="completed",
                            content=[{"type": "output_text", "text": text, "annotations": []}])
                self.event({"type": "response.output_item.done", "output_index": 0, "item": done})
            elif step == "tool_call":
                rs = {"type": "reasoning", "id": "rs_mock_1", "summary": [
                    {"type": "summary_text", "text": "**Planning** I will run one shell command."}]}
                self.event({"type": "response.output_item.done", "output_index": 0, "item": rs})
                name, args = shell_call(body.get("tools"))
                fc = {"type": "function_call", "id": "fc_mock_1", "call_id": "call_mock_1",
                      "name": name, "arguments": json.dumps(args), "status": "completed"}
                self.event({"type": "response.output_item.added", "output_index": 0,
                            "item": dict(fc, arguments="", status="in_progress")})
                self.event({"type": "response.function_call_arguments.delta",
                            "item_id": "fc_mock_1", "output_index": 0,
                            "delta": json.dumps(args)})
                self.event({"type": "response.output_item.done", "output_index": 0, "item": fc})
            elif step == "patch_call":
                ct = {"type": "custom_tool_call", "id": "ctc_mock_1", "call_id": "call_mock_1",
                      "name": "apply_patch", "input": PATCH, "status": "completed"}
                self.event({"type": "response.output_item.added", "output_index": 0,
                            "item": dict(ct, input="", status="in_progress")})
                self.event({"type": "response.custom_tool_call_input.delta",
                            "item_id": "ctc_mock_1", "output_index": 0, "delta": PATCH})
                self.event({"type": "response.output_item.done", "output_index": 0, "item": ct})
            elif step == "hang":
                self.wfile.flush()
                time.sleep(120)
                return
            elif step == "failed":
                self.event({"type": "response.failed", "response": dict(
                    created, status="failed",
                    error={"code": "server_error", "message": "mock: the model failed in the stream"},
                    usage=None)})
                return
            self.event({"type": "response.completed",
                        "response": dict(created, status="completed", usage=usage)})
        except (BrokenPipeError, ConnectionResetError):
            pass


def main():
    global COMMAND
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="ok",
                   help="the scenario of requests whose model has none of its own")
    p.add_argument("--model-scenario", action="append", default=[], metavar="MODEL=SCENARIO",
                   help="a scenario for the requests for one model (counted apart)")
    p.add_argument("--print-port", action="store_true",
                   help="print the port on stdout, alone on the first line")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--log")
    p.add_argument("--command", default=COMMAND,
                   help="the shell command of the tool call (`cargo xtask crash-matrix`)")
    a = p.parse_args()
    COMMAND = a.command
    per_model = {}
    for spec in a.model_scenario:
        model, _, scenario = spec.partition("=")
        if scenario not in SCENARIOS:
            p.error("unknown scenario in --model-scenario {}".format(spec))
        per_model[model] = scenario
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.state = State(a.scenario, per_model, a.log)
    port = server.server_address[1]
    if a.port_file:
        with open(a.port_file + ".tmp", "w", encoding="utf-8") as f:
            f.write(str(port))
        import os
        os.replace(a.port_file + ".tmp", a.port_file)
    if a.print_port:
        print(port, flush=True)
    print("mock codex server on 127.0.0.1:{} scenario {}".format(port, a.scenario),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

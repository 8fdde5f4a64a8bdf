#!/usr/bin/env python3
"""A fake pi / Claude Code for sortie's tests and demos: it replays a stream the real CLI printed.

The samples are the recorded streams in crates/protocol/tests/fixtures/agents/ (pi `--mode json`:
ok, tool, error500, ...; Claude Code `stream-json`: claude_ok, claude_tool, ...), with the exit
codes in exit_codes.tsv. No API key, no network: nothing here contacts a model provider.

Which sample, per attempt and per model (sortie passes {attempt} and {model} through argv):
  --sample NAME                the sample by default (default: ok)
  --attempt N --samples 1:error500,2:ok
                               attempt N replays the sample listed for it (else the default)
  --model M --model-sample bad:error500
                               any attempt on model M replays that sample (wins over --samples)
  --fixtures DIR               where the samples are (default: the repository's fixtures)

How it behaves:
  --exit CODE                  exit with CODE instead of the recorded one
  --cut-after N                print only the first N lines of the sample, then exit (a stream
                               cut short: the agent crashed or was killed)
  --cut-attempts N             with --cut-after: only attempts 1..N are cut (default: all)
  --error-text TEXT            (pi) the failed call's errorMessage says TEXT instead (e.g. a 401,
                               to make a model error of the error500 samples)
  --stall-after N              print N lines, then go silent forever
  --stall-attempts N           with --stall-after: only attempts 1..N stall (default: all)
  --delay SECONDS              wait this long before each line
  --hold                       after the whole sample, stay silent for ever (an agent still
                               working after its last usage line: a budget or a timeout stops it)
  --turns N                    (pi) N extra turns before the sample's final answer: each is an
                               assistant message (a line of text and a tool call) with the usage
                               of the sample's last assistant message (to breach a budget)
  --turn-delay SECONDS         wait this long before each extra turn
  --tool NAME                  the tool the extra turns call (default: read; bash, write and
                               edit are side effects)
  --log FILE                   append one JSON line per thing it saw: its argv, each command
                               read on stdin, the session it continued
  --rpc                        pi's RPC mode (`pi --mode rpc`): wait for a {"type":"prompt"}
                               command on stdin, answer it with a response line, stream the
                               sample; a {"type":"steer"} command between extra turns makes it
                               wrap up (one final answer, then the end of the run) unless
                               --ignore-steer; it exits once stdin is closed
  --ignore-steer               keep taking turns after a steer command
  --session-dir DIR            (as pi) keep the session in DIR: a session file is written
  --session FILE               (as pi) continue the session in FILE (logged, appended to)
  --no-session, --mode M, --offline, ...  accepted and ignored, as pi's flags
"""
import argparse
import json
import os
import select
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURES = os.path.join(HERE, "..", "..", "crates", "protocol", "tests", "fixtures", "agents")


def log(path, entry):
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def recorded_exit(fixtures, name):
    try:
        with open(os.path.join(fixtures, "exit_codes.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if parts and parts[0] == name:
                    for p in parts[1:]:
                        if p.startswith("exit="):
                            return int(p[len("exit="):])
    except OSError:
        pass
    return 0


def pick_sample(a):
    if a.model_sample:
        model, name = a.model_sample.split(":", 1)
        if a.model == model:
            return name
    for item in filter(None, a.samples.split(",")):
        n, name = item.split(":", 1)
        if int(n) == a.attempt:
            return name
    return a.sample


class Out:
    def __init__(self, a):
        self.a = a
        self.count = 0
        self.stall = a.stall_after >= 0 and (a.stall_attempts <= 0 or a.attempt <= a.stall_attempts)
        self.cut = a.cut_after >= 0 and (a.cut_attempts <= 0 or a.attempt <= a.cut_attempts)

    def line(self, text):
        if self.cut and self.count >= self.a.cut_after:
            return False
        if self.stall and self.count >= self.a.stall_after:
            while True:
                time.sleep(3600)
        if self.a.delay:
            time.sleep(self.a.delay)
        sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
        self.count += 1
        return True


class Stdin:
    """Commands on stdin, in RPC mode."""

    def __init__(self, a):
        self.a = a
        self.buf = b""
        self.eof = False

    def _fill(self, timeout):
        if self.eof:
            return
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], timeout)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 65536)
            if chunk:
                self.buf += chunk
            else:
                self.eof = True

    def command(self, timeout):
        """The next command, waiting at most `timeout` seconds (None: for ever)."""
        deadline = None if timeout is None else time.time() + timeout
        while b"\n" not in self.buf and not self.eof:
            left = None if deadline is None else max(0.0, deadline - time.time())
            self._fill(left)
            if deadline is not None and time.time() >= deadline:
                break
        if b"\n" not in self.buf:
            return None
        raw, self.buf = self.buf.split(b"\n", 1)
        try:
            cmd = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            cmd = {"type": "unparsable", "raw": raw.decode("utf-8", "replace")}
        log(self.a.log, {"stdin": cmd})
        return cmd

    def wait_eof(self):
        while not self.eof:
            self._fill(None)
            while b"\n" in self.buf:
                self.command(0)


def last_assistant_end(lines):
    for text in reversed(lines):
        try:
            e = json.loads(text)
        except ValueError:
            continue
        m = e.get("message") or {}
        if e.get("type") == "message_end" and m.get("role") == "assistant":
            return e
    return None


def tool_turn(end, k, tool):
    """The lines of one extra pi turn: an assistant message calling `tool`, and its result."""
    msg = dict(end["message"])
    call_id = f"call_extra_{k}"
    msg["content"] = [
        {"type": "text", "text": f"step {k + 1}: using {tool}"},
        {"type": "toolCall", "id": call_id, "name": tool, "arguments": {"path": "README.md", "command": "true"}},
    ]
    msg["stopReason"] = "toolUse"
    start = dict(msg)
    start["content"] = []
    result = {"role": "toolResult", "toolCallId": call_id, "toolName": tool, "content": [{"type": "text", "text": "ok"}], "isError": False, "timestamp": 0}
    return [
        json.dumps({"type": "turn_start"}),
        json.dumps({"type": "message_start", "message": start}),
        json.dumps({"type": "message_end", "message": msg}),
        json.dumps({"type": "tool_execution_start", "toolCallId": call_id, "toolName": tool, "args": {"path": "README.md", "command": "true"}}),
        json.dumps({"type": "tool_execution_end", "toolCallId": call_id, "toolName": tool, "result": {"content": [{"type": "text", "text": "ok"}]}, "isError": False}),
        json.dumps({"type": "message_start", "message": result}),
        json.dumps({"type": "message_end", "message": result}),
        json.dumps({"type": "turn_end", "message": msg, "toolResults": [result]}),
    ]


def wrap_up_lines(end):
    """A final answer given after a steer command, then the end of the run."""
    msg = dict(end["message"])
    msg["content"] = [{"type": "text", "text": "wrapped up: here is what I have so far"}]
    msg["stopReason"] = "stop"
    return [
        json.dumps({"type": "turn_start"}),
        json.dumps({"type": "message_start", "message": dict(msg, content=[])}),
        json.dumps({"type": "message_end", "message": msg}),
        json.dumps({"type": "turn_end", "message": msg, "toolResults": []}),
        json.dumps({"type": "agent_end", "messages": [msg]}),
    ]


def with_error_text(text, error):
    try:
        e = json.loads(text)
    except ValueError:
        return text
    m = e.get("message") or {}
    if m.get("role") == "assistant" and m.get("stopReason") == "error":
        m["errorMessage"] = error
        return json.dumps(e)
    if e.get("type") == "auto_retry_end" and "finalError" in e:
        e["finalError"] = error
        return json.dumps(e)
    return text


def sessions(a):
    """pi's session handling: continue --session FILE, else write one under --session-dir."""
    header = json.dumps({"type": "session", "version": 3, "id": str(uuid.uuid4()), "cwd": os.getcwd()})
    if a.session:
        log(a.log, {"continued": a.session})
        with open(a.session, "a") as f:
            f.write(json.dumps({"type": "continued", "attempt": a.attempt}) + "\n")
    elif a.session_dir:
        os.makedirs(a.session_dir, exist_ok=True)
        path = os.path.join(a.session_dir, f"{int(time.time() * 1000)}_{uuid.uuid4()}.jsonl")
        with open(path, "w") as f:
            f.write(header + "\n")
        log(a.log, {"session_file": path})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", default="ok")
    p.add_argument("--samples", default="")
    p.add_argument("--model", default="")
    p.add_argument("--model-sample", default="")
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--fixtures", default=DEFAULT_FIXTURES)
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--cut-after", type=int, default=-1)
    p.add_argument("--cut-attempts", type=int, default=0)
    p.add_argument("--error-text", default="")
    p.add_argument("--stall-after", type=int, default=-1)
    p.add_argument("--stall-attempts", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--turns", type=int, default=0)
    p.add_argument("--turn-delay", type=float, default=0.0)
    p.add_argument("--tool", default="read")
    p.add_argument("--log", default="")
    p.add_argument("--rpc", action="store_true")
    p.add_argument("--ignore-steer", action="store_true")
    p.add_argument("--session-dir", default="")
    p.add_argument("--session", default="")
    p.add_argument("--no-session", action="store_true")
    p.add_argument("--mode", default="")
    for flag in ("--offline", "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes"):
        p.add_argument(flag, action="store_true")
    p.add_argument("prompt", nargs="*")
    a = p.parse_args()
    log(a.log, {"argv": sys.argv[1:], "attempt": a.attempt, "model": a.model})
    sessions(a)

    name = pick_sample(a)
    with open(os.path.join(a.fixtures, name + ".jsonl")) as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    if a.error_text:
        lines = [with_error_text(l, a.error_text) for l in lines]
    code = recorded_exit(a.fixtures, name) if a.exit is None else a.exit
    out = Out(a)
    stdin = Stdin(a) if a.rpc else None

    if stdin is not None:
        cmd = stdin.command(None)
        if cmd is None or cmd.get("type") != "prompt":
            out.line(json.dumps({"type": "response", "command": (cmd or {}).get("type", "?"), "success": False, "error": "expected a prompt"}))
            return 1
        out.line(json.dumps({"type": "response", "command": "prompt", "success": True}))

    end = last_assistant_end(lines)
    # Extra turns go right before the final answer's turn (its last turn_start).
    cut = len(lines)
    if a.turns > 0 and end is not None:
        starts = [i for i, l in enumerate(lines) if l.startswith('{"type":"turn_start"')]
        cut = starts[-1] if starts else len(lines)
    for text in lines[:cut]:
        if not out.line(text):
            return code
    steered = False
    for k in range(a.turns if end is not None else 0):
        if a.turn_delay:
            time.sleep(a.turn_delay)
        if stdin is not None:
            cmd = stdin.command(0)
            while cmd is not None:
                if cmd.get("type") == "steer":
                    out.line(json.dumps({"type": "response", "command": "steer", "success": True}))
                    steered = True
                cmd = stdin.command(0)
        if steered and not a.ignore_steer:
            for text in wrap_up_lines(end):
                if not out.line(text):
                    return code
            stdin.wait_eof()
            return 0
        for text in tool_turn(end, k, a.tool):
            if not out.line(text):
                return code
    for text in lines[cut:]:
        if not out.line(text):
            return code
    if stdin is not None:
        stdin.wait_eof()
        return 0
    while a.hold:
        time.sleep(3600)
    return code


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A fake coding agent for sortie's demo and tests: it needs no API key and no network.

It speaks sortie's `plain` protocol: stdout is the answer, exit 0 is success, and two small
extensions let it act like a real agent:
  SORTIE_USAGE {"input":..,"output":..,"cost_usd":..,"turns":..}   cumulative usage so far
  SORTIE_ERROR <error|model_error> <message>                     a provider error

Behaviour is chosen with flags (sortie passes {model} and {attempt} through the argv template):
  --model M --attempt N        what sortie says this attempt is
  --answer TEXT                the final answer (default: "done")
  --answer-prompt              answer with the prompt it was given (the positional arguments,
                               joined by spaces), to show what sortie rendered
  --quiet                      print no "working on ..." progress lines: stdout is the answer
  --usage IN,OUT,COST          usage to report (cost in USD); unique values make ledgers checkable
  --usage-per-attempt          multiply IN, OUT and COST by the attempt number, so that every
                               attempt of a task reports its own usage
  --usage-log FILE             append each usage report, as a JSON line {"attempt":N,"usage":..},
                               to FILE before printing it (what the agent billed, to compare
                               with sortie's ledger); a stop signal (TERM, INT, HUP) waits
                               until both are done, so the log never holds a report that
                               never reached stdout
  --turns N                    report usage over N turns, one SORTIE_USAGE line per turn
  --sleep SECONDS              work this long before answering (split across turns)
  --sleep-attempts N           only attempts 1..N sleep (default: every attempt)
  --exit CODE                  exit with CODE after answering (a real task failure when != 0)
  --fail-attempts N:KIND       attempts 1..N fail with KIND (error = transient 5xx/429,
                               model_error = quota/auth, crash = exit 1 with no error line)
  --fail-model M:KIND          any attempt on model M fails with KIND
                               (rate_limit = a 429 that asks to retry after --retry-after)
  --retry-after WAIT           the wait a rate_limit failure asks for (default 200ms)
  --stall-attempts N           attempts 1..N print one line, then go silent forever
  --stall-at-turn T            with --stall-attempts: go silent after turn T instead (default 1;
                               0: before any output)
  --hang                       go silent forever before any output
  --ignore-term                ignore SIGTERM (sortie must SIGKILL after the grace)
  --grandchild                 fork a grandchild that sleeps forever in the same process group
  --counter FILE               append one line to FILE when the answer is given (side effect)
  --write FILE:TEXT            append TEXT and a newline to FILE (relative to the cwd) before
                               answering, even when exiting nonzero (repeatable); --cat FILE
                               prints FILE's content (or "(missing FILE)") as a progress line
  --write-first FILE:TEXT      like --write, but before working (sleeping), on every attempt
  --garbage N                  print N bytes of binary garbage first
  --big-line N                 print one line of N bytes first
  --stderr TEXT                write TEXT to stderr
  --hold-report PATH           at its first usage report, between logging it and printing it,
                               write its pid to PATH.held and wait until PATH.go exists (a
                               test's deterministic window for a stop in the middle of a report)
"""
import argparse
import json
import os
import signal
import sys
import time

# The signals that stop an agent and that it may hold off for a moment.
STOPS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="")
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--answer", default="done")
    p.add_argument("--answer-prompt", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--usage", default="")
    p.add_argument("--usage-per-attempt", action="store_true")
    p.add_argument("--usage-log", default="")
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--sleep-attempts", type=int, default=0)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--fail-attempts", default="")
    p.add_argument("--fail-model", default="")
    p.add_argument("--stall-attempts", type=int, default=0)
    p.add_argument("--stall-at-turn", type=int, default=1)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--grandchild", action="store_true")
    p.add_argument("--counter", default="")
    p.add_argument("--write", action="append", default=[])
    p.add_argument("--cat", action="append", default=[])
    p.add_argument("--write-first", action="append", default=[])
    p.add_argument("--garbage", type=int, default=0)
    p.add_argument("--big-line", type=int, default=0)
    p.add_argument("--hold-report", default="")
    p.add_argument("--stderr", default="")
    p.add_argument("--retry-after", default="200ms")
    p.add_argument("prompt", nargs="*")
    a = p.parse_args()
    out = sys.stdout

    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.grandchild and os.fork() == 0:
        while True:
            time.sleep(3600)
    if a.stderr:
        sys.stderr.write(a.stderr + "\n")
        sys.stderr.flush()
    if a.garbage:
        sys.stdout.buffer.write(bytes((i * 37 + 11) % 256 for i in range(a.garbage)))
        sys.stdout.buffer.write(b"\n")
        sys.stdout.buffer.flush()
    if a.big_line:
        out.write("x" * a.big_line + "\n")
        out.flush()
    if a.hang:
        while True:
            time.sleep(3600)

    for spec in a.write_first:
        name, text = spec.split(":", 1)
        with open(name, "a") as f:
            f.write(text + "\n")

    fail = None
    if a.fail_attempts:
        n, kind = a.fail_attempts.split(":", 1)
        if a.attempt <= int(n):
            fail = kind
    if a.fail_model:
        m, kind = a.fail_model.split(":", 1)
        if a.model == m:
            fail = kind

    inp, outp, cost = 0, 0, 0.0
    if a.usage:
        parts = a.usage.split(",")
        inp, outp = int(parts[0]), int(parts[1])
        cost = float(parts[2]) if len(parts) > 2 else 0.0
        if a.usage_per_attempt:
            inp, outp, cost = inp * a.attempt, outp * a.attempt, cost * a.attempt
    turns = max(a.turns, 1)
    if a.attempt <= a.stall_attempts and a.stall_at_turn <= 0:
        while True:
            time.sleep(3600)
    sleep = a.sleep if a.sleep_attempts <= 0 or a.attempt <= a.sleep_attempts else 0.0
    for t in range(1, turns + 1):
        time.sleep(sleep / turns)
        # A stop lands before a report or after it, never between its logging and its printing.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        if a.usage:
            usage = {
                "input": inp * t // turns,
                "output": outp * t // turns,
                "cost_usd": round(cost * t / turns, 9),
                "turns": t,
            }
            if a.usage_log:
                with open(a.usage_log, "a") as f:
                    f.write(json.dumps({"attempt": a.attempt, "usage": usage}) + "\n")
            if t == 1 and a.hold_report:
                hold(a.hold_report)
            out.write("SORTIE_USAGE " + json.dumps(usage) + "\n")
        if not a.quiet:
            out.write(f"working on attempt {a.attempt} turn {t}\n")
        out.flush()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if a.attempt <= a.stall_attempts and t >= min(a.stall_at_turn, turns):
            while True:
                time.sleep(3600)

    if fail == "crash":
        sys.stderr.write("fake agent crashed\n")
        return 1
    if fail == "rate_limit":
        out.write(f"SORTIE_ERROR error 429 rate limit exceeded; try again in {a.retry_after}\n")
        out.flush()
        return 1
    if fail in ("error", "model_error"):
        msg = {
            "error": "503 Service Unavailable: upstream overloaded",
            "model_error": f"401 invalid api key or quota exceeded for model {a.model}",
        }[fail]
        out.write(f"SORTIE_ERROR {fail} {msg}\n")
        out.flush()
        return 1
    for name in a.cat:
        try:
            with open(name) as f:
                text = f.read().strip().replace("\n", " | ")
        except OSError:
            text = f"(missing {name})"
        out.write(f"cat {name}: {text}\n")
        out.flush()
    for spec in a.write:
        name, text = spec.split(":", 1)
        with open(name, "a") as f:
            f.write(text + "\n")
    if a.counter:
        with open(a.counter, "a") as f:
            f.write(f"attempt {a.attempt} model {a.model}\n")
    answer = " ".join(a.prompt) if a.answer_prompt else a.answer
    out.write(answer + "\n")
    out.flush()
    return a.exit


def hold(path):
    """Says its pid in PATH.held, then waits until PATH.go exists (see --hold-report)."""
    with open(path + ".held.tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(path + ".held.tmp", path + ".held")
    while not os.path.exists(path + ".go"):
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())

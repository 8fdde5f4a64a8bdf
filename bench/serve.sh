#!/usr/bin/env bash
# `sortie serve`'s benchmark (#35): a finished run of N tasks of `true` (100,000 by default),
# then its run page in headless Chromium (crates/cli/examples/serve_bench.rs, over the DevTools
# protocol): the time from navigation to the page interactive (the task table drawn, the thread
# free, a filter answered), from the browser's Performance API: cold (a new server, the page
# opened the moment it printed its URL; again SETTLE seconds after it started), then warm
# (median of ROUNDS); then the server's CPU time per minute while idle with the page open (IDLE
# seconds). Chromium comes from apt-get when missing. `cargo xtask bench serve` runs this.
#   bash bench/serve.sh              (N=100000, ROUNDS=3, SETTLE=5, IDLE=60)
#   N=10000 IDLE=20 bash bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}
ROUNDS=${ROUNDS:-3}
IDLE=${IDLE:-60}
SETTLE=${SETTLE:-5}

if ! command -v chromium >/dev/null 2>&1; then
  echo "serve.sh: installing chromium with apt-get" >&2
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get install -y -q chromium >/dev/null
fi

cargo build --release -q -p sortie-cli --bins --example serve_bench
SORTIE=$PWD/target/release/sortie
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/tasks.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"label": f"task-{i}", "command": ["true"]}) + "\n")
PY
echo "serve.sh: running $N tasks of true (concurrency 64) for the finished run" >&2
"$SORTIE" --state-dir "$work/state" --quiet run "$work/tasks.jsonl" --run-id bench --concurrency 64 >/dev/null
echo "serve.sh: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
target/release/examples/serve_bench --sortie "$SORTIE" --state-dir "$work/state" --run bench \
  --rounds "$ROUNDS" --settle "$SETTLE" --idle "$IDLE"

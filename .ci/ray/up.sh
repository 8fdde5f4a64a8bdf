#!/usr/bin/env bash
# Starts a real local Ray head node on this machine for sortie's Ray tests: installs
# `ray[default]` from PyPI when `python3 -c "import ray"` fails, starts the head with its job API
# on http://127.0.0.1:8265, waits until `GET /api/version` answers, and writes the address to
# $SORTIE_RAY_HOME/env. `.ci/ray/down.sh` stops it. Running it again while its head is up is a
# no-op.
#
# Environment:
#   SORTIE_RAY_HOME   where the env file, the logs and Ray's temp dir live
#                     (default /var/tmp/sortie-ray)
#   SORTIE_RAY_CPUS   CPUs the head advertises (default 4)
#
# Clients find the head through SORTIE_RAY_ADDRESS; the script prints that line last
# (`eval "$(.ci/ray/up.sh | tail -1)"`) and writes it to $SORTIE_RAY_HOME/env.
set -euo pipefail

HOME_DIR="${SORTIE_RAY_HOME:-/var/tmp/sortie-ray}"
CPUS="${SORTIE_RAY_CPUS:-4}"
PORT=6380
DASH=8265
ADDRESS="http://127.0.0.1:$DASH"
LINE="export SORTIE_RAY_ADDRESS=$ADDRESS"

say() { echo "ray-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
now() { date +%s.%N; }
T0=$(now)
elapsed() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
answers() { curl -fsS --max-time 3 "$ADDRESS/api/version" >/dev/null 2>&1; }

mkdir -p "$HOME_DIR"
if [[ -f "$HOME_DIR/started" ]] && answers; then
    say "already running ($ADDRESS)"
    echo "$LINE" >"$HOME_DIR/env"
    echo "$LINE"
    exit 0
fi
if answers; then
    die "$ADDRESS answers but this script did not start it"
fi

# --- package ---------------------------------------------------------------------------------
if ! python3 -c "import ray" >/dev/null 2>&1; then
    say "installing ray[default] from PyPI"
    python3 -m pip install -q "ray[default]" >"$HOME_DIR/pip.log" 2>&1 \
        || die "pip install failed (see $HOME_DIR/pip.log)"
    say "ray installed at $(elapsed) s"
fi
RAY=$(python3 -c 'import shutil, sys, os; p = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray"); print(p)')
[[ -x "$RAY" ]] || die "the ray command is missing ($RAY)"

# --- head ------------------------------------------------------------------------------------
T1=$(now)
"$RAY" start --head --port="$PORT" --dashboard-host=127.0.0.1 --dashboard-port="$DASH" \
    --num-cpus="$CPUS" --include-dashboard=true --temp-dir="$HOME_DIR/tmp" \
    --disable-usage-stats >"$HOME_DIR/start.log" 2>&1 \
    || die "ray start failed (see $HOME_DIR/start.log)"
echo "$RAY" >"$HOME_DIR/started"
for ((i = 0; i < 300; i++)); do
    answers && break
    sleep 0.2
done
answers || die "the job API at $ADDRESS did not answer within 60 s (see $HOME_DIR/start.log)"
say "head up at $(elapsed) s (start took $(awk -v a="$T1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s, $CPUS CPUs, $ADDRESS)"
echo "$LINE" >"$HOME_DIR/env"
echo "$LINE"

#!/usr/bin/env bash
# Stops the Ray head node .ci/ray/up.sh started (`ray stop --force` of the ray command it
# recorded, which ends the head's jobs with it). `ray stop` knows no single head: it stops every
# Ray process of this machine, so it runs only when up.sh recorded a start here. Safe to run
# twice, and when nothing was started.
set -uo pipefail

HOME_DIR="${SORTIE_RAY_HOME:-/var/tmp/sortie-ray}"
say() { echo "ray-down: $*" >&2; }
if [[ ! -f "$HOME_DIR/started" ]]; then
    say "nothing recorded in $HOME_DIR/started: nothing to stop"
    exit 0
fi
RAY=$(cat "$HOME_DIR/started")
"$RAY" stop --force >"$HOME_DIR/stop.log" 2>&1 || say "ray stop failed (see $HOME_DIR/stop.log)"
rm -f "$HOME_DIR/started" "$HOME_DIR/env"
say "stopped"

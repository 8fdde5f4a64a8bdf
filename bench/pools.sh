#!/usr/bin/env bash
# Benchmark (not a test): shared rate limits (issue 14). A loopback mock provider
# (bench/mock_provider.py, 127.0.0.1 only) serves CAP requests at once (each held HOLD s) and
# answers 429 with a retry-after of RETRY s above that. N tasks, each one request through curl
# (a plain command; `transient_on = ["429"]`, so sortie reads the 429 and its retry-after from
# the body), run at concurrency 64, in ROUNDS rounds, each round both ways:
#   fixed:    [pools.mock] concurrency = 64, adaptive = false (a cap, no back-off)
#   adaptive: [pools.mock] concurrency = 64 (AIMD on 429s, the default)
# For each run: wall time, the 429s the provider sent, the share of its capacity used (served
# request-seconds / (CAP × the time from the first request to the last answer)), and the tasks
# that did not complete. Prints a table, and last a `pools key=value ...` line.
#
# Usage: bench/pools.sh [SORTIE_BIN]   (N=200 CAP=16 HOLD=2 RETRY=1 ROUNDS=3 by default)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SORTIE=$(realpath "${1:-$ROOT/target/release/sortie}")
N=${N:-200}
CAP=${CAP:-16}
HOLD=${HOLD:-2}
RETRY=${RETRY:-1}
ROUNDS=${ROUNDS:-3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sortie-bench-pools.XXXXXX")
trap 'kill "$MOCK" 2>/dev/null || true; rm -rf "$WORK"' EXIT

coproc MOCKP { exec python3 "$ROOT/bench/mock_provider.py" "$CAP" "$HOLD" "$RETRY"; }
MOCK=$MOCKP_PID
read -r PORT <&"${MOCKP[0]}"
URL="http://127.0.0.1:$PORT/v1/messages"

batch() { # MODE: writes the batch of MODE (fixed | adaptive)
    local adaptive=true
    [[ $1 == fixed ]] && adaptive=false
    {
        echo "concurrency = 64"
        echo
        echo "[pools.mock]"
        echo "concurrency = 64"
        echo "adaptive = $adaptive"
        echo
        echo "[defaults]"
        echo "pool = \"mock\""
        echo "supervise = false"
        echo "transient_on = [\"429\"]"
        echo "command = [\"curl\", \"-sS\", \"--fail-with-body\", \"-X\", \"POST\", \"$URL\"]"
        for i in $(seq "$N"); do
            echo
            echo "[[tasks]]"
            echo "label = \"t$i\""
        done
    } >"$WORK/$1.toml"
}
batch fixed
batch adaptive

stat() { curl -sS "http://127.0.0.1:$PORT/stats"; }
field() { python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }

declare -A total_429 total_used total_failed total_s
printf '%-8s %-5s %8s %8s %10s %8s\n' mode round wall_s 429s capacity not_ok
for r in $(seq "$ROUNDS"); do
    for mode in fixed adaptive; do
        curl -sS -X POST "http://127.0.0.1:$PORT/reset" >/dev/null
        start=$(date +%s.%N)
        "$SORTIE" --quiet --state-dir "$WORK/state" run "$WORK/$mode.toml" \
            --run-id "$mode-$r" >/dev/null 2>&1 || true
        end=$(date +%s.%N)
        s=$(stat)
        refused=$(field 's["refused"]' <<<"$s")
        used=$(field '100 * s["busy_s"] / (s["capacity"] * (s["last"] - s["first"])) if s["last"] else 0' <<<"$s")
        notok=$("$SORTIE" --json --state-dir "$WORK/state" status "$mode-$r" |
            field 'sum(n for k, n in s["counts"].items() if k != "completed")')
        wall=$(python3 -c "print(f'{$end - $start:.1f}')")
        printf '%-8s %-5s %8s %8s %9.1f%% %8s\n' "$mode" "$r" "$wall" "$refused" "$used" "$notok"
        total_429[$mode]=$(( ${total_429[$mode]:-0} + refused ))
        total_failed[$mode]=$(( ${total_failed[$mode]:-0} + notok ))
        total_used[$mode]=$(python3 -c "print(${total_used[$mode]:-0} + $used)")
        total_s[$mode]=$(python3 -c "print(${total_s[$mode]:-0} + $wall)")
    done
done
avg() { python3 -c "print(f'{$1 / $ROUNDS:.1f}')"; }
ratio=$(python3 -c "f, a = ${total_429[fixed]}, ${total_429[adaptive]}; print(f'{f / max(a, 1):.1f}')")
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "pools tasks=$N capacity=$CAP hold_s=$HOLD retry_after_s=$RETRY rounds=$ROUNDS" \
    "fixed_429=$(avg "${total_429[fixed]}") adaptive_429=$(avg "${total_429[adaptive]}")" \
    "ratio_429=$ratio fixed_used_pct=$(avg "${total_used[fixed]}")" \
    "adaptive_used_pct=$(avg "${total_used[adaptive]}")" \
    "fixed_not_completed=${total_failed[fixed]} adaptive_not_completed=${total_failed[adaptive]}" \
    "fixed_s=$(avg "${total_s[fixed]}") adaptive_s=$(avg "${total_s[adaptive]}") load=\"$load\""

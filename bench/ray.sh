#!/usr/bin/env bash
# Benchmark (not a test, #36): N jobs of `true` through the same Ray head node, in the same run,
# ROUNDS interleaved rounds:
#   sortie (executor = "ray", concurrency P)
#   xargs -P P of a shell job per task that does what `ray job submit` does over HTTP with curl:
#     POST /api/jobs/, then GET /api/jobs/{id} every 0.3 s (sortie's shortest poll) until the
#     job ended
# For each: wall time, jobs per second, and the head's job-API requests per job, counted in the
# dashboard's access log (`web_log.py` lines, by user agent: sortie's ureq, the peer's curl).
# Medians over the rounds; the load average is printed after each measure.
#
#   `ray job submit -- true` (Ray's own CLI: submits, then follows the job until it ends), P at a
#     time from a shell loop
# Usage: bench/ray.sh [SORTIE_BIN]   (N=200 P=16 ROUNDS=3 TOOLS="sortie curl cli" by default; a head from
# .ci/ray/up.sh is started when none answers, and left up). Prints a table, and last a
# `ray key=value ...` line.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SORTIE=$(realpath "${1:-$ROOT/target/release/sortie}")
N=${N:-200}
P=${P:-16}
ROUNDS=${ROUNDS:-3}
TOOLS=${TOOLS:-sortie curl cli}
WORK=${SORTIE_BENCH_DIR:-/var/tmp/sortie-bench}/ray
RAY_HOME=${SORTIE_RAY_HOME:-/var/tmp/sortie-ray}
ADDRESS=${SORTIE_RAY_ADDRESS:-http://127.0.0.1:8265}
mkdir -p "$WORK"

if ! curl -fsS --max-time 3 "$ADDRESS/api/version" >/dev/null 2>&1; then
    .ci/ray/up.sh >/dev/null
    ADDRESS=http://127.0.0.1:8265
fi
export RAY_ADDRESS=$ADDRESS
ACCESS_LOG="$RAY_HOME/tmp/session_latest/logs/dashboard.log"
[[ -f "$ACCESS_LOG" ]] || { echo "bench: no access log at $ACCESS_LOG" >&2; exit 1; }

now() { date +%s.%N; }
# Job-API requests in the access log after line $1 from user agents matching $2.
requests() {
    tail -n +"$(($1 + 1))" "$ACCESS_LOG" | grep "web_log.py" | grep "/api/" | grep -c "$2" || true
}
measure() { # NAME AGENT CMD...: runs CMD, prints "NAME seconds requests"
    local name=$1 agent=$2
    shift 2
    local before t0 t1
    before=$(wc -l <"$ACCESS_LOG")
    t0=$(now)
    "$@" >"$WORK/$name.log" 2>&1 || { echo "bench: $name failed (see $WORK/$name.log)" >&2; exit 1; }
    t1=$(now)
    sleep 1 # the access log is written after the answer
    awk -v n="$name" -v a="$t0" -v b="$t1" -v r="$(requests "$before" "$agent")" \
        'BEGIN { printf "%s %.2f %d\n", n, b - a, r }'
}

# sortie: N tasks of `true` as Ray jobs.
run_sortie() {
    rm -rf "$WORK/sortie"
    mkdir -p "$WORK/sortie"
    {
        printf 'concurrency = %d\n\n[defaults]\nexecutor = "ray"\ncommand = ["true"]\n\n' "$P"
        for i in $(seq "$N"); do printf '[[tasks]]\nlabel = "t%d"\n' "$i"; done
    } >"$WORK/sortie/batch.toml"
    (cd "$WORK/sortie" && "$SORTIE" --state-dir state run batch.toml)
}

# The peer: one job per line of its input, submitted and waited for with curl.
cat >"$WORK/curl-job.sh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
id="bench-curl-$1-$2"
curl -fsS --max-time 10 -H 'Content-Type: application/json' \
    -d "{\"entrypoint\": \"true\", \"submission_id\": \"$id\"}" "$RAY_ADDRESS/api/jobs/" >/dev/null
while :; do
    s=$(curl -fsS --max-time 10 "$RAY_ADDRESS/api/jobs/$id")
    case "$s" in
    *'"status": "SUCCEEDED"'* | *'"status":"SUCCEEDED"'*) exit 0 ;;
    *'"status": "FAILED"'* | *'"status":"FAILED"'* | *'"status": "STOPPED"'*) exit 1 ;;
    esac
    sleep 0.3
done
EOF
chmod +x "$WORK/curl-job.sh"
run_curl() { seq "$N" | xargs -P "$P" -I{} "$WORK/curl-job.sh" "$ROUND" {}; }
# The peer the issue names: Ray's own CLI, `ray job submit -- true` (submits, follows the job's
# log until it ends), P at a time from a shell loop.
run_cli() {
    seq "$N" | xargs -P "$P" -I{} ray job submit --address "$RAY_ADDRESS" \
        --submission-id "bench-cli-$ROUND-{}" -- true
}

declare -A secs reqs
loads=()
for ROUND in $(seq "$ROUNDS"); do
    ROUND="$ROUND-$(date +%s)"
    for tool in $TOOLS; do
        case $tool in
        sortie) r=$(measure sortie ureq run_sortie) ;;
        curl) r=$(measure curl curl/ run_curl) ;;
        cli) r=$(measure cli 'python-requests\|aiohttp' run_cli) ;;
        esac
        read -r _ s q <<<"$r"
        secs[$tool]+="$s "
        reqs[$tool]+="$q "
        load=$(cut -d' ' -f1 /proc/loadavg)
        loads+=("$load")
        echo "round ${ROUND%%-*} $tool: ${s} s, $q requests, load $load" >&2
    done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
version=$(curl -fsS "$ADDRESS/api/version" | python3 -c 'import json, sys; print(json.load(sys.stdin)["ray_version"])')
echo
echo "$N jobs of \`true\` on one Ray $version head ($(nproc) cores), P=$P, $ROUNDS interleaved rounds, medians; load after each measure: ${loads[*]}"
printf '%-8s %10s %10s %16s   %s\n' tool "wall (s)" "jobs/s" "requests per job" "walls (s)"
keys="ray n=$N p=$P rounds=$ROUNDS"
for tool in $TOOLS; do
    s=$(median <<<"${secs[$tool]}")
    q=$(median <<<"${reqs[$tool]}")
    awk -v n="$tool" -v s="$s" -v q="$q" -v N="$N" -v all="${secs[$tool]}" \
        'BEGIN { printf "%-8s %10.1f %10.2f %16.1f   %s\n", n, s, N / s, q / N, all }'
    keys+=" ${tool}_s=$s ${tool}_requests=$q"
done
echo "$keys"

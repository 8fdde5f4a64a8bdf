#!/usr/bin/env bash
# Runs the real `codex exec --json` against codex_server.py, both inside a network namespace that
# has only a loopback interface (`unshare -rn`), so nothing can reach a model provider or any
# other host. Records stdout, stderr, the exit code, the wall time and the mock's request log.
#
#   run_codex.sh SCENARIO OUT_PREFIX [RETRIES] [-- extra codex args]
#
# SCENARIO is one of codex_server.py's, or "refused" (no server: connections are refused).
# RETRIES (default: unset = codex's defaults) is written as request_max_retries and
# stream_max_retries of the mock provider. Env: CODEX_PROMPT (default "Say hello."),
# CODEX_EXTRA_CONFIG (more config.toml lines, at the top level), CODEX_SANDBOX (sandbox_mode;
# default danger-full-access; "default" writes neither sandbox_mode nor approval_policy), CODEX_TERM_AFTER (send SIGTERM to
# codex's process group after this many seconds, as sortie stops an attempt), CODEX_RESUME=1 (first
# run the prompt once, then record `codex exec resume --last` with it in the same CODEX_HOME).
# Writes OUT_PREFIX.jsonl (stdout), .stderr, .requests.jsonl, .meta (exit, wall time).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
scenario=$1
out=$(realpath -m "$2")
retries=${3:-}
shift 3 2>/dev/null || shift $#
[[ ${1:-} == -- ]] && shift

if [[ -z ${SORTIE_CODEX_IN_NETNS:-} ]]; then
    export SORTIE_CODEX_IN_NETNS=1
    exec unshare -rn "$0" "$scenario" "$out" "$retries" -- "$@"
fi

ip link set lo up
work=$(mktemp -d)
mock_pid=
cleanup() {
    if [[ -n $mock_pid ]]; then
        kill "$mock_pid" 2>/dev/null || true
        wait "$mock_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/home" "$work/project"
rm -f "$out.requests.jsonl"
if [[ $scenario == refused ]]; then
    # Nothing listens in this namespace: every connection is refused.
    mock_pid=
    port=9
else
    python3 "$here/codex_server.py" --scenario "$scenario" --port-file "$work/port" \
        --log "$out.requests.jsonl" 2>"$work/mock.stderr" &
    mock_pid=$!
    for _ in $(seq 200); do [[ -s $work/port ]] && break; sleep 0.05; done
    port=$(cat "$work/port")
fi

{
    echo 'model = "mock-model"'
    echo 'model_provider = "mock"'
    if [[ ${CODEX_SANDBOX:-danger-full-access} != default ]]; then
        echo 'approval_policy = "never"'
        echo "sandbox_mode = \"${CODEX_SANDBOX:-danger-full-access}\""
    fi
    echo 'check_for_update_on_startup = false'
    echo 'features.plugins = false'
    echo "${CODEX_EXTRA_CONFIG:-}"
    echo '[analytics]'
    echo 'enabled = false'
    echo '[model_providers.mock]'
    echo 'name = "mock"'
    echo "base_url = \"http://127.0.0.1:$port/v1\""
    echo 'wire_api = "responses"'
    echo 'env_key = "MOCK_API_KEY"'
    if [[ -n $retries ]]; then
        echo "request_max_retries = $retries"
        echo "stream_max_retries = $retries"
    fi
} >"$work/home/config.toml"
cp "$work/home/config.toml" "$out.config.toml"

cd "$work/project"
git init -q .
start=$(date +%s.%N)
set +e
resume=()
if [[ -n ${CODEX_RESUME:-} ]]; then
    env -i PATH="$PATH" HOME="$work" CODEX_HOME="$work/home" MOCK_API_KEY=mock-key TERM=dumb \
        LANG=C.UTF-8 codex exec --json --skip-git-repo-check "$@" "${CODEX_PROMPT:-Say hello.}" \
        </dev/null >"$out.first.jsonl" 2>/dev/null
    resume=(resume --last)
fi
stopper=()
[[ -n ${CODEX_TERM_AFTER:-} ]] && stopper=(timeout --preserve-status -s TERM "$CODEX_TERM_AFTER")
"${stopper[@]}" env -i PATH="$PATH" HOME="$work" CODEX_HOME="$work/home" MOCK_API_KEY=mock-key TERM=dumb LANG=C.UTF-8 \
    codex exec --json --skip-git-repo-check "$@" "${resume[@]}" "${CODEX_PROMPT:-Say hello.}" \
    </dev/null >"$out.jsonl" 2>"$out.stderr"
code=$?
set -e
end=$(date +%s.%N)
wall=$(python3 -c "print(round($end - $start, 1))")
statuses=$(python3 - "$out.requests.jsonl" <<'EOF'
import json, sys
try:
    lines = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    lines = []
print(",".join(str(l["status"]) for l in lines if l["method"] == "POST") or "None")
EOF
)
printf 'exit=%s\twall_s=%s\tevents=%s\tmock_http_statuses=%s\tfiles=%s\n' "$code" "$wall" \
    "$(wc -l <"$out.jsonl")" "$statuses" "$(cd "$work/project" && ls | tr '\n' ' ')" | tee "$out.meta"
find "$work/home" -maxdepth 2 | sed "s|$work/home|CODEX_HOME|" >"$out.home_listing"

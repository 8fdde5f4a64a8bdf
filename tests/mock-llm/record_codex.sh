#!/usr/bin/env bash
# Records every codex sample: runs run_codex.sh for each scenario and writes OUT_DIR/codex_*.jsonl
# (stdout of `codex exec --json`) and OUT_DIR/codex_exit_codes.tsv (exit, wall time, events, the
# statuses the mock answered). The other files of each run (.stderr, .requests.jsonl, .config.toml)
# go to OUT_DIR/raw/.
#
#   record_codex.sh OUT_DIR [NAME...]      (no names: every sample)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "$1")
shift
mkdir -p "$out/raw"

# name  scenario  retries(empty = codex's defaults)  model  env
samples=(
    "codex_ok ok - gpt-5.5"
    "codex_tool tool - gpt-5.5 CODEX_PROMPT=Create_out.txt_containing_hi."
    "codex_patch patch - gpt-5.5 CODEX_PROMPT=Add_hello.txt_containing_hi."
    "codex_unknown_model ok - mock-model"
    "codex_flaky500 flaky500 - gpt-5.5"
    "codex_error500 error500 - gpt-5.5"
    "codex_error500_noretry error500 0 gpt-5.5"
    "codex_ratelimit429 ratelimit429 - gpt-5.5"
    "codex_ratelimit429_noretry ratelimit429 0 gpt-5.5"
    "codex_auth401 auth401 - gpt-5.5"
    "codex_auth401_noretry auth401 0 gpt-5.5"
    "codex_quota429 quota429 - gpt-5.5"
    "codex_stream_cut stream_cut - gpt-5.5"
    "codex_stream_cut_noretry stream_cut 0 gpt-5.5"
    "codex_failed_noretry failed 0 gpt-5.5"
    "codex_ratelimit429_retry_after ratelimit429_retry_after - gpt-5.5"
    "codex_sigterm error500 - gpt-5.5 CODEX_TERM_AFTER=2"
    "codex_resumed ok - gpt-5.5 CODEX_RESUME=1"
    "codex_tool_readonly tool - gpt-5.5 CODEX_SANDBOX=default CODEX_PROMPT=Create_out.txt_containing_hi."
    "codex_refused refused - gpt-5.5 CODEX_TERM_AFTER=20"
    "codex_refused_noretry refused 0 gpt-5.5 CODEX_TERM_AFTER=20"
)

for line in "${samples[@]}"; do
    read -r name scenario retries model envs <<<"$line"
    if (($#)) && [[ " $* " != *" $name "* ]]; then
        continue
    fi
    [[ $retries == - ]] && retries=""
    env_args=()
    for kv in $envs; do env_args+=("${kv//_/ }"); done
    # Underscores stand for spaces in the values above; names keep theirs.
    fixed=()
    for kv in "${env_args[@]}"; do
        key=${kv%%=*}
        fixed+=("${key// /_}=${kv#*=}")
    done
    echo "== $name" >&2
    meta=$(env "${fixed[@]}" "$here/run_codex.sh" "$scenario" "$out/raw/$name" "$retries" -- -m "$model")
    mv "$out/raw/$name.jsonl" "$out/$name.jsonl"
    printf '%s\t%s\tmodel=%s\tretries=%s\tenv=%s\n' "$name" "$meta" "$model" \
        "${retries:-default}" "${envs:-none}" >>"$out/codex_exit_codes.tsv.new"
done
touch "$out/codex_exit_codes.tsv"
# Keep earlier lines of samples not re-recorded now.
{
    grep -v -F -f <(cut -f1 "$out/codex_exit_codes.tsv.new" | sed 's/$/\t/') "$out/codex_exit_codes.tsv" || true
    cat "$out/codex_exit_codes.tsv.new"
} | sort >"$out/codex_exit_codes.tsv.tmp"
mv "$out/codex_exit_codes.tsv.tmp" "$out/codex_exit_codes.tsv"
rm -f "$out/codex_exit_codes.tsv.new"
cat "$out/codex_exit_codes.tsv"

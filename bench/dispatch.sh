#!/usr/bin/env bash
# Dispatch overhead: N tasks of `true` at concurrency 16, durably journaled by sortie, against
# `xargs -P 16` running the same N processes, on the same machine in the same script.
# Each contender runs ROUNDS times, interleaved; the median wall time is reported, and the
# ratio is sortie's throughput over xargs' (1.0 = as fast as xargs).
#   bash bench/dispatch.sh            (N=2000, ROUNDS=5)
#   N=5000 ROUNDS=3 bash bench/dispatch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
ROUNDS=${ROUNDS:-5}
P=16

cargo build --release -q -p sortie-cli
SORTIE=$PWD/target/release/sortie
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/tasks.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"command": ["true"]}) + "\n")
PY

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: > "$work/sortie.times"
: > "$work/xargs.times"
for r in $(seq "$ROUNDS"); do
  t0=$(now)
  seq "$N" | xargs -P "$P" -I{} true
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/xargs.times"

  rm -rf "$work/state"
  t0=$(now)
  "$SORTIE" --state-dir "$work/state" run "$work/tasks.jsonl" --concurrency "$P" >/dev/null 2>"$work/sortie.log"
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/sortie.times"
  "$SORTIE" --state-dir "$work/state" audit "$(ls "$work/state/runs")" >/dev/null
done

xargs_t=$(median < "$work/xargs.times")
sortie_t=$(median < "$work/sortie.times")
events=$("$SORTIE" --state-dir "$work/state" export "$(ls "$work/state/runs")" | wc -l)
printf '\n%-34s %10s %12s\n' "dispatch: $N x true, -P $P" "median s" "tasks/s"
calc() { awk "BEGIN {printf \"%.3f\", $1}"; }
printf '%-34s %10.3f %12.0f\n' "xargs -P $P" "$xargs_t" "$(calc "$N / $xargs_t")"
printf '%-34s %10.3f %12.0f\n' "sortie (journaled, $events events)" "$sortie_t" "$(calc "$N / $sortie_t")"
printf 'ratio sortie/xargs throughput: %s\n' "$(calc "$xargs_t / $sortie_t")"
echo "BENCH dispatch tasks=$N concurrency=$P xargs_s=$xargs_t sortie_s=$sortie_t ratio=$(calc "$xargs_t / $sortie_t")"

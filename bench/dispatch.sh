#!/usr/bin/env bash
# Dispatch overhead: N tasks of `true` at concurrency 16, durably journaled by sortie (supervised,
# the default: every attempt started by the run's shepherd, which outlives sortie; supervised
# with a supervisor per attempt, SORTIE_SUPERVISION=attempt, the alternative the shepherd was
# chosen over; and unsupervised, `supervise = false`: children of sortie), against
# `xargs -P 16` and GNU `parallel -j 16` running the same N processes, on the same machine in
# the same script. Each contender runs ROUNDS times, interleaved; the median wall time is
# reported, and the ratios are sortie's throughput over each peer's (1.0 = as fast).
# GNU parallel is installed with apt-get when it is missing (PARALLEL=0 skips it).
#   bash bench/dispatch.sh            (N=5000, ROUNDS=3)
#   N=2000 ROUNDS=5 bash bench/dispatch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
ROUNDS=${ROUNDS:-3}
P=16
PARALLEL=${PARALLEL:-1}

is_gnu_parallel() { parallel --version 2>/dev/null | grep -q 'GNU parallel'; }
if [ "$PARALLEL" = 1 ] && ! is_gnu_parallel; then
  echo "dispatch.sh: installing GNU parallel with apt-get" >&2
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get install -y -q parallel >/dev/null 2>&1 ||
    { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q parallel >/dev/null 2>&1; } ||
    true
  is_gnu_parallel || { echo "dispatch.sh: no GNU parallel: its row is skipped" >&2; PARALLEL=0; }
fi

cargo build --release -q -p sortie-cli
SORTIE=$PWD/target/release/sortie
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/tasks.jsonl" "$work/direct.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f, open(sys.argv[2], "w") as g:
    for i in range(int(sys.argv[3])):
        f.write(json.dumps({"command": ["true"]}) + "\n")
        g.write(json.dumps({"command": ["true"], "supervise": False}) + "\n")
PY

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: > "$work/sortie.times"
: > "$work/direct.times"
: > "$work/attempt.times"
: > "$work/xargs.times"
: > "$work/parallel.times"
load_before=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  t0=$(now)
  seq "$N" | xargs -P "$P" -I{} true
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/xargs.times"

  if [ "$PARALLEL" = 1 ]; then
    t0=$(now)
    seq "$N" | parallel --will-cite -j "$P" true
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/parallel.times"
  fi

  rm -rf "$work/state"
  t0=$(now)
  "$SORTIE" --state-dir "$work/state" run "$work/tasks.jsonl" --concurrency "$P" >/dev/null 2>"$work/sortie.log"
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/sortie.times"
  "$SORTIE" --state-dir "$work/state" audit "$(ls "$work/state/runs")" >/dev/null

  rm -rf "$work/astate"
  t0=$(now)
  SORTIE_SUPERVISION=attempt "$SORTIE" --state-dir "$work/astate" run "$work/tasks.jsonl" --concurrency "$P" >/dev/null 2>"$work/attempt.log"
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/attempt.times"

  rm -rf "$work/dstate"
  t0=$(now)
  "$SORTIE" --state-dir "$work/dstate" run "$work/direct.jsonl" --concurrency "$P" >/dev/null 2>"$work/direct.log"
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/direct.times"
done

xargs_t=$(median < "$work/xargs.times")
sortie_t=$(median < "$work/sortie.times")
direct_t=$(median < "$work/direct.times")
attempt_t=$(median < "$work/attempt.times")
events=$("$SORTIE" --state-dir "$work/state" export "$(ls "$work/state/runs")" | wc -l)
load_after=$(cut -d' ' -f1 /proc/loadavg)
printf '\n%-34s %10s %12s\n' "dispatch: $N x true, -P $P" "median s" "tasks/s"
calc() { awk "BEGIN {printf \"%.3f\", $1}"; }
printf '%-34s %10.3f %12.0f\n' "xargs -P $P" "$xargs_t" "$(calc "$N / $xargs_t")"
parallel_t=nan
parallel_ratio=nan
if [ "$PARALLEL" = 1 ]; then
  parallel_t=$(median < "$work/parallel.times")
  parallel_ratio=$(calc "$parallel_t / $sortie_t")
  printf '%-34s %10.3f %12.0f\n' "GNU parallel -j $P" "$parallel_t" "$(calc "$N / $parallel_t")"
fi
printf '%-34s %10.3f %12.0f\n' "sortie supervised ($events events)" "$sortie_t" "$(calc "$N / $sortie_t")"
printf '%-34s %10.3f %12.0f\n' "sortie, a supervisor per attempt" "$attempt_t" "$(calc "$N / $attempt_t")"
printf '%-34s %10.3f %12.0f\n' "sortie supervise = false" "$direct_t" "$(calc "$N / $direct_t")"
printf 'ratio sortie/xargs throughput: %s (supervised: shepherd), %s (a supervisor per attempt), %s (supervise = false)\n' "$(calc "$xargs_t / $sortie_t")" "$(calc "$xargs_t / $attempt_t")" "$(calc "$xargs_t / $direct_t")"
printf 'ratio sortie/parallel throughput: %s\n' "$parallel_ratio"
printf 'load average before %s, after %s (%s cores)\n' "$load_before" "$load_after" "$(nproc)"
echo "BENCH dispatch tasks=$N concurrency=$P rounds=$ROUNDS xargs_s=$xargs_t parallel_s=$parallel_t sortie_s=$sortie_t ratio=$(calc "$xargs_t / $sortie_t") direct_s=$direct_t direct_ratio=$(calc "$xargs_t / $direct_t") attempt_s=$attempt_t attempt_ratio=$(calc "$xargs_t / $attempt_t") parallel_ratio=$parallel_ratio load=$load_after"

#!/usr/bin/env bash
# Dispatch overhead: N tasks of `true` at concurrency 16, durably journaled by sortie (supervised,
# the default: every attempt started by the run's shepherd, which outlives sortie; supervised
# with a supervisor per attempt, SORTIE_SUPERVISION=attempt, the alternative the shepherd was
# chosen over; and unsupervised, `supervise = false`: children of sortie), against
# `xargs -P 16` and GNU `parallel -j 16` running the same N processes, on the same machine in
# the same script. Each contender runs ROUNDS times, interleaved; the median wall time is
# reported, and the ratios are sortie's throughput over each peer's (1.0 = as fast).
# Two yardsticks run beside them (crates/runner/examples/dispatch_floor.rs): the floor, what a
# supervised attempt cannot avoid (a spawn, a stdout and a stderr file of its own, a status line
# at its start and end) done by 16 threads of one process; and sortie's shepherd alone, driven
# over its pipes as sortie drives it, without sortie's engine, journal or followers. Between
# them and sortie lies what sortie itself adds.
# #34: the same batch sandboxed (`sandbox = "workspace"`: every attempt through `sortie
# __sandbox`, a user and network namespace and Landlock) runs interleaved with the others; its
# throughput over the unsandboxed run's is the sandbox's ratio (target >= 0.8), and the wrapper's
# own cost per attempt is measured exec to exec: `sortie __sandbox POLICY true` against `true`,
# SETUP_N times each, the difference per exec in milliseconds (SANDBOX=0 skips both); beside
# it the floor of any namespace per attempt, `unshare -Urn true` against `true`.
# GNU parallel is installed with apt-get when it is missing (PARALLEL=0 skips it).
#   bash bench/dispatch.sh            (N=5000, ROUNDS=3)
#   N=2000 ROUNDS=5 bash bench/dispatch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
ROUNDS=${ROUNDS:-3}
P=16
PARALLEL=${PARALLEL:-1}
SANDBOX=${SANDBOX:-1}
SETUP_N=${SETUP_N:-500}

is_gnu_parallel() { parallel --version 2>/dev/null | grep -q 'GNU parallel'; }
if [ "$PARALLEL" = 1 ] && ! is_gnu_parallel; then
  echo "dispatch.sh: installing GNU parallel with apt-get" >&2
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get install -y -q parallel >/dev/null 2>&1 ||
    { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q parallel >/dev/null 2>&1; } ||
    true
  is_gnu_parallel || { echo "dispatch.sh: no GNU parallel: its row is skipped" >&2; PARALLEL=0; }
fi

cargo build --release -q -p sortie-cli --bins -p sortie-runner --example dispatch_floor
SORTIE=$PWD/target/release/sortie
FLOOR=$PWD/target/release/examples/dispatch_floor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/tasks.jsonl" "$work/direct.jsonl" "$work/sandbox.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f, open(sys.argv[2], "w") as g, open(sys.argv[3], "w") as h:
    for i in range(int(sys.argv[4])):
        f.write(json.dumps({"command": ["true"]}) + "\n")
        g.write(json.dumps({"command": ["true"], "supervise": False}) + "\n")
        h.write(json.dumps({"command": ["true"], "sandbox": "workspace"}) + "\n")
PY
if [ "$SANDBOX" = 1 ] && ! "$SORTIE" __sandbox --probe >/dev/null 2>&1; then
  echo "dispatch.sh: this machine cannot sandbox: its rows are skipped" >&2
  SANDBOX=0
fi
# The wrapper alone: the policy of an attempt of `true` (written as sortie writes one).
mkdir -p "$work/box/tmp"
python3 - "$work/box" <<'PY'
import json, sys
box = sys.argv[1]
json.dump({"write": [box, box + "/tmp", "/dev/null"], "read": ["/usr", "/etc", "/lib", "/lib64", "/bin"],
           "hosts": [], "tmp": box + "/tmp"}, open(box + "/policy.json", "w"))
PY

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: > "$work/sortie.times"
: > "$work/direct.times"
: > "$work/attempt.times"
: > "$work/xargs.times"
: > "$work/parallel.times"
: > "$work/floor.times"
: > "$work/shepherd.times"
: > "$work/sandbox.times"
: > "$work/setup.times"
: > "$work/unshare.times"
# CPU seconds (user + sys, the contender and its children) beside the wall time: on a loaded
# machine the wall time says how the scheduler treated each contender, the CPU what it cost.
TIME=$(command -v /usr/bin/time || true)
# `timed NAME CMD...`: runs CMD (its stdin the script's), appends its wall and CPU seconds.
timed() {
  local name=$1
  shift
  local t0 t1
  t0=$(now)
  if [ -n "$TIME" ]; then
    "$TIME" -f "%U %S" -o "$work/$name.cpu1" "$@"
    awk '{print $1 + $2}' "$work/$name.cpu1" >> "$work/$name.cpu"
  else
    "$@"
  fi
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >> "$work/$name.times"
}
load_before=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  seq "$N" | timed xargs xargs -P "$P" -I{} true

  if [ "$PARALLEL" = 1 ]; then
    seq "$N" | timed parallel parallel --will-cite -j "$P" true
  fi

  timed floor "$FLOOR" inprocess "$N" "$work/floor$r"
  timed shepherd "$FLOOR" shepherd "$SORTIE" "$N" "$work/shepherd$r"

  # A state dir per round, all removed at the end: deleting 25,000 files just before a
  # contender runs would charge it for the deletion (ext4 without a journal skips recently
  # deleted inodes when it allocates new ones).
  timed sortie "$SORTIE" --state-dir "$work/state$r" run "$work/tasks.jsonl" --concurrency "$P" >/dev/null 2>"$work/sortie.log"
  "$SORTIE" --state-dir "$work/state$r" audit "$(ls "$work/state$r/runs")" >/dev/null

  timed attempt env SORTIE_SUPERVISION=attempt "$SORTIE" --state-dir "$work/astate$r" run "$work/tasks.jsonl" --concurrency "$P" >/dev/null 2>"$work/attempt.log"

  timed direct "$SORTIE" --state-dir "$work/dstate$r" run "$work/direct.jsonl" --concurrency "$P" >/dev/null 2>"$work/direct.log"

  if [ "$SANDBOX" = 1 ]; then
    timed sandbox "$SORTIE" --state-dir "$work/sstate$r" run "$work/sandbox.jsonl" --concurrency "$P" >/dev/null 2>"$work/sandbox.log"
    # (a task that failed would have made sortie exit 1, which ends the script here)
    # Exec to exec: SETUP_N wrapped `true`s, then SETUP_N plain ones, one at a time.
    t0=$(now)
    for _ in $(seq "$SETUP_N"); do "$SORTIE" __sandbox "$work/box/policy.json" true; done
    t1=$(now)
    for _ in $(seq "$SETUP_N"); do /bin/true; done
    t2=$(now)
    awk -v a="$t0" -v b="$t1" -v c="$t2" -v n="$SETUP_N" 'BEGIN {print ((b - a) - (c - b)) * 1000 / n}' >> "$work/setup.times"
    # The floor of any namespace per attempt: util-linux's `unshare -Urn true` (a user and
    # network namespace, made and torn down, one exec more) against `true`.
    if command -v unshare >/dev/null 2>&1; then
      t3=$(now)
      for _ in $(seq "$SETUP_N"); do unshare -Urn true; done
      t4=$(now)
      awk -v a="$t3" -v b="$t4" -v c="$t1" -v d="$t2" -v n="$SETUP_N" 'BEGIN {print ((b - a) - (d - c)) * 1000 / n}' >> "$work/unshare.times"
    fi
  fi
done

cpu() { if [ -s "$work/$1.cpu" ]; then median < "$work/$1.cpu"; else echo nan; fi; }
xargs_t=$(median < "$work/xargs.times")
sortie_t=$(median < "$work/sortie.times")
direct_t=$(median < "$work/direct.times")
floor_t=$(median < "$work/floor.times")
shepherd_t=$(median < "$work/shepherd.times")
attempt_t=$(median < "$work/attempt.times")
events=$("$SORTIE" --state-dir "$work/state1" export "$(ls "$work/state1/runs")" | wc -l)
sandbox_t=nan
sandbox_ratio=nan
setup_ms=nan
unshare_ms=nan
if [ "$SANDBOX" = 1 ]; then
  sandbox_t=$(median < "$work/sandbox.times")
  setup_ms=$(median < "$work/setup.times")
  if [ -s "$work/unshare.times" ]; then unshare_ms=$(median < "$work/unshare.times"); fi
fi
load_after=$(cut -d' ' -f1 /proc/loadavg)
printf '\n%-34s %10s %10s %12s\n' "dispatch: $N x true, -P $P" "median s" "cpu s" "tasks/s"
calc() { awk "BEGIN {printf \"%.3f\", $1}"; }
line() { printf '%-34s %10.3f %10s %12.0f\n' "$1" "$2" "$3" "$(calc "$N / $2")"; }
xargs_c=$(cpu xargs)
sortie_c=$(cpu sortie)
attempt_c=$(cpu attempt)
direct_c=$(cpu direct)
line "xargs -P $P" "$xargs_t" "$xargs_c"
parallel_t=nan
parallel_ratio=nan
if [ "$PARALLEL" = 1 ]; then
  parallel_t=$(median < "$work/parallel.times")
  parallel_ratio=$(calc "$parallel_t / $sortie_t")
  line "GNU parallel -j $P" "$parallel_t" "$(cpu parallel)"
fi
line "floor: spawn + 2 files + status" "$floor_t" "$(cpu floor)"
line "sortie's shepherd alone" "$shepherd_t" "$(cpu shepherd)"
line "sortie supervised ($events events)" "$sortie_t" "$sortie_c"
line "sortie, a supervisor per attempt" "$attempt_t" "$attempt_c"
line "sortie supervise = false" "$direct_t" "$direct_c"
if [ "$SANDBOX" = 1 ]; then
  sandbox_ratio=$(calc "$sortie_t / $sandbox_t")
  line "sortie sandbox = workspace" "$sandbox_t" "$(cpu sandbox)"
  printf 'ratio sandboxed/unsandboxed throughput: %s; the wrapper, exec to exec: %.2f ms per attempt\n' "$sandbox_ratio" "$setup_ms"
  printf 'the floor of a namespace per attempt (unshare -Urn true against true): %.2f ms\n' "$unshare_ms"
fi
ratio() { if [ "$1" = nan ] || [ "$2" = nan ]; then echo nan; else calc "$1 / $2"; fi; }
printf 'ratio sortie/xargs throughput: %s (supervised: shepherd), %s (a supervisor per attempt), %s (supervise = false)\n' "$(calc "$xargs_t / $sortie_t")" "$(calc "$xargs_t / $attempt_t")" "$(calc "$xargs_t / $direct_t")"
printf 'ratio xargs/sortie CPU: %s (supervised: shepherd), %s (a supervisor per attempt), %s (supervise = false)\n' "$(ratio "$xargs_c" "$sortie_c")" "$(ratio "$xargs_c" "$attempt_c")" "$(ratio "$xargs_c" "$direct_c")"
printf 'ratio sortie/parallel throughput: %s\n' "$parallel_ratio"
printf 'ratio yardstick/xargs throughput: %s (floor), %s (shepherd alone)\n' "$(calc "$xargs_t / $floor_t")" "$(calc "$xargs_t / $shepherd_t")"
printf 'load average before %s, after %s (%s cores)\n' "$load_before" "$load_after" "$(nproc)"
echo "BENCH dispatch tasks=$N concurrency=$P rounds=$ROUNDS xargs_s=$xargs_t parallel_s=$parallel_t sortie_s=$sortie_t ratio=$(calc "$xargs_t / $sortie_t") direct_s=$direct_t direct_ratio=$(calc "$xargs_t / $direct_t") attempt_s=$attempt_t attempt_ratio=$(calc "$xargs_t / $attempt_t") parallel_ratio=$parallel_ratio floor_s=$floor_t floor_ratio=$(calc "$xargs_t / $floor_t") shepherd_s=$shepherd_t shepherd_ratio=$(calc "$xargs_t / $shepherd_t") load=$load_after xargs_cpu=$xargs_c sortie_cpu=$sortie_c attempt_cpu=$attempt_c direct_cpu=$direct_c cpu_ratio=$(ratio "$xargs_c" "$sortie_c") sandbox_s=$sandbox_t sandbox_ratio=$sandbox_ratio sandbox_setup_ms=$setup_ms unshare_ms=$unshare_ms sandbox_cpu=$(cpu sandbox)"

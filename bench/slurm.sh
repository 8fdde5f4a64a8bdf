#!/usr/bin/env bash
# Benchmark (not a test): N jobs of `true` through the same Slurm cluster, in the same run:
#   sortie (executor = "slurm", concurrency P)
#   Snakemake with snakemake-executor-plugin-slurm (--jobs P), installed from PyPI into a venv
#     by this script only, when missing
#   xargs -P P sbatch --wait
# For each: wall time, jobs per second, and slurmctld's RPCs per job (`sdiag`, reset before each
# tool: every message type, the slurmd's own job-completion messages included). `sacct` queries
# go to slurmdbd and are not counted by sdiag.
#
# Usage: bench/slurm.sh [SORTIE_BIN]   (N=200 P=16 by default; a cluster from .ci/slurm/up.sh
# is started when none answers). Prints a table, and last a `slurm key=value ...` line.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SORTIE=$(realpath "${1:-$ROOT/target/release/sortie}")
N=${N:-200}
P=${P:-16}
WORK=${SORTIE_BENCH_DIR:-/var/tmp/sortie-bench}
mkdir -p "$WORK"

if ! timeout 5 sinfo -h >/dev/null 2>&1; then
    .ci/slurm/up.sh >/dev/null
    # shellcheck source=/dev/null
    source "${SORTIE_SLURM_HOME:-/var/tmp/sortie-slurm}/env"
fi
export SLURM_CONF

if [[ ! -x "$WORK/venv/bin/snakemake" ]]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q snakemake snakemake-executor-plugin-slurm
fi

now() { date +%s.%N; }
# The sum of slurmctld's RPC counts by message type since the last reset.
rpcs() {
    sdiag | awk '/by message type/ { on = 1; next } /by user/ { on = 0 }
        on && /count:/ { sub(/.*count:/, ""); sum += $1 } END { print sum + 0 }'
}
idle() {
    for _ in $(seq 600); do
        [[ -z "$(squeue -h -o %i)" ]] && return 0
        sleep 0.5
    done
    echo "bench: the cluster did not drain" >&2
    exit 1
}
measure() { # NAME CMD...: runs CMD, prints "NAME seconds rpcs"
    local name=$1
    shift
    idle
    sdiag --reset >/dev/null
    local t0 t1
    t0=$(now)
    "$@" >"$WORK/$name.log" 2>&1 || { echo "bench: $name failed (see $WORK/$name.log)" >&2; exit 1; }
    t1=$(now)
    local r
    r=$(rpcs)
    awk -v n="$name" -v a="$t0" -v b="$t1" -v r="$r" 'BEGIN { printf "%s %.2f %d\n", n, b - a, r }'
}

# sortie: N tasks of `true` on Slurm.
rm -rf "$WORK/sortie"
mkdir -p "$WORK/sortie"
{
    printf 'concurrency = %d\n\n[defaults]\nexecutor = "slurm"\ncommand = ["true"]\n\n' "$P"
    for i in $(seq "$N"); do printf '[[tasks]]\nlabel = "t%d"\n' "$i"; done
} >"$WORK/sortie/batch.toml"
run_sortie() { (cd "$WORK/sortie" && "$SORTIE" --state-dir state run batch.toml); }

# Snakemake: N rules' jobs of `true` (each touches its output, as Snakemake requires one).
rm -rf "$WORK/snake"
mkdir -p "$WORK/snake"
cat >"$WORK/snake/Snakefile" <<EOF
rule all:
    input: expand("out/{i}.done", i=range($N))

rule job:
    output: "out/{i}.done"
    shell: "true && touch {output}"
EOF
# The plugin's job script runs `srun` inside the job, which needs slurm.conf at its default path
# (slurmd does not pass SLURM_CONF to the job): link it there for the run when it is missing.
LINKED=""
unlink_conf() { [[ -n "$LINKED" ]] && rm -f "$LINKED"; LINKED=""; }
trap unlink_conf EXIT
link_conf() {
    if [[ ! -e /etc/slurm/slurm.conf ]]; then
        mkdir -p /etc/slurm
        ln -s "$SLURM_CONF" /etc/slurm/slurm.conf
        LINKED=/etc/slurm/slurm.conf
    fi
}
run_snakemake() {
    (cd "$WORK/snake" && "$WORK/venv/bin/snakemake" --executor slurm --jobs "$P" \
        --default-resources slurm_partition=debug slurm_account=root runtime=10 mem_mb=10 \
        --latency-wait 10 --quiet all)
}

run_xargs() {
    seq "$N" | xargs -P "$P" -I{} sbatch --wait --parsable --job-name "xargs-{}" \
        --output /dev/null --wrap true
}

results=()
results+=("$(measure sortie run_sortie)")
link_conf
results+=("$(measure snakemake run_snakemake)")
unlink_conf
results+=("$(measure xargs run_xargs)")

load=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "$N jobs of \`true\` on one Slurm cluster ($(sinfo -h -o '%c CPUs on %n' | head -1)), P=$P, load $load"
printf '%-10s %10s %10s %14s\n' tool "wall (s)" "jobs/s" "RPCs per job"
keys="slurm n=$N p=$P"
for r in "${results[@]}"; do
    read -r name secs rpc <<<"$r"
    awk -v n="$name" -v s="$secs" -v r="$rpc" -v N="$N" \
        'BEGIN { printf "%-10s %10.1f %10.2f %14.1f\n", n, s, N / s, r / N }'
    keys+=" ${name}_s=$secs ${name}_rpcs=$rpc"
done
echo "$keys"

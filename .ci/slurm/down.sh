#!/usr/bin/env bash
# Stops exactly the daemons .ci/slurm/up.sh started: the pids it recorded in
# $SORTIE_SLURM_HOME/started, each only while its start time still matches (a reused pid is left
# alone), never by name. Jobs still on the cluster are cancelled first, so that no job outlives
# it. TERM, then KILL after 10 s. Safe to run twice, and when nothing was started.
set -uo pipefail

HOME_DIR="${SORTIE_SLURM_HOME:-/var/tmp/sortie-slurm}"
PIDS="$HOME_DIR/started"
export SLURM_CONF="$HOME_DIR/etc/slurm.conf"

say() { echo "slurm-down: $*" >&2; }
T0=$(date +%s.%N)
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

if [[ ! -f "$PIDS" ]]; then
    say "nothing recorded in $PIDS: nothing to stop"
    exit 0
fi
starttime() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }
# Alive and not a zombie (PID 1 reaps daemons lazily here, and kill -0 succeeds on a zombie).
alive() {
    local state
    state=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}
same() { alive "$1" && [[ "$(starttime "$1")" == "$2" ]]; }

# Cancel what is left on the cluster while slurmctld still answers (our slurmctld only).
while read -r name pid st; do
    if [[ "$name" == slurmctld ]] && same "$pid" "$st"; then
        if jobs=$(timeout 5 squeue -h -o %i 2>/dev/null) && [[ -n "$jobs" ]]; then
            say "cancelling $(wc -w <<<"$jobs") job(s) left on the cluster"
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs || true
            for ((i = 0; i < 50; i++)); do
                [[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break
                sleep 0.2
            done
        fi
    fi
done <"$PIDS"

# Stop in the reverse order of the start: slurmd, slurmctld, slurmdbd, MariaDB, munged.
mapfile -t LINES < <(tac "$PIDS")
for line in "${LINES[@]}"; do
    read -r name pid st <<<"$line"
    if ! same "$pid" "$st"; then
        say "$name (pid $pid) is already gone"
        continue
    fi
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 100; i++)); do
        same "$pid" "$st" || break
        sleep 0.1
    done
    if same "$pid" "$st"; then
        say "$name (pid $pid) ignored TERM for 10 s: KILL"
        kill -KILL "$pid" 2>/dev/null
    fi
    say "$name (pid $pid) stopped"
done
rm -f "$PIDS" /run/mysqld/mysqld.sock
say "stopped at $(elapsed) s"

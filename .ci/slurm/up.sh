#!/usr/bin/env bash
# Starts a real single-node Slurm cluster on this machine for sortie's Slurm tests and benchmark:
# Debian's munge, slurmctld, slurmd and (for `sacct`) slurmdbd on MariaDB, without systemd and
# without cgroups (see docs/slurm.md). Run as root. It installs the packages when missing, writes
# its configs into a directory of its own, starts the daemons in daemon mode, records what it
# started (pid and start time) and waits until `sinfo` shows the node idle, a probe job ran and
# `sacct` answers. `.ci/slurm/down.sh` stops exactly what this script started.
#
# Environment:
#   SORTIE_SLURM_HOME   where configs, spools, logs, pids and the database live
#                       (default /var/tmp/sortie-slurm)
#   SORTIE_SLURM_CPUS   CPUs the node advertises (default 8: several jobs at once on 2 cores)
#   SORTIE_SLURM_ACCOUNTING=0   no slurmdbd/MariaDB (then `sacct` is disabled)
#
# Clients find the cluster through SLURM_CONF=$SORTIE_SLURM_HOME/etc/slurm.conf; the script
# prints that line last (`eval "$(.ci/slurm/up.sh | tail -1)"`) and writes it to
# $SORTIE_SLURM_HOME/env. Running it again while its cluster is up is a no-op.
set -euo pipefail

HOME_DIR="${SORTIE_SLURM_HOME:-/var/tmp/sortie-slurm}"
CPUS="${SORTIE_SLURM_CPUS:-8}"
ACCOUNTING="${SORTIE_SLURM_ACCOUNTING:-1}"
ETC="$HOME_DIR/etc"
RUN="$HOME_DIR/run"
LOG="$HOME_DIR/log"
PIDS="$HOME_DIR/started"   # one line per daemon we started: name pid starttime
export SLURM_CONF="$ETC/slurm.conf"

say() { echo "slurm-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
now() { date +%s.%N; }
T0=$(now)
elapsed() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

[[ $(id -u) == 0 ]] || die "must run as root (slurmd launches jobs as their users)"

# The start time of a pid (field 22 of /proc/PID/stat) and whether it is alive and not a zombie.
starttime() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }
alive() {
    local state
    state=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}
# Is the daemon recorded under NAME (by us) still the process we started?
ours_alive() {
    local name=$1 n pid st
    [[ -f "$PIDS" ]] || return 1
    while read -r n pid st; do
        if [[ "$n" == "$name" ]] && alive "$pid" && [[ "$(starttime "$pid")" == "$st" ]]; then
            return 0
        fi
    done <"$PIDS"
    return 1
}
record() { # NAME PIDFILE: wait for the daemon's pid file, then record pid and start time
    local name=$1 file=$2 pid="" i
    for ((i = 0; i < 100; i++)); do
        if [[ -s "$file" ]]; then
            pid=$(tr -dc 0-9 <"$file")
            [[ -n "$pid" ]] && alive "$pid" && break
        fi
        sleep 0.1
    done
    [[ -n "$pid" ]] && alive "$pid" || die "$name did not start (see $LOG/$name.log)"
    echo "$name $pid $(starttime "$pid")" >>"$PIDS"
    say "$name started (pid $pid) at $(elapsed) s"
}
# Bounded wait: wait_for SECONDS WHAT CMD...
wait_for() {
    local secs=$1 what=$2 i
    shift 2
    for ((i = 0; i < secs * 5; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "$what not ready after ${secs}s"
}

# --- already up? -----------------------------------------------------------------------------
if ours_alive slurmctld && ours_alive slurmd && timeout 5 sinfo -h >/dev/null 2>&1; then
    say "already running ($HOME_DIR)"
    echo "export SLURM_CONF=$SLURM_CONF" >"$HOME_DIR/env"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi
if [[ -f "$PIDS" ]]; then
    say "a previous start left $PIDS: stopping what is left of it first"
    SORTIE_SLURM_HOME="$HOME_DIR" "$(dirname "${BASH_SOURCE[0]}")/down.sh"
fi
# Never start next to a cluster we did not start: the ports are fixed.
for port in 6817 6818 6819; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port on 127.0.0.1 is in use by a daemon this script did not start"
    fi
done

# --- packages --------------------------------------------------------------------------------
PKGS=(munge slurm-client slurmctld slurmd)
if [[ "$ACCOUNTING" == 1 ]]; then
    # The -core packages: mariadb-server would pull perl and upgrade installed packages.
    PKGS+=(slurmdbd mariadb-server-core mariadb-client-core)
fi
MISSING=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || MISSING+=("$p")
done
if ((${#MISSING[@]})); then
    # Package scripts must not start daemons (no systemd here; we start them ourselves).
    POLICY_MADE=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        POLICY_MADE=1
    fi
    say "installing ${MISSING[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${MISSING[@]}" >/dev/null
    ((POLICY_MADE)) && rm -f /usr/sbin/policy-rc.d
    say "packages installed at $(elapsed) s"
fi

# --- configs ---------------------------------------------------------------------------------
NODE=$(hostname -s)
MEM=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
[[ -n "$MEM" ]] || MEM=1024
install -d -m 755 "$ETC" "$RUN" "$LOG" "$HOME_DIR/spool/ctld" "$HOME_DIR/spool/d"
rm -f "$PIDS"
if [[ "$ACCOUNTING" == 1 ]]; then
    ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
    ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
cat >"$ETC/slurm.conf" <<EOF
# Written by sortie's .ci/slurm/up.sh: a single-node cluster without systemd or cgroups.
ClusterName=ci
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$HOME_DIR/spool/ctld
SlurmdSpoolDir=$HOME_DIR/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
$ACCT
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmdTimeout=300
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
if [[ "$ACCOUNTING" == 1 ]]; then
    # slurmdbd reads slurmdbd.conf beside $SLURM_CONF; it must be 0600.
    cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$ETC/slurmdbd.conf"
fi

# --- munge -----------------------------------------------------------------------------------
# Slurm's auth/munge talks to munged's default socket: reuse a munged that is already running
# (we did not start it, so we leave it alone), else start our own.
if [[ -S /run/munge/munge.socket.2 ]] && timeout 5 munge -n </dev/null >/dev/null 2>&1; then
    say "munged already running (not ours: left alone)"
else
    [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key is missing (munge's postinst creates it)"
    install -d -o munge -g munge -m 755 /run/munge "$RUN/munge"
    rm -f "$RUN/munge/munged.pid"
    runuser -u munge -- /usr/sbin/munged --pid-file="$RUN/munge/munged.pid" \
        --log-file="$RUN/munge/munged.log" 2>>"$LOG/munged.log" || die "munged did not start"
    record munged "$RUN/munge/munged.pid"
    wait_for 10 munged sh -c 'munge -n </dev/null | unmunge'
fi

# --- MariaDB and slurmdbd ----------------------------------------------------------------------
if [[ "$ACCOUNTING" == 1 ]]; then
    DB="$HOME_DIR/mysql"
    if [[ ! -d "$DB/mysql" ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$DB" \
            --auth-root-authentication-method=socket --skip-test-db >"$LOG/mariadb-install.log" 2>&1 \
            || die "mariadb-install-db failed (see $LOG/mariadb-install.log)"
        say "database initialised at $(elapsed) s"
    fi
    # slurmdbd has no socket option: it uses libmariadb's default socket.
    [[ -S /run/mysqld/mysqld.sock ]] && die "/run/mysqld/mysqld.sock exists: a MariaDB this script did not start"
    install -d -m 755 /run/mysqld
    setsid nohup mariadbd --no-defaults --user=root --datadir="$DB" \
        --socket=/run/mysqld/mysqld.sock --pid-file="$RUN/mariadbd.pid" --skip-networking \
        --innodb-buffer-pool-size=64M --log-error="$LOG/mariadb.log" </dev/null >/dev/null 2>&1 &
    record mariadbd "$RUN/mariadbd.pid"
    wait_for 30 mariadb timeout 5 mariadb --no-defaults --socket=/run/mysqld/mysqld.sock -e 'select 1'
    slurmdbd || die "slurmdbd did not start (see $LOG/slurmdbd.log)"
    record slurmdbd "$RUN/slurmdbd.pid"
    wait_for 30 slurmdbd bash -c '(exec 3<>/dev/tcp/127.0.0.1/6819)'
fi

# --- slurmctld and slurmd ---------------------------------------------------------------------
# -c: forget the jobs of an earlier cluster (each start is a fresh cluster).
slurmctld -c || die "slurmctld did not start (see $LOG/slurmctld.log)"
record slurmctld "$RUN/slurmctld.pid"
slurmd -N "$NODE" || die "slurmd did not start (see $LOG/slurmd.log)"
record slurmd "$RUN/slurmd.pid"

node_idle() { [[ "$(timeout 5 sinfo -h -n "$NODE" -o %t 2>/dev/null)" == idle ]]; }
wait_for 60 "the node ($NODE idle in sinfo)" node_idle
say "node idle at $(elapsed) s"
wait_for 30 "a probe srun" timeout 10 srun -n1 -t 1 true
if [[ "$ACCOUNTING" == 1 ]]; then
    wait_for 30 sacct timeout 5 sacct -n -X -S now-1minutes
fi
say "cluster up at $(elapsed) s ($CPUS CPUs on $NODE, accounting=$ACCOUNTING, $HOME_DIR)"
echo "export SLURM_CONF=$SLURM_CONF" >"$HOME_DIR/env"
echo "export SLURM_CONF=$SLURM_CONF"

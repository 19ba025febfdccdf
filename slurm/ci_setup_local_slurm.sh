#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, for CI and for trying the sbatch scripts locally.
#
#   sudo slurm/ci_setup_local_slurm.sh            # install (Debian), configure, start, wait
#   slurm/ci_setup_local_slurm.sh --stop          # stop the daemons this script started
#
# Installs Debian's slurm-wlm + munge with apt-get, writes a slurm.conf for this host
# (CPUS cores, MEMORY_MB memory, no cgroup plugins: they fail inside containers), starts
# munged, slurmctld and slurmd directly (no systemd needed) and waits until `sinfo` shows
# the node idle.  Exit status 0: Slurm is up.  Anything else: it could not start here, and
# tests/training/test_slurm.py then skips with the reason this script printed.  Never fails CI by
# itself when called as `slurm/ci_setup_local_slurm.sh || true`.
#
# Environment (all optional):
#   SLURM_CPUS       CPUs the node offers          (default: nproc)
#   SLURM_MEMORY_MB  memory the node offers, MiB   (default: 80% of MemTotal)
#   SLURM_STATE_DIR  state, logs and spool         (default: /var/lib/toolorchestra-slurm)
#   SLURM_NO_INSTALL=1  skip apt-get (Slurm already installed)
#   SLURM_WAIT_S     seconds to wait for the node  (default: 60)
set -uo pipefail

STATE="${SLURM_STATE_DIR:-/var/lib/toolorchestra-slurm}"
CONF_DIR=/etc/slurm
WAIT_S="${SLURM_WAIT_S:-60}"
say() { echo "[ci_setup_local_slurm] $*" >&2; }
fail() { say "cannot start Slurm here: $*"; exit 1; }

stop_daemons() {
    for name in slurmd slurmctld munged; do
        pidfile="$STATE/$name.pid"
        if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            kill "$(cat "$pidfile")" && say "stopped $name (pid $(cat "$pidfile"))"
        fi
        rm -f "$pidfile"
    done
}

if [[ "${1:-}" == "--stop" ]]; then
    stop_daemons
    exit 0
fi

[[ "$(id -u)" == 0 ]] || fail "needs root (apt-get, daemons under /run and /etc/slurm); run it with sudo"

# ---------------------------------------------------------------------------- install
if [[ -z "${SLURM_NO_INSTALL:-}" ]] && ! command -v slurmctld >/dev/null; then
    command -v apt-get >/dev/null || fail "no apt-get (not Debian/Ubuntu): install slurm-wlm and munge yourself, then rerun with SLURM_NO_INSTALL=1"
    say "installing slurm-wlm and munge with apt-get (~1 min)"
    # Packages try to start their services on install; there is no init system in a
    # container, so forbid that (policy-rc.d exit 101) and start the daemons ourselves.
    policy=/usr/sbin/policy-rc.d
    created_policy=""
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q --no-install-recommends slurm-wlm munge; } >"/tmp/ci_setup_local_slurm.apt.log" 2>&1
    rc=$?
    [[ -n "$created_policy" ]] && rm -f "$policy"
    [[ $rc == 0 ]] || fail "apt-get install slurm-wlm munge failed (log /tmp/ci_setup_local_slurm.apt.log): $(tail -3 /tmp/ci_setup_local_slurm.apt.log)"
fi
for bin in munged slurmctld slurmd sinfo sbatch; do
    command -v "$bin" >/dev/null || fail "$bin not found after installing slurm-wlm/munge"
done

# ---------------------------------------------------------------------------- configure
stop_daemons
mkdir -p "$STATE"/{ctld,spool,log} /run/munge /var/log/munge /var/lib/munge "$CONF_DIR"
chown -R munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
fi

HOST="$(hostname -s)"
CPUS="${SLURM_CPUS:-$(nproc)}"
MEM_MB="${SLURM_MEMORY_MB:-$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)}"
# `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, no JobAcctGather cgroup:
# the cgroup plugins need a writable cgroup hierarchy that containers rarely grant.
# SlurmUser=root: the daemons run as root here (no slurm account needed).
# KillWait=30: the grace between SIGTERM and SIGKILL at a time limit or scancel, which
# the trainer uses to write a checkpoint (as on most real clusters).
cat > "$CONF_DIR/slurm.conf" <<EOF
# written by slurm/ci_setup_local_slurm.sh: a one-node cluster on $HOST
ClusterName=toolorchestra-ci
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MpiDefault=none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
say "wrote $CONF_DIR/slurm.conf (node $HOST, $CPUS CPUs, $MEM_MB MiB)"

# ---------------------------------------------------------------------------- start
munge_user=munge
id munge >/dev/null 2>&1 || munge_user=root
if [[ "$munge_user" == root ]]; then
    munged --force --pid-file="$STATE/munged.pid" || fail "munged did not start"
else
    su -s /bin/sh munge -c "munged --pid-file=/run/munge/munged.pid" || fail "munged did not start"
    sleep 0.5
    cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || true
fi
munge -n | unmunge >/dev/null 2>&1 || fail "munge credentials do not round-trip (munged not working)"
slurmctld -i || fail "slurmctld did not start (log $STATE/log/slurmctld.log): $(tail -3 "$STATE/log/slurmctld.log" 2>/dev/null)"
slurmd || fail "slurmd did not start (log $STATE/log/slurmd.log): $(tail -3 "$STATE/log/slurmd.log" 2>/dev/null)"

deadline=$((SECONDS + WAIT_S))
while (( SECONDS < deadline )); do
    state="$(sinfo -h -n "$HOST" -o %t 2>/dev/null | head -1)"
    if [[ "$state" == idle ]]; then
        say "node $HOST is idle: Slurm is up ($(sinfo --version))"
        exit 0
    fi
    if [[ "$state" == down* || "$state" == drain* ]]; then
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    fi
    sleep 1
done
fail "node $HOST not idle after ${WAIT_S} s (state '${state:-?}'); logs in $STATE/log"

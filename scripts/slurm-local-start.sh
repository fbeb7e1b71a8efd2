#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine (munge + slurmctld + slurmd), for trying the
# Slurm profiles and for tests. Idempotent: installs Debian's packages if missing, writes the config,
# starts only what is not running, resumes a DRAIN/INVAL node, waits until the node is idle.
# Needs root. Everything lives in $LLMPIPE_SLURM_DIR (default /tmp/llmpipe-slurm); the config is
# linked from /etc/slurm/slurm.conf, where every client looks (job steps drop $SLURM_CONF).
# Environment: LLMPIPE_SLURM_CPUS (default: nproc), LLMPIPE_SLURM_MEM_MB (default: 90% of RAM),
# LLMPIPE_SLURM_WAIT (seconds to wait for an idle node, default 60). Stop: scripts/slurm-local-stop.sh
set -euo pipefail

STATE=${LLMPIPE_SLURM_DIR:-/tmp/llmpipe-slurm}
CONF=$STATE/slurm.conf
WAIT=${LLMPIPE_SLURM_WAIT:-60}
say() { echo "slurm-local: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
# alive PIDFILE NAME: the pid in PIDFILE runs and is NAME (not a reused pid).
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and runs slurmd)"

# 1. Packages (Debian/Ubuntu: slurm-wlm 22.05 on Debian 12).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || die "slurmctld/slurmd/sbatch/munged missing and no apt-get to install them"
    say "installing slurmctld slurmd slurm-client munge (apt-get)"
    apt-get update -qq >&2 || die "apt-get update failed (no network to the Debian mirror?)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >&2 || die "apt-get install of slurm packages failed"
fi

# 2. Config (rewritten each time; a change restarts the daemons this script started).
CPUS=${LLMPIPE_SLURM_CPUS:-$(nproc)}
MEM_MB=${LLMPIPE_SLURM_MEM_MB:-$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)}
mkdir -p "$STATE/state" "$STATE/spool" "$STATE/munge"
chmod 0755 "$STATE"
NEW=$(cat <<EOF
# Written by scripts/slurm-local-start.sh: a one-node sandbox cluster (no accounting, no cgroups).
ClusterName=llmpipe
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# One line per finished job: the test's job log.
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.log
ReturnToService=2
SlurmdParameters=config_overrides
# Impossible requests (too many CPUs, nodes, GPUs, memory) fail at submit, not pend forever.
EnforcePartLimits=ALL
# Finished jobs stay visible to squeue this long (Snakemake's status checks use squeue).
MinJobAge=600
MailProg=/bin/true
DefMemPerCPU=1000
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
)
# Two fake GPUs (character devices) so gres/gpu requests can be checked for real.
GRES=$'Name=gpu File=/dev/null\nName=gpu File=/dev/zero'
changed=0
if [ ! -f "$CONF" ] || [ "$NEW" != "$(cat "$CONF")" ] || [ "$GRES" != "$(cat "$STATE/gres.conf" 2>/dev/null)" ]; then
    changed=1
    printf '%s\n' "$NEW" > "$CONF"
    printf '%s\n' "$GRES" > "$STATE/gres.conf"
fi
# Clients (sbatch, srun inside jobs, squeue) read /etc/slurm/slurm.conf: link ours there.
if [ -e /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" != "$CONF" ]; then
    die "/etc/slurm/slurm.conf exists and is not this sandbox's; refusing to replace a real cluster's config"
fi
mkdir -p /etc/slurm && ln -sfn "$CONF" /etc/slurm/slurm.conf
if [ "$changed" = 1 ] && { alive "$STATE/slurmctld.pid" slurmctld || alive "$STATE/slurmd.pid" slurmd; }; then
    say "config changed: restarting the daemons"
    LLMPIPE_SLURM_RESTARTING=1 "$(dirname "$0")/slurm-local-stop.sh"
fi

# 3. munge (reuse a running one; else start ours and remember its pid).
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m 0700 /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    chown munge:munge "$STATE/munge"
    say "starting munged"
    runuser -u munge -- munged --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
        || die "munged failed to start: see $STATE/munge/munged.log"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munge does not work: see $STATE/munge/munged.log"
    cp "$STATE/munge/munged.pid" "$STATE/munged.pid"  # the stop script kills only pids listed here
fi

# 4. Daemons.
if ! alive "$STATE/slurmctld.pid" slurmctld; then
    say "starting slurmctld"
    slurmctld -f "$CONF" || die "slurmctld failed: see $STATE/slurmctld.log"
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
scontrol ping | grep -q UP || die "slurmctld does not answer: see $STATE/slurmctld.log"
if ! alive "$STATE/slurmd.pid" slurmd; then
    say "starting slurmd"
    slurmd -f "$CONF" -N localhost || die "slurmd failed: see $STATE/slurmd.log"
fi

# 5. Wait for an idle node; a state left over from an earlier run (drain, inval, down) is resumed.
state=""
for _ in $(seq $((WAIT * 2))); do
    state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
    case "$state" in
        idle | mix | alloc) break ;;
        drain* | drng | inval | down*) scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle | mix | alloc) ;;
    *) die "node not idle after ${WAIT}s (state '$state'; reason: $(sinfo -h -R -o %E)); see $STATE/slurmd.log" ;;
esac
say "up: node localhost $state, $CPUS CPUs, $MEM_MB MB, 2 fake GPUs; job log $STATE/jobcomp.log"

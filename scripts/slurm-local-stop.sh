#!/usr/bin/env bash
# Stop the cluster scripts/slurm-local-start.sh started: cancel its jobs, then end only the daemons
# whose pids are in $LLMPIPE_SLURM_DIR (default /tmp/llmpipe-slurm). Config, logs and the job log
# (jobcomp.log) stay for inspection. Safe to run when nothing is running.
set -euo pipefail

STATE=${LLMPIPE_SLURM_DIR:-/tmp/llmpipe-slurm}
say() { echo "slurm-local: $*" >&2; }
# alive PIDFILE NAME: the pid in PIDFILE runs and is NAME (not a reused pid).
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }

if alive "$STATE/slurmctld.pid" slurmctld; then
    jobs=$(squeue -h -t PD,R,CG,S -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        say "cancelling jobs: $(echo $jobs)"
        scancel $jobs 2>/dev/null || true
        for _ in $(seq 40); do
            [ -z "$(squeue -h -t PD,R,CG,S -o %A 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
fi

stop_pid() {  # name, pid file
    local pid
    alive "$2" "$1" || { rm -f "$2"; return 0; }
    pid=$(cat "$2")
    say "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        say "$1 (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$2"
}

stop_pid slurmd "$STATE/slurmd.pid"
stop_pid slurmctld "$STATE/slurmctld.pid"
[ -n "${LLMPIPE_SLURM_RESTARTING:-}" ] || stop_pid munged "$STATE/munged.pid"
# The /etc/slurm/slurm.conf link goes too (only if it is ours), unless the start script restarts.
if [ -z "${LLMPIPE_SLURM_RESTARTING:-}" ] && [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$STATE/slurm.conf" ]; then
    rm -f /etc/slurm/slurm.conf
fi
say "stopped (state kept in $STATE)"

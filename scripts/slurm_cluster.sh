#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for testing profiles/slurm end to end.
#
#   scripts/slurm_cluster.sh start    # install slurm-wlm + munge if missing, start munged/slurmctld/slurmd,
#                                     # wait until the node is idle; prints `export SLURM_CONF=... PATH=...` on stdout
#   scripts/slurm_cluster.sh status   # exit 0 when the controller answers and the node is up, 3 when down
#   scripts/slurm_cluster.sh stop     # cancel jobs, stop the daemons this script started
#   scripts/slurm_cluster.sh env      # print the exports (use: eval "$(scripts/slurm_cluster.sh env)")
#
# Everything lives in a scratch directory ($GYMFORGE_SLURM_DIR, default /tmp/gymforge-slurm): slurm.conf,
# a private munged socket, state, spool, pid and log files. Nothing is written to /etc/slurm, so SLURM
# clients only talk to this cluster when SLURM_CONF points at its slurm.conf. That is deliberate: with a
# slurm.conf in /etc/slurm but no controller running, every `scontrol show config` (which the Snakemake
# SLURM executor plugin runs when it is imported, i.e. on EVERY snakemake call) waits ~10 s for the
# controller; with no /etc/slurm/slurm.conf it fails in milliseconds. So starting, stopping or leaving
# this cluster installed never slows down other snakemake invocations.
#
# Exit codes: 0 ok, 1 failure (daemon logs are shown), 2 usage, 3 `status`: not running,
# 77 cannot run here (not root and SLURM missing, no apt-get, ...): callers treat 77 as "skip".
set -euo pipefail

DIR="${GYMFORGE_SLURM_DIR:-/tmp/gymforge-slurm}"
CONF="$DIR/etc/slurm.conf"
CTLD_PORT="${GYMFORGE_SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${GYMFORGE_SLURMD_PORT:-6818}"
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
NODE=localhost
READY_TIMEOUT="${GYMFORGE_SLURM_READY_TIMEOUT:-60}"
# Fake GPUs (at most 5): generic resources backed by /dev/null-like devices, so `--gpus=N` jobs schedule and SLURM sets
# CUDA_VISIBLE_DEVICES in them exactly as on a GPU node (nothing can actually compute on them). 0: none.
FAKE_GPUS="${GYMFORGE_SLURM_GPUS:-2}"

say() { echo "slurm_cluster: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
skip() { say "SKIP: $*"; exit 77; }

show_logs() {
    local f
    for f in "$DIR"/log/munged.log "$DIR"/log/slurmctld.log "$DIR"/log/slurmd.log "$DIR"/log/*.out; do
        [ -s "$f" ] || continue
        echo "----- tail of $f -----" >&2
        tail -n 25 "$f" >&2
    done
}

fail_with_logs() { say "ERROR: $*"; show_logs; exit 1; }

pid_alive() {  # pidfile
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# Clients find this cluster through SLURM_CONF, plus an srun shim first on PATH: the Snakemake SLURM jobstep
# strips all SLURM_* variables (SLURM_CONF too) before its nested `srun`, which on a real cluster then reads
# /etc/slurm/slurm.conf; here the shim puts SLURM_CONF back. The PATH entry travels into the jobs with
# sbatch --export=ALL (the plugin's default).
export_line() { echo "export SLURM_CONF=$CONF PATH=$DIR/bin:\$PATH"; }

write_shims() {
    local real
    real="$(PATH="$(echo "$PATH" | tr ':' '\n' | grep -vx "$DIR/bin" | paste -sd: -)" command -v srun)" ||
        die "srun not found after installing slurm-wlm"
    mkdir -p "$DIR/bin"
    printf '%s\n' '#!/bin/sh' \
        '# Written by scripts/slurm_cluster.sh: srun for the private test cluster (see export_line there).' \
        "SLURM_CONF=\"\${SLURM_CONF:-$CONF}\" exec $real \"\$@\"" >"$DIR/bin/srun"
    chmod 0755 "$DIR/bin/srun"
}

controller_up() {
    [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid" && SLURM_CONF="$CONF" timeout 10 scontrol ping 2>/dev/null | grep -q "is UP"
}

node_state() {
    { SLURM_CONF="$CONF" timeout 10 sinfo -h -N -n "$NODE" -o %t 2>/dev/null || true; } | head -n 1 | tr -d '*~#$@ '
}

ensure_installed() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || skip "SLURM is not installed (${missing[*]}) and installing it needs root"
    command -v apt-get >/dev/null 2>&1 || skip "SLURM is not installed (${missing[*]}) and there is no apt-get to install it"
    say "installing ${missing[*]} with apt-get (~20-60 s)"
    local log="${TMPDIR:-/tmp}/gymforge-slurm-apt.log"
    # Wait for dpkg's lock rather than fail on it: another setup (the docker sandbox's, a parallel test
    # worker's) may be installing packages at the same moment.
    local apt=(apt-get -o DPkg::Lock::Timeout=600)
    if ! { "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" slurm-client >"$log" 2>&1 ||
           { "${apt[@]}" update -qq >>"$log" 2>&1 &&
             "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" slurm-client >>"$log" 2>&1; }; }; then
        tail -n 20 "$log" >&2
        skip "apt-get install ${missing[*]} failed (see $log)"
    fi
    command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || die "installed packages but slurmctld/munged still missing"
}

write_conf() {
    local cpus mem
    cpus="$(nproc)"
    # 90% of physical memory, leaving room for the OS; jobs asking for more are rejected at submission.
    mem="$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)"
    local gres="" i
    mkdir -p "$DIR/etc"
    : >"$DIR/etc/gres.conf"
    if [ "$FAKE_GPUS" -gt 0 ]; then
        # gres needs character devices: harmless ones stand in for /dev/nvidia<i>.
        local devices=(/dev/null /dev/zero /dev/full /dev/random /dev/urandom)
        [ "$FAKE_GPUS" -le ${#devices[@]} ] || die "GYMFORGE_SLURM_GPUS=$FAKE_GPUS: at most ${#devices[@]} fake GPUs"
        gres=" Gres=gpu:$FAKE_GPUS"
        for i in $(seq 0 $((FAKE_GPUS - 1))); do
            echo "Name=gpu File=${devices[$i]}" >>"$DIR/etc/gres.conf"
        done
    fi
    cat >"$CONF" <<EOF
# Written by scripts/slurm_cluster.sh: a single-node test cluster (no accounting daemon).
ClusterName=gymforge
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# squeue keeps finished jobs this long: the Snakemake plugin's --slurm-status-command squeue needs >= 120 s, and the
# end-to-end check asks squeue for every job of its run after the run (over 300 s on a loaded 2-core machine).
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MailProg=/bin/true
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN
# Two partitions on the one node, named like the placeholders in profiles/slurm/config.yaml.
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$NODE MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist (the munge package creates it)"
    local key=/etc/munge/munge.key
    if [ ! -s "$key" ]; then
        say "creating $key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile="$key"; else dd if=/dev/urandom bs=1 count=1024 of="$key" status=none; fi
        chown munge:munge /etc/munge "$key"
        chmod 0700 /etc/munge
        chmod 0600 "$key"
    fi
    mkdir -p "$DIR/munge"
    chown munge:munge "$DIR/munge"
    chmod 0755 "$DIR/munge"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    : >"$DIR/log/munged.log"
    chown munge:munge "$DIR/log/munged.log"
    # munged runs as the munge user and writes its pid file into its own directory.
    if ! runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file="$DIR/munge/munged.pid" \
            --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --key-file="$key" \
            </dev/null >>"$DIR/log/munged.out" 2>&1; then
        fail_with_logs "munged failed to start"
    fi
    local i
    for i in $(seq 1 50); do
        [ -s "$DIR/munge/munged.pid" ] && break
        sleep 0.1
    done
    munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 ||
        fail_with_logs "munged is not answering on $MUNGE_SOCKET"
}

start_daemon() {  # name, command...
    local name="$1"
    shift
    # Own session, no inherited stdio: callers that capture our output (pytest) must not wait on the daemon.
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    echo $! >"$DIR/run/$name.launcher.pid"
}

cmd_start() {
    if controller_up; then
        local state
        state="$(node_state)"
        case "$state" in
            idle | mix | alloc | comp)
                say "reusing the running cluster in $DIR (node $NODE: $state)"
                export_line
                return 0
                ;;
        esac
        say "controller is up but node is '$state'; restarting the cluster"
        cmd_stop >/dev/null
    fi
    if [ "$(id -u)" != 0 ]; then
        skip "starting slurmctld/slurmd/munged needs root (running as uid $(id -u))"
    fi
    command -v setsid >/dev/null 2>&1 || skip "setsid (util-linux) is missing"
    ensure_installed
    # Leftovers of an earlier cluster (crashed or killed) are stopped first, then state starts clean.
    cmd_stop >/dev/null 2>&1 || true
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log" "$DIR/bin"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log" "$DIR/etc"
    write_conf
    write_shims
    start_munge
    say "starting slurmctld and slurmd ($CONF)"
    start_daemon slurmctld slurmctld -D -f "$CONF"
    local i
    for i in $(seq 1 100); do
        controller_up && break
        pid_alive "$DIR/run/slurmctld.launcher.pid" || fail_with_logs "slurmctld exited during start-up"
        sleep 0.2
    done
    controller_up || fail_with_logs "slurmctld did not answer 'scontrol ping' within 20 s"
    start_daemon slurmd env SLURM_CONF="$CONF" slurmd -D -f "$CONF" -N "$NODE"
    local deadline=$((SECONDS + READY_TIMEOUT)) state=""
    while [ $SECONDS -lt $deadline ]; do
        pid_alive "$DIR/run/slurmd.launcher.pid" || fail_with_logs "slurmd exited during start-up"
        state="$(node_state)"
        case "$state" in
            idle) break ;;
            down | drain | drng | fail) SLURM_CONF="$CONF" scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    [ "$state" = idle ] || fail_with_logs "node $NODE is '$state', not idle, after ${READY_TIMEOUT} s"
    say "cluster up in $DIR: $(SLURM_CONF="$CONF" sinfo -h -o '%P %a %D %t %G' | tr '\n' ';')"
    export_line
}

stop_pidfile() {  # pidfile name
    local pidfile="$1" name="$2" pid i
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$name ($pid) ignored SIGTERM; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
}

cmd_stop() {
    if controller_up; then
        SLURM_CONF="$CONF" scancel --full --quiet --partition=debug,gpu 2>/dev/null || true
        SLURM_CONF="$CONF" scancel --quiet --partition=debug,gpu 2>/dev/null || true
    fi
    # The daemons' own pid files first, then the launchers (same pids in -D mode).
    stop_pidfile "$DIR/run/slurmd.pid" slurmd
    stop_pidfile "$DIR/run/slurmd.launcher.pid" slurmd
    stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
    stop_pidfile "$DIR/run/slurmctld.launcher.pid" slurmctld
    stop_pidfile "$DIR/munge/munged.pid" munged
    say "stopped (state and logs kept in $DIR)"
    warn_system_conf
}

# A slurm.conf in /etc/slurm whose controller is down costs every snakemake call ~10 s (plugin import).
warn_system_conf() {
    [ -f /etc/slurm/slurm.conf ] || return 0
    if ! env -u SLURM_CONF timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; then
        say "WARNING: /etc/slurm/slurm.conf exists but its controller does not answer: every snakemake call" \
            "now waits ~10 s while importing the SLURM plugin (not written by this script; move it away)"
    fi
}

cmd_status() {
    warn_system_conf
    if controller_up; then
        local state
        state="$(node_state)"
        echo "running: $CONF; node $NODE: ${state:-unknown}"
        SLURM_CONF="$CONF" sinfo >&2 || true
        case "$state" in idle | mix | alloc | comp) return 0 ;; esac
        return 3
    fi
    echo "not running ($DIR)"
    return 3
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) export_line ;;
    logs) show_logs ;;
    *)
        echo "usage: $0 start|stop|status|env|logs   (scratch dir: \$GYMFORGE_SLURM_DIR, now $DIR)" >&2
        exit 2
        ;;
esac

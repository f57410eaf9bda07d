#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (munge,
# slurmctld, slurmd, slurm-client; scripts/install-deps.sh installs them), for
# the tests and for trying backplane under srun and sbatch.
#
#   local-slurm.sh up|down|status|env [--dir DIR] [--port PORT] [--first-job-id N]
#                  [--timeout SECONDS] [--keep]
#
#   up      writes DIR/slurm.conf (this machine as the only node, with the CPUs
#           and memory `slurmd -C` reports; one partition, "local"), makes a
#           munge key if there is none, starts munged, slurmctld and slurmd in
#           the background (pid files and logs in DIR) and waits until the node
#           is idle. Prints the line to run before srun, sbatch, squeue, ...:
#             export SLURM_CONF=DIR/slurm.conf
#           Running `up` again while the cluster is up changes nothing.
#   down    cancels the cluster's jobs, stops the three daemons (and any step
#           or task of its jobs left behind) and removes DIR; with --keep, DIR
#           stays (logs, state). Running `down` again, or without `up`, is fine.
#   status  says whether each daemon runs and shows `sinfo` and `squeue`;
#           exits 0 when the node is up, 3 when the cluster is down.
#   env     prints `export SLURM_CONF=...`: eval "$(local-slurm.sh env)".
#
# DIR defaults to /var/lib/backplane-slurm; PORT (slurmctld's; slurmd takes
# PORT+1) to 16817, away from Slurm's own 6817/6818 so that a real cluster on
# this machine keeps working. --first-job-id (default 1) numbers the jobs
# from N: backplane derives a job's store port from its id, so clusters that
# run at once should number their jobs apart. Nothing outside DIR is
# written: no /etc/slurm, no /etc/munge, no systemd units; the daemons talk
# over loopback and their own munge socket (DIR/munge/munge.socket) with
# their own key. Several clusters may run at once with different DIRs,
# PORTs and first job ids. Needs root (slurmd starts tasks as the
# submitting user); works in a container without systemd.
# Exit codes: 0 done, 1 failed (the logs' last lines are shown), 2 not
# possible here (not root, packages missing), 3 status: down, 64 usage.
set -euo pipefail

readonly default_dir=/var/lib/backplane-slurm
readonly marker=.backplane-local-slurm
command="${1:-}"
[[ $# -gt 0 ]] && shift
dir="$default_dir"
port=16817
first_job_id=1
timeout=60
keep=0
usage() {
  echo "usage: local-slurm.sh up|down|status|env [--dir DIR] [--port PORT] [--first-job-id N] [--timeout SECONDS] [--keep]" >&2
  exit 64
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) [[ $# -ge 2 ]] || usage; dir="$2"; shift 2 ;;
    --port) [[ $# -ge 2 ]] || usage; port="$2"; shift 2 ;;
    --first-job-id) [[ $# -ge 2 ]] || usage; first_job_id="$2"; shift 2 ;;
    --timeout) [[ $# -ge 2 ]] || usage; timeout="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "local-slurm.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case "$command" in
  up | down | status | env) ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) usage ;;
esac
[[ "$port" =~ ^[0-9]+$ ]] && ((port >= 1024 && port <= 65534)) || {
  echo "local-slurm.sh: --port must be 1024..65534 (slurmd takes PORT+1), got '$port'" >&2
  exit 64
}
[[ "$first_job_id" =~ ^[0-9]+$ ]] && ((first_job_id >= 1 && first_job_id <= 60000000)) || {
  echo "local-slurm.sh: --first-job-id must be 1..60000000, got '$first_job_id'" >&2
  exit 64
}
[[ "$timeout" =~ ^[0-9]+$ ]] && ((timeout > 0)) || {
  echo "local-slurm.sh: --timeout must be a whole number of seconds, got '$timeout'" >&2
  exit 64
}
mkdir -p "$(dirname "$dir")" 2>/dev/null || true
dir="$(realpath -m "$dir")"
conf="$dir/slurm.conf"
run="$dir/run"
logs="$dir/log"
socket="$dir/munge/munge.socket"
export SLURM_CONF="$conf"

say() { echo "local-slurm: $*"; }
die() {
  echo "local-slurm: error: $*" >&2
  exit 1
}
cannot() {
  echo "local-slurm: cannot run here: $*" >&2
  exit 2
}

# The pid in DIR/run/NAME.pid when that process is alive and is this
# cluster's daemon (its command line names DIR), so that a reused pid is never
# signalled.
daemon_pid() {
  local file="$run/$1.pid" pid
  [[ -r "$file" ]] || return 1
  pid="$(tr -dc '0-9' <"$file")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/" || return 1
  echo "$pid"
}

# What this cluster's jobs left running after slurmd stopped: its steps
# (slurmstepd) and their tasks, whose environment names this SLURM_CONF and,
# for tasks, a job id. Never this script or its callers.
leftovers() {
  local p pid env ours=" $$ $BASHPID " a=$$
  while [[ "$a" -gt 1 ]]; do
    a="$(awk '{print $4}' "/proc/$a/stat" 2>/dev/null || echo 1)"
    ours+="$a "
  done
  for p in /proc/[0-9]*; do
    pid="${p#/proc/}"
    [[ "$ours" == *" $pid "* ]] && continue
    env="$(tr '\0' '\n' 2>/dev/null <"$p/environ")" || continue
    grep -qxF "SLURM_CONF=$conf" <<<"$env" || continue
    if [[ "$(cat "$p/comm" 2>/dev/null)" == slurmstepd ]] || grep -q '^SLURM_JOB_ID=' <<<"$env"; then
      echo "$pid"
    fi
  done
  return 0
}

# stop_pids PID...: SIGTERM to each, then SIGKILL to those left after 10 s.
stop_pids() {
  local pid i left
  (($# > 0)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    left=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    ((${#left[@]} > 0)) || return 0
    sleep 0.05
  done
  say "pids ${left[*]} did not stop within 10 s; killing them"
  kill -KILL "${left[@]}" 2>/dev/null || true
}

show_logs() {
  local f
  for f in "$logs"/*.log; do
    [[ -s "$f" ]] || continue
    echo "--- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
}

node_state() { sinfo -h -N -o '%T' 2>/dev/null | head -n 1; }

status() {
  local name pid up=0
  for name in munged slurmctld slurmd; do
    if pid="$(daemon_pid "$name")"; then
      say "$name runs (pid $pid)"
      up=$((up + 1))
    else
      say "$name is not running"
    fi
  done
  if ((up == 0)); then
    say "the cluster in $dir is down"
    exit 3
  fi
  echo "export SLURM_CONF=$conf"
  sinfo || true
  squeue || true
  [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing) ]] || exit 1
}

down() {
  local name pid i pids
  if [[ -e "$dir" && ! -e "$dir/$marker" ]]; then
    die "$dir was not made by local-slurm.sh (no $marker in it); not touching it"
  fi
  if daemon_pid slurmctld >/dev/null; then
    scancel --full --quiet --partition=local 2>/dev/null || true
    # Running jobs end within KillWait (10 s); wait for the queue to empty so
    # that slurmd is not stopped under its steps (unless slurmd is gone, and
    # with it any chance of their ending).
    for ((i = 0; i < 30; i++)); do
      daemon_pid slurmd >/dev/null || break
      [[ -z "$(squeue -h -o %A 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi
  # slurmd and slurmctld together (each takes a second or two to stop),
  # then what the jobs left behind, then munged, which both talked to.
  pids=()
  for name in slurmd slurmctld; do
    if pid="$(daemon_pid "$name")"; then pids+=("$pid"); fi
  done
  stop_pids "${pids[@]}"
  # shellcheck disable=SC2046  # one pid a word
  stop_pids $(leftovers)
  if pid="$(daemon_pid munged)"; then stop_pids "$pid"; fi
  if [[ -e "$dir" ]]; then
    if ((keep)); then
      say "stopped; $dir is kept (logs in $logs)"
    else
      rm -rf -- "$dir"
      say "stopped; removed $dir"
    fi
  else
    say "nothing to stop in $dir"
  fi
}

write_conf() {
  local host node_line
  node_line="$(slurmd -C 2>/dev/null | grep -m1 '^NodeName=')" ||
    die "\`slurmd -C\` did not report this machine's resources"
  host="${node_line%% *}"
  host="${host#NodeName=}"
  # Everything slurmd -C reports but its uptime: CPUs, sockets, cores,
  # threads, RealMemory.
  node_line="$(sed 's/ UpTime=.*//' <<<"$node_line")"
  cat >"$conf.tmp" <<EOF
# Written by scripts/local-slurm.sh: a one-node cluster on this machine.
ClusterName=backplane
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
PlugStackConfig=$dir/plugstack.conf
# No cgroups: processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# A cancelled or requeued job's tasks get SIGTERM, then SIGKILL after KillWait.
KillWait=10
InactiveLimit=0
MinJobAge=300
FirstJobId=$first_job_id
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$conf.tmp" "$conf"
}

up() {
  local name missing=() pid state deadline
  [[ "$(id -u)" -eq 0 ]] || cannot "needs root: slurmd starts each task as the user who submitted it (running as uid $(id -u))"
  for name in munged mungekey slurmctld slurmd sinfo squeue scancel srun sbatch scontrol; do
    command -v "$name" >/dev/null 2>&1 || missing+=("$name")
  done
  ((${#missing[@]} == 0)) ||
    cannot "${missing[*]} not found; scripts/install-deps.sh installs munge, slurmctld, slurmd and slurm-client"
  if [[ -e "$dir" && ! -e "$dir/$marker" && -n "$(ls -A "$dir" 2>/dev/null)" ]]; then
    die "$dir exists, is not empty and was not made by local-slurm.sh; choose another --dir"
  fi
  mkdir -p "$dir" "$run" "$logs" "$dir/state" "$dir/spool" "$dir/munge"
  # munged refuses a socket folder or key that others may write.
  chmod 0755 "$dir" "$dir/munge"
  chmod 0700 "$dir/state" "$dir/spool"
  touch "$dir/$marker" "$dir/plugstack.conf"

  local running=0
  for name in munged slurmctld slurmd; do daemon_pid "$name" >/dev/null && running=$((running + 1)); done
  if ((running == 0)); then
    write_conf
  elif ! [[ -r "$conf" ]]; then
    die "daemons of $dir run but $conf is gone; run local-slurm.sh down --dir $dir first"
  fi

  if ! daemon_pid munged >/dev/null; then
    [[ -s "$dir/munge/munge.key" ]] || mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
    chmod 0600 "$dir/munge/munge.key"
    munged --socket="$socket" --key-file="$dir/munge/munge.key" --pid-file="$run/munged.pid" \
      --log-file="$logs/munged.log" --seed-file="$dir/munge/munged.seed" ||
      { show_logs; die "munged did not start"; }
  fi
  if ! daemon_pid slurmctld >/dev/null; then
    # -i: ignore the state of an earlier cluster in this folder (there is
    # none after down; a crashed one's is not worth keeping).
    slurmctld -f "$conf" -i || { show_logs; die "slurmctld did not start"; }
  fi
  if ! daemon_pid slurmd >/dev/null; then
    slurmd -f "$conf" || { show_logs; die "slurmd did not start"; }
  fi

  deadline=$((SECONDS + timeout))
  while :; do
    state="$(node_state)"
    [[ "$state" == idle || "$state" == mixed || "$state" == allocated ]] && break
    for name in munged slurmctld slurmd; do
      daemon_pid "$name" >/dev/null || { show_logs; die "$name exited while the cluster started"; }
    done
    if ((SECONDS >= deadline)); then
      show_logs
      die "the node is not idle after ${timeout} s (sinfo says '${state:-nothing}')"
    fi
    sleep 0.5
  done
  say "up: node $(sinfo -h -N -o '%N, %c CPUs, %m MB, %T' | head -n 1), partition local; logs in $logs"
  echo "export SLURM_CONF=$conf"
}

case "$command" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
esac

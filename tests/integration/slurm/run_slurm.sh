#!/usr/bin/env bash
# backplane under a real Slurm: a one-node cluster made by
# scripts/local-slurm.sh in a private folder, on free ports, then
#
#   1. `srun -n 2` of collective_worker: the ranks take rank, world size and
#      local rank from srun, the store's address and port from the job (no
#      MASTER_ADDR/MASTER_PORT), and every collective checks out;
#   2. examples/slurm/train.sbatch to completion: the uninterrupted result
#      (metrics.json, model.safetensors);
#   3. the same job again, `scontrol requeue`d once its first checkpoint is
#      written: Slurm kills it and starts it again, it resumes from its
#      checkpoint, and it ends with byte-identical weights and the same
#      metrics (test accuracy, every epoch's loss) as step 2;
#
# and the cluster goes down however the script ends (a trap).
#
#   run_slurm.sh --cli BACKPLANE --worker COLLECTIVE_WORKER --config BACKENDS_JSON
#                --data DIGITS_CSV --source REPO_ROOT --out DIR [--sanitize WHAT]
#
# Exits 0 when every check passes, 1 when one fails, and 77 (the test's
# SKIP_RETURN_CODE) with the reason when it cannot run here: not root, Slurm
# or munge not installed, fewer than 2 CPUs, or a sanitizer build (the
# daemons' tasks would run instrumented binaries for minutes, and the
# sanitizer builds test the same code without Slurm).
set -uo pipefail

cli="" worker="" config="" data="" source="" out="" sanitize=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --worker) worker="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --source) source="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --sanitize) sanitize="$2"; shift 2 ;;
    *) echo "run_slurm.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
if [[ -z "$cli" || -z "$worker" || -z "$config" || -z "$data" || -z "$source" || -z "$out" ]]; then
  echo "usage: run_slurm.sh --cli FILE --worker FILE --config FILE --data FILE --source DIR --out DIR [--sanitize WHAT]" >&2
  exit 64
fi

# Seconds any one phase may take, whatever happens: the three together stay
# well inside the test's TIMEOUT, so that the trap always takes the cluster
# down (ctest's kill at the TIMEOUT would leave it running).
readonly job_limit=150

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
failed=0
started="$(now)"

# --- Can this machine run it? -------------------------------------------------
[[ -z "$sanitize" ]] || skip "a sanitizer build ($sanitize); the release build runs this test"
[[ "$(id -u)" -eq 0 ]] || skip "needs root to start slurmd (running as uid $(id -u))"
for tool in munged mungekey slurmctld slurmd srun sbatch scontrol squeue sinfo scancel; do
  command -v "$tool" >/dev/null 2>&1 ||
    skip "$tool is not installed (scripts/install-deps.sh installs munge, slurmctld, slurmd and slurm-client)"
done
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed (it compares the metrics)"
[[ "$(nproc)" -ge 2 ]] || skip "the 2-task jobs need 2 CPUs, this machine has $(nproc)"

# Absolute paths: the jobs run in another folder.
source="$(realpath "$source")" cli="$(realpath "$cli")" worker="$(realpath "$worker")"
config="$(realpath "$config")" data="$(realpath "$data")"
local_slurm="$source/scripts/local-slurm.sh"
# The training job: long enough (a few thousand steps, about 10 s on 2 busy
# cores) that the requeue lands well inside it, short enough for CI.
train_args=(--epochs 12 --batch-size 4 --seed 3 --config "$config" --data "$data")
sbatch_file="$source/examples/slurm/train.sbatch"

# Clusters of runs killed before their trap ran (ctest's TIMEOUT, a lost
# machine): older than any run lasts.
for stale in /tmp/bp-slurm-test.*; do
  [[ -d "$stale" && -n "$(find "$stale" -maxdepth 0 -mmin +30 2>/dev/null)" ]] || continue
  echo "taking down the stale cluster in $stale"
  "$local_slurm" down --dir "$stale" || true
done
bindir="$(dirname "$(realpath "$cli")")"
rm -rf "$out"
mkdir -p "$out"
out="$(realpath "$out")"
# The cluster's folder: short (munge's socket path must fit a sockaddr_un)
# and private to this run.
cluster="$(mktemp -d /tmp/bp-slurm-test.XXXXXX)"
# Two free consecutive ports below the ephemeral range (slurmctld, slurmd),
# and outside the stores' 10000..29999.
port="$(python3 - <<'EOF'
import random, socket
for _ in range(200):
    p = random.randrange(30000, 32700)
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", q)); s.close()
        print(p); break
    except OSError:
        pass
EOF
)"
[[ -n "$port" ]] || { echo "FAIL: no two free ports in 30000..32700"; exit 1; }

show_logs() {
  local f
  for f in "$cluster"/log/*.log "$out"/*.out; do
    [[ -s "$f" ]] || continue
    echo "--- last lines of $f"
    tail -n 25 "$f"
  done
}
cleanup() {
  ((failed)) && show_logs
  "$local_slurm" down --dir "$cluster" || true
  echo "took $(secs "$started" "$(now)") s in all"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; failed=1; exit 1' INT TERM

t0="$(now)"
# Jobs numbered from a random id: their stores' ports (10000 + id % 20000)
# then differ from those of another run of this test at the same time.
first_job_id=$((1000 + RANDOM * 30 + RANDOM % 30))
if ! "$local_slurm" up --dir "$cluster" --port "$port" --first-job-id "$first_job_id" --timeout 60; then
  failed=1
  echo "FAIL: local-slurm.sh up"
  exit 1
fi
echo "cluster up in $(secs "$t0" "$(now)") s (ports $port, $((port + 1)); $cluster)"
export SLURM_CONF="$cluster/slurm.conf"
# The ranks must find each other from Slurm's variables alone.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK BACKPLANE_JOB_TOKEN BACKPLANE_JOB_TOKEN_FILE
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
export PATH="$bindir:$PATH"

job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }
# Waits until job $1 has ended or $2 (SECONDS) has passed; prints its state.
# (sbatch --wait polls with growing pauses, up to half a minute late.)
wait_job() {
  local state
  while :; do
    state="$(job_state "$1")"
    case "$state" in
      PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | SUSPENDED | RESIZING) ;;
      *) break ;;
    esac
    ((SECONDS < $2)) || break
    sleep 0.2
  done
  echo "${state:-UNKNOWN}"
}

# --- 1. srun: a collective program with 2 tasks -------------------------------
t0="$(now)"
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$out/srun.token")
BACKPLANE_JOB_TOKEN_FILE="$out/srun.token" BACKPLANE_TIMEOUT=60 \
  timeout "$job_limit" srun -n 2 --kill-on-bad-exit=1 --job-name=bp-collectives \
  "$worker" --config "$config" --mode all >"$out/srun.out" 2>&1
rc=$?
cat "$out/srun.out"
if [[ $rc -ne 0 ]]; then
  fail "srun -n 2 collective_worker exited $rc"
elif [[ "$(grep -c 'checks passed' "$out/srun.out")" -ne 2 ]]; then
  fail "srun: expected 'checks passed' from both ranks"
else
  # The store: loopback (one node), the port from the job id.
  srun_job="$(squeue -h --states=all -n bp-collectives -o %A 2>/dev/null | head -n 1)"
  expected="rendezvous from Slurm, store at 127.0.0.1:$((10000 + ${srun_job:-0} % 20000))"
  grep -qF "$expected" "$out/srun.out" || fail "srun: expected '$expected' (job ${srun_job:-unknown})"
fi
echo "srun phase: $(secs "$t0" "$(now)") s"

# --- 2. the sbatch example, uninterrupted -------------------------------------
if ((failed == 0)); then
  t0="$(now)"
  job="$(cd "$out" && sbatch --parsable --output="$out/reference.out" "$sbatch_file" "$out/reference" \
    "${train_args[@]}")" || fail "sbatch of the uninterrupted job failed"
  if [[ -n "$job" ]]; then
    state="$(wait_job "$job" $((SECONDS + job_limit)))"
    echo "job $job (uninterrupted): $state, exit code $(job_field "$job" ExitCode)"
    [[ "$state" == COMPLETED ]] || fail "the uninterrupted job ended $state"
  fi
  for f in metrics.json model.safetensors; do
    [[ -s "$out/reference/$f" ]] || fail "the uninterrupted job wrote no $f"
  done
  echo "sbatch phase (uninterrupted): $(secs "$t0" "$(now)") s"
fi

# --- 3. the same job, requeued once its first checkpoint exists ---------------
checkpoints_in() {  # the job's finished checkpoints (temporary writes are ".step-*.tmp-*")
  find "$1" -mindepth 1 -maxdepth 1 -name 'step-*.safetensors' 2>/dev/null | head -n 1
}
if ((failed == 0)); then
  t0="$(now)"
  job="$(cd "$out" && sbatch --parsable --output="$out/requeued.out" "$sbatch_file" "$out/requeued" \
    "${train_args[@]}")"
  echo "submitted job $job"
  requeued=0
  deadline=$((SECONDS + job_limit))
  while ((SECONDS < deadline)); do
    state="$(job_state "$job")"
    if [[ "$state" == RUNNING && -e "$out/requeued/job.token" && -n "$(checkpoints_in "$out/requeued")" ]]; then
      echo "first checkpoint after $(secs "$t0" "$(now)") s: $(checkpoints_in "$out/requeued"); requeueing"
      scontrol requeue "$job" && requeued=1
      break
    fi
    [[ "$state" == RUNNING || "$state" == PENDING || "$state" == CONFIGURING ]] || break
    sleep 0.1
  done
  if ((requeued == 0)); then
    fail "job $job was not requeued mid-run (state ${state:-unknown}; no checkpoint seen while it ran)"
  else
    # Slurm holds a requeued job for about 2 minutes (BeginTime); release it
    # at once once it is pending again.
    while ((SECONDS < deadline)); do
      state="$(job_state "$job")"
      [[ "$state" == PENDING ]] && { scontrol update JobId="$job" StartTime=now || true; break; }
      sleep 0.1
    done
    state="$(wait_job "$job" "$deadline")"
    echo "job $job: $state, restarts $(job_field "$job" Restarts), exit code $(job_field "$job" ExitCode)"
    [[ "$state" == COMPLETED ]] || fail "the requeued job ended $state"
    [[ "$(job_field "$job" Restarts)" == 1 ]] || fail "the job was not restarted exactly once"
    grep -q "(restart 1)" "$out/requeued.out" || fail "the job's log shows no second run"
    # The second run resumed from a checkpoint of the first, mid-run.
    resumed_at="$(sed -n 's/^resuming from .*: step \([0-9]*\),.*/\1/p' "$out/requeued.out" | head -n 1)"
    total="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' \
      "$out/reference/metrics.json" 2>/dev/null)"
    if [[ -z "$resumed_at" ]]; then
      fail "the requeued run did not resume from a checkpoint (no 'resuming from' in its log)"
    elif [[ -z "$total" ]] || ((resumed_at <= 0 || resumed_at >= total)); then
      fail "the requeued run resumed at step $resumed_at, not inside the job's ${total:-?} steps"
    else
      echo "the second run resumed at step $resumed_at of $total"
    fi
    for f in metrics.json model.safetensors; do
      [[ -s "$out/requeued/$f" ]] || fail "the requeued job wrote no $f"
    done
    if ((failed == 0)); then
      cmp "$out/reference/model.safetensors" "$out/requeued/model.safetensors" ||
        fail "the requeued job's final weights differ from the uninterrupted job's"
      python3 - "$out/reference/metrics.json" "$out/requeued/metrics.json" <<'EOF' || failed=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
bad = [k for k in ("test_accuracy", "epoch_loss", "steps", "epochs", "nproc") if a.get(k) != b.get(k)]
for k in bad:
    print(f"FAIL: metrics.json {k}: uninterrupted {a.get(k)!r}, requeued {b.get(k)!r}")
if not bad:
    print(f"same result: test_accuracy {a['test_accuracy']}, {len(a['epoch_loss'])} epoch losses, {a['steps']} steps")
sys.exit(1 if bad else 0)
EOF
    fi
  fi
  echo "sbatch phase (requeued): $(secs "$t0" "$(now)") s"
fi

if ((failed)); then exit 1; fi
echo "all Slurm checks passed"
exit 0

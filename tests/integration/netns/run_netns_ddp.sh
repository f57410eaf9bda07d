#!/usr/bin/env bash
# Multi-host data-parallel training on one machine: three network namespaces
# joined by a bridge, one rank in each, every byte crossing a veth link
# between distinct addresses (10.77.0.1-3/24), with a non-loopback
# MASTER_ADDR, GLOO_SOCKET_IFNAME naming the veth, and a job secret.
#
#   run_netns_ddp.sh --phase train|cut --cli BACKPLANE --ddp-worker DDP_WORKER
#                    --config BACKENDS_JSON --data DIGITS_CSV --out DIR
#
#   train  ddp_worker checks on every rank that its gradients are the whole
#          batch's; then `backplane train` runs 2 epochs, and its epoch losses
#          and test accuracy must equal those of the same job (same seed, same
#          number of ranks) on loopback.
#   cut    a long `backplane train`; once it is training, rank 2's switch port
#          goes down. Ranks 0 and 1 must each fail within the collective
#          timeout (BACKPLANE_TIMEOUT) with an error naming rank 2 or its
#          address; rank 2, cut off from both, must fail as well.
#
# Exits 0 when every check passes, 1 when one fails, and 77 (the test's
# SKIP_RETURN_CODE) with the reason when it cannot run here: not root, no
# `ip`, or the kernel or the container refuses namespaces, veth or bridges.
# Namespace names are unique per run; a trap removes them (and ends the
# processes inside them) however the script ends.
set -uo pipefail

phase="" cli="" ddp_worker="" config="" data="" out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --phase) phase="$2"; shift 2 ;;
    --cli) cli="$2"; shift 2 ;;
    --ddp-worker) ddp_worker="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "run_netns_ddp.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
if [[ "$phase" != train && "$phase" != cut ]] || [[ -z "$cli" || -z "$ddp_worker" || -z "$config" || -z "$data" || -z "$out" ]]; then
  echo "usage: run_netns_ddp.sh --phase train|cut --cli FILE --ddp-worker FILE --config FILE --data FILE --out DIR" >&2
  exit 64
fi

readonly world=3
readonly subnet=10.77.0
readonly collective_timeout=10  # seconds, BACKPLANE_TIMEOUT of the cut phase
readonly rank_limit=120         # seconds any one rank may run, whatever happens

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
source "$(dirname "${BASH_SOURCE[0]}")/netns_common.sh"
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
failed=0

# --- Can this machine run it? -------------------------------------------------
[[ "$(id -u)" -eq 0 ]] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is not installed"
command -v timeout >/dev/null 2>&1 || skip "the timeout command (coreutils) is not installed"
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed (it compares the metrics)"

# Names: a prefix unique to this run (pid, time, random), so parallel or
# aborted runs never share a namespace.
prefix="bpnetns-$$-$(date +%s)-$RANDOM"
switch_ns="$prefix-sw"
rank_ns=("$prefix-r0" "$prefix-r1" "$prefix-r2")
created=()

# Namespaces left by runs that were killed before their trap ran: their pid
# is gone and they are older than any run lasts.
remove_stale() {
  local name pid
  for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^bpnetns-' || true); do
    pid="$(cut -d- -f2 <<<"$name")"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    kill -0 "$pid" 2>/dev/null && continue
    [[ -n "$(find "/run/netns/$name" -maxdepth 0 -mmin +30 2>/dev/null)" ]] || continue
    for p in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns delete "$name" 2>/dev/null && echo "removed the stale namespace $name"
  done
}

trap cleanup EXIT
trap 'echo "interrupted"; exit 1' INT TERM HUP

remove_stale

# --- The network: a switch namespace with a bridge, a veth to each rank -------
# Setup failures are the environment's, not the product's: they skip.
setup_or_skip() {
  local what="$1"; shift
  local err
  if ! err="$("$@" 2>&1)"; then skip "$what failed ($*): $err"; fi
}
setup_or_skip "creating a network namespace (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)" ip netns add "$switch_ns"
created+=("$switch_ns")
setup_or_skip "running a command in a network namespace" ip netns exec "$switch_ns" true
setup_or_skip "creating a bridge" ip -n "$switch_ns" link add br0 type bridge
ip -n "$switch_ns" link set br0 up || fail "cannot bring br0 up"
for r in 0 1 2; do
  ns="${rank_ns[$r]}"
  setup_or_skip "creating a network namespace" ip netns add "$ns"
  created+=("$ns")
  setup_or_skip "creating a veth pair" ip -n "$switch_ns" link add "port$r" type veth peer name "veth$r" netns "$ns"
  ip -n "$switch_ns" link set "port$r" master br0 up &&
    ip -n "$ns" addr add "$subnet.$((r + 1))/24" dev "veth$r" &&
    ip -n "$ns" link set "veth$r" up &&
    ip -n "$ns" link set lo up || fail "cannot configure veth$r in $ns"
done
[[ $failed -eq 0 ]] || exit 1
echo "network: bridge br0 in $switch_ns; rank r in $prefix-r<r> on veth<r> with $subnet.<r+1>/24"

rm -rf "$out" && mkdir -p "$out" || { echo "FAIL: cannot create $out"; exit 1; }
token="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"

# start_rank R PORT TIMEOUT LOG -- COMMAND...: rank R in its namespace, as a
# rank on its own host would be started by a cluster's launcher.
pids=()
start_rank() {
  local r="$1" port="$2" t="$3" log="$4"; shift 5
  ip netns exec "${rank_ns[$r]}" env RANK="$r" WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR="$subnet.1" MASTER_PORT="$port" GLOO_SOCKET_IFNAME="veth$r" BACKPLANE_TIMEOUT="$t" \
    BACKPLANE_JOB_TOKEN="$token" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout -k 5 "$rank_limit" "$@" >"$log" 2>&1 &
  pids[$r]=$!
}

# wait_ranks: waits for every rank; sets codes[r].
codes=()
wait_ranks() {
  local r
  for r in 0 1 2; do
    wait "${pids[$r]}"
    codes[$r]=$?
  done
}

show_logs() {
  local r
  for r in 0 1 2; do
    echo "--- rank $r (exit ${codes[$r]:-?}) ---"
    cat "$1.$r.log"
  done
}

if [[ "$phase" == train ]]; then
  # 1. Gradients: every rank's equal the whole batch's.
  for r in 0 1 2; do
    start_rank "$r" 29611 60 "$out/ddp.$r.log" -- "$ddp_worker" --config "$config" --backend cpu --expect synced
  done
  wait_ranks
  show_logs "$out/ddp"
  for r in 0 1 2; do
    [[ "${codes[$r]}" -eq 0 ]] || fail "ddp_worker rank $r exited with ${codes[$r]}"
    grep -q "rank $r: ok synced gradients equal the whole batch's" "$out/ddp.$r.log" ||
      fail "ddp_worker rank $r did not report synced gradients"
  done

  # 2. The main job across the namespaces, then the same job on loopback.
  train_args=(train --epochs 2 --seed 7 --config "$config" --data "$data")
  for r in 0 1 2; do
    extra=()
    [[ $r -eq 0 ]] && extra=(--metrics-out "$out/netns.json")
    start_rank "$r" 29612 60 "$out/train.$r.log" -- "$cli" "${train_args[@]}" "${extra[@]}"
  done
  wait_ranks
  show_logs "$out/train"
  for r in 0 1 2; do
    [[ "${codes[$r]}" -eq 0 ]] || fail "backplane train rank $r exited with ${codes[$r]}"
  done
  grep -q "3 ranks on " "$out/train.0.log" || fail "rank 0 does not report a job of 3 ranks"
  echo "--- the same job on loopback ---"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 5 "$rank_limit" \
    env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u GLOO_SOCKET_IFNAME \
    "$cli" "${train_args[@]}" --nproc 3 --metrics-out "$out/loopback.json" 2>&1 | tee "$out/loopback.log"
  [[ "${PIPESTATUS[0]}" -eq 0 ]] || fail "backplane train --nproc 3 on loopback failed"
  if [[ $failed -eq 0 ]]; then
    python3 - "$out/netns.json" "$out/loopback.json" <<'EOF' || failed=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("epoch_loss", "test_accuracy", "steps", "nproc"):
    if a[key] != b[key]:
        print(f"FAIL: {key} differs: across namespaces {a[key]}, on loopback {b[key]}")
        sys.exit(1)
if a["nproc"] != 3 or len(a["epoch_loss"]) != 2:
    print(f"FAIL: expected 3 ranks and 2 epochs, got {a['nproc']} and {len(a['epoch_loss'])}")
    sys.exit(1)
print(f"ok: epoch losses {a['epoch_loss']} and test accuracy {a['test_accuracy']} "
      f"across namespaces equal the loopback job's")
EOF
  fi
else
  # A job long enough to be cut while it trains.
  for r in 0 1 2; do
    start_rank "$r" 29613 "$collective_timeout" "$out/cut.$r.log" -- \
      "$cli" train --epochs 2000 --seed 7 --config "$config" --data "$data"
  done
  wait_for_epoch "$out/cut.0.log" "${pids[0]}"
  if [[ $failed -eq 0 ]]; then
    ip -n "$switch_ns" link set port2 down || fail "cannot set port2 down"
    cut_at="$(now)"
    echo "cut: port2 (rank 2, $subnet.3) is down"
    # Each rank's exit time, polled. Ranks 0 and 1 lost rank 2; rank 2, cut
    # off, lost them both: every one must fail, none may hang.
    ended=()
    deadline=$(( $(date +%s) + collective_timeout + 30 ))
    while [[ -z "${ended[0]:-}" || -z "${ended[1]:-}" || -z "${ended[2]:-}" ]] && [[ $(date +%s) -lt $deadline ]]; do
      for r in 0 1 2; do
        if [[ -z "${ended[$r]:-}" ]] && ! kill -0 "${pids[$r]}" 2>/dev/null; then
          ended[$r]="$(now)"
          wait "${pids[$r]}"
          codes[$r]=$?
        fi
      done
      sleep 0.05
    done
    show_logs "$out/cut"
    # The collective in flight at the cut began before it, so its deadline
    # comes at most the timeout later; the margin is for reporting and exit.
    # Rank 2 has lost the store's host too: publishing its failure there is
    # bounded (2 s), so it gets the same limit, not a second timeout.
    limit=$((collective_timeout + 5))
    limits=("$limit" "$limit" "$limit")
    for r in 0 1 2; do
      if [[ -z "${ended[$r]:-}" ]]; then
        fail "rank $r still ran $((collective_timeout + 30)) s after the cut"
        continue
      fi
      took="$(secs "$cut_at" "${ended[$r]}")"
      echo "rank $r exited with ${codes[$r]} after $took s"
      [[ "${codes[$r]}" -ne 0 ]] || fail "rank $r exited 0 after the link was cut"
      awk -v t="$took" -v l="${limits[$r]}" 'BEGIN { exit !(t <= l) }' ||
        fail "rank $r failed $took s after the cut (the collective timeout is ${collective_timeout} s)"
      grep -q "backplane: error: " "$out/cut.$r.log" || fail "rank $r printed no error"
    done
    # Each error names the peer the rank was waiting for, by rank and by its
    # address on the veth (where GLOO_SOCKET_IFNAME made it listen). Ranks 0
    # and 1 time out together, so one of them may be waiting for the other,
    # itself stuck on rank 2; but the chain ends at rank 2, so at least one
    # of them names it.
    names_peer() {  # names_peer R P: rank R's error names rank P and its address
      grep -E "backplane: error: " "$out/cut.$1.log" | grep -Eq "rank $2[^0-9].*$subnet\.$(($2 + 1))[^0-9]"
    }
    for r in 0 1 2; do
      named=""
      for p in 0 1 2; do
        [[ $p -ne $r ]] && names_peer "$r" "$p" && named+=" $p"
      done
      if [[ -z "$named" ]]; then
        fail "rank $r's error names no peer by rank and address"
      else
        echo "rank $r's error names peer rank(s)$named"
      fi
    done
    names_peer 0 2 || names_peer 1 2 || fail "neither rank 0 nor rank 1 names rank 2 ($subnet.3)"
    [[ $failed -eq 0 ]] &&
      echo "ok: ranks 0 and 1 failed within ${limit} s of the cut, naming their peers (rank 2 among them); rank 2 failed too"
  fi
fi

if [[ $failed -ne 0 ]]; then
  echo "FAIL: integration.netns phase $phase"
  exit 1
fi
echo "ok: integration.netns phase $phase"
exit 0

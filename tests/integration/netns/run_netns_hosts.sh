#!/usr/bin/env bash
# Two "hosts" of two ranks each on one machine: two network namespaces joined
# by one veth link (10.78.0.1 and 10.78.0.2), ranks 0 and 1 in the first,
# 2 and 3 in the second. The ranks of a host are started by one
# `ip netns exec` (which makes a mount namespace of its own per call), so
# they share every namespace and the cpu plugin sees them on one host: its
# hierarchical collectives (shared memory within a host, Gloo between the
# hosts' leaders) are what a 2 x 2 job uses.
#
#   run_netns_hosts.sh --phase check --cli BACKPLANE --collective-worker W
#                      --ddp-worker D --config BACKENDS_JSON --data DIGITS_CSV
#                      [--large-elements N] --out DIR
#   run_netns_hosts.sh --phase bench --cli BACKPLANE --bench-collectives B
#                      --config BACKENDS_JSON --data DIGITS_CSV --out DIR
#                      [--repeats N] [--rate 1gbit] [--delay 0.2ms] [--pin]
#
#   check  every collective, reduce op and dtype gives the exact reference
#          on every rank (collective_worker --mode all, up to N f32 elements,
#          default 16 Mi: 64 MiB), DDP gradients equal
#          the whole batch's (ddp_worker), and when a host's leader (rank 2)
#          or another rank (rank 1) is killed mid-job, every survivor fails
#          with a timeout or collective error within the timeout, for small
#          and for 16 MiB all_reduces; and when the link between the hosts
#          is cut while `backplane train` runs, every rank fails within the
#          timeout with an error.
#   bench  the link between the hosts shaped with tc netem (rate and delay
#          each way; tbf, the rate alone, where the kernel lacks netem); flat Gloo ("hierarchical": false) and hierarchical
#          alternate `repeats` times: all_reduce of 64 MiB f32
#          and of 4 KiB (bench_collectives --worker) and `backplane train`
#          (ms/step of the main job, one 37.5 KiB gradient bucket per step). Prints each
#          run's figures and the ratios hierarchical / flat.
#
# --pin runs host h's ranks on CPU h alone (taskset), so that the two hosts
# do not take each other's cores (on a 2-core machine).
#
# Exits 0 when every check passes, 1 when one fails, 77 (skip) with the
# reason when namespaces cannot be made here (not root, no `ip`/`tc`).
set -uo pipefail

phase="" cli="" cworker="" dworker="" bench="" config="" data="" out=""
repeats=3 rate=1gbit delay=0.2ms pin=0 large_elements=16777216
while [[ $# -gt 0 ]]; do
  case "$1" in
    --phase) phase="$2"; shift 2 ;;
    --cli) cli="$2"; shift 2 ;;
    --collective-worker) cworker="$2"; shift 2 ;;
    --ddp-worker) dworker="$2"; shift 2 ;;
    --bench-collectives) bench="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --pin) pin=1; shift ;;
    --large-elements) large_elements="$2"; shift 2 ;;
    *) echo "run_netns_hosts.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
usage() {
  echo "usage: run_netns_hosts.sh --phase check|bench --cli FILE --config FILE --out DIR" \
    "--data FILE (check: --collective-worker FILE --ddp-worker FILE; bench: --bench-collectives FILE)" >&2
  exit 64
}
[[ -n "$cli" && -n "$config" && -n "$out" ]] || usage
case "$phase" in
  check) [[ -n "$cworker" && -n "$dworker" && -n "$data" ]] || usage ;;
  bench) [[ -n "$bench" && -n "$data" ]] || usage ;;
  *) usage ;;
esac

readonly world=4
readonly subnet=10.78.0
readonly rank_limit=300  # seconds any one rank may run, whatever happens
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
source "$(dirname "${BASH_SOURCE[0]}")/netns_common.sh"
failed=0

[[ "$(id -u)" -eq 0 ]] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "the ip command (iproute2) is not installed"
command -v timeout >/dev/null 2>&1 || skip "the timeout command (coreutils) is not installed"
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed"
[[ "$phase" != bench ]] || command -v tc >/dev/null 2>&1 || skip "the tc command (iproute2) is not installed"

prefix="bphosts-$$-$(date +%s)-$RANDOM"
host_ns=("$prefix-h0" "$prefix-h1")
created=()
trap cleanup EXIT
trap 'echo "interrupted"; exit 1' INT TERM HUP

setup_or_skip() {
  local what="$1"; shift
  local err
  if ! err="$("$@" 2>&1)"; then skip "$what failed ($*): $err"; fi
}
for h in 0 1; do
  setup_or_skip "creating a network namespace (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)" ip netns add "${host_ns[$h]}"
  created+=("${host_ns[$h]}")
done
setup_or_skip "running a command in a network namespace" ip netns exec "${host_ns[0]}" true
setup_or_skip "creating a veth pair" ip -n "${host_ns[0]}" link add veth0 type veth peer name veth1 netns "${host_ns[1]}"
for h in 0 1; do
  ip -n "${host_ns[$h]}" addr add "$subnet.$((h + 1))/24" dev "veth$h" &&
    ip -n "${host_ns[$h]}" link set "veth$h" up &&
    ip -n "${host_ns[$h]}" link set lo up || fail "cannot configure veth$h in ${host_ns[$h]}"
done
[[ $failed -eq 0 ]] || exit 1
if [[ "$phase" == bench ]]; then
  # netem: the rate and the delay, with a queue long enough for a window of
  # 64 KiB segments, so that the shaping drops nothing. Kernels without
  # netem (sch_netem) get tbf: the rate alone, with a burst of a few GSO
  # segments; the veth's own latency (tens of microseconds) stays.
  shaping="netem delay $delay rate $rate"
  for h in 0 1; do
    if ! ip netns exec "${host_ns[$h]}" tc qdisc add dev "veth$h" root netem delay "$delay" rate "$rate" \
      limit 100000 2>/dev/null; then
      shaping="tbf rate $rate (no netem in this kernel: no added delay)"
      setup_or_skip "shaping veth$h with tc tbf" ip netns exec "${host_ns[$h]}" \
        tc qdisc add dev "veth$h" root tbf rate "$rate" burst 512kb latency 50ms
    fi
  done
  echo "network: ${host_ns[0]} (ranks 0, 1; $subnet.1) <-> ${host_ns[1]} (ranks 2, 3; $subnet.2)," \
    "each way: $shaping"
else
  echo "network: ${host_ns[0]} (ranks 0, 1; $subnet.1) <-> ${host_ns[1]} (ranks 2, 3; $subnet.2)"
fi

rm -rf "$out" && mkdir -p "$out" || { echo "FAIL: cannot create $out"; exit 1; }
token="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"

# run_job NAME PORT TIMEOUT -- COMMAND...: the 4 ranks, two per host, each
# host's pair from one `ip netns exec`; waits for all. Rank r's output goes
# to $out/NAME.r.log and its exit status to codes[r].
codes=()
run_job() {
  local name="$1" port="$2" t="$3"; shift 4
  local h pids=() r cpus
  rm -f "$out/$name".*.rc
  for h in 0 1; do
    cpus=()
    [[ $pin -eq 1 ]] && cpus=(taskset -c "$h")
    ip netns exec "${host_ns[$h]}" "${cpus[@]}" bash -c '
      name="$1" out="$2" h="$3" limit="$4"; shift 4
      for l in 0 1; do
        r=$((2 * h + l))
        (RANK=$r LOCAL_RANK=$l timeout -k 5 "$limit" "$@" >"$out/$name.$r.log" 2>&1
         echo $? >"$out/$name.$r.rc") &
      done
      wait' _ "$name" "$out" "$h" "$rank_limit" \
      env WORLD_SIZE="$world" LOCAL_WORLD_SIZE=2 MASTER_ADDR="$subnet.1" MASTER_PORT="$port" \
      GLOO_SOCKET_IFNAME="veth$h" BACKPLANE_TIMEOUT="$t" BACKPLANE_JOB_TOKEN="$token" \
      OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$@" &
    pids+=($!)
  done
  for h in 0 1; do wait "${pids[$h]}"; done
  for r in 0 1 2 3; do codes[$r]="$(cat "$out/$name.$r.rc" 2>/dev/null || echo missing)"; done
}
show_logs() {
  local r
  for r in 0 1 2 3; do
    echo "--- $1 rank $r (exit ${codes[$r]}) ---"
    cat "$out/$1.$r.log"
  done
}

if [[ "$phase" == check ]]; then
  run_job all 29711 120 -- env BACKPLANE_LOG_LEVEL=debug "$cworker" --config "$config" --mode all --large \
    --large-elements "$large_elements"
  show_logs all
  for r in 0 1 2 3; do
    [[ "${codes[$r]}" == 0 ]] || fail "collective_worker --mode all: rank $r exited with ${codes[$r]}"
  done
  grep -q "hierarchical" "$out/all.0.log" ||
    fail "rank 0 does not report hierarchical collectives (BACKPLANE_LOG_LEVEL=debug)"

  run_job ddp 29712 60 -- "$dworker" --config "$config" --backend cpu --expect synced
  show_logs ddp
  for r in 0 1 2 3; do
    [[ "${codes[$r]}" == 0 ]] || fail "ddp_worker: rank $r exited with ${codes[$r]}"
  done

  # A killed rank: the leader of the second host, then a rank that leads
  # nothing; with small all_reduces (through the leaders) and with 16 MiB
  # ones (every local rank across, in two pieces on two threads).
  # collective_worker --mode die exits 0 on a survivor that caught a timeout
  # or collective error, 3 when none came; the dead one is killed.
  port=29713
  for case in "2 1024" "1 1024" "2 4194304" "1 4194304"; do
    read -r die elements <<<"$case"
    start="$(date +%s)"
    run_job "die$die" $((port++)) 10 -- "$cworker" --config "$config" --mode die --die-rank "$die" \
      --elements "$elements"
    took=$(( $(date +%s) - start ))
    show_logs "die$die"
    for r in 0 1 2 3; do
      [[ $r -eq $die ]] && continue
      [[ "${codes[$r]}" == 0 ]] ||
        fail "with rank $die killed ($elements elements), rank $r exited with ${codes[$r]} (3: no error)"
    done
    [[ $took -le 40 ]] || fail "with rank $die killed ($elements elements), the job took $took s (the timeout is 10 s)"
  done

  # A cut link: `backplane train` runs long; once it trains, the second
  # host's end of the link goes down. Every rank must fail within the
  # collective timeout (the second host's ranks have lost the store too:
  # publishing their error there is bounded, 2 s), none may hang. Not run
  # once a check above failed: its job would only add to the log.
  [[ $failed -eq 0 ]] || { echo "FAIL: run_netns_hosts.sh phase $phase (the cut was not tried)"; exit 1; }
  run_job cut 29720 10 -- "$cli" train --epochs 2000 --seed 7 --config "$config" --data "$data" &
  job=$!
  wait_for_epoch "$out/cut.0.log" "$job"
  if [[ $failed -eq 0 ]]; then
    ip -n "${host_ns[1]}" link set veth1 down || fail "cannot set veth1 down"
    cut_at="$(date +%s.%N)"
    echo "cut: veth1 (ranks 2 and 3, $subnet.2) is down"
    declare -A ended=()
    until [[ ${#ended[@]} -eq 4 ]] || awk -v a="$cut_at" -v b="$(date +%s.%N)" 'BEGIN { exit !(b - a > 45) }'; do
      for r in 0 1 2 3; do
        [[ -z "${ended[$r]:-}" && -f "$out/cut.$r.rc" ]] && ended[$r]="$(date +%s.%N)"
      done
      sleep 0.05
    done
    wait "$job"
    for r in 0 1 2 3; do
      codes[$r]="$(cat "$out/cut.$r.rc" 2>/dev/null || echo missing)"
      echo "--- cut rank $r (exit ${codes[$r]}) ---"
      tail -n 3 "$out/cut.$r.log"
      if [[ -z "${ended[$r]:-}" ]]; then
        fail "rank $r still ran 45 s after the cut"
        continue
      fi
      took="$(awk -v a="$cut_at" -v b="${ended[$r]}" 'BEGIN { printf "%.1f", b - a }')"
      echo "rank $r exited with ${codes[$r]} after $took s"
      [[ "${codes[$r]}" != 0 ]] || fail "rank $r exited 0 after the link was cut"
      awk -v t="$took" 'BEGIN { exit !(t <= 15) }' || fail "rank $r failed $took s after the cut (timeout 10 s)"
      grep -q "backplane: error: " "$out/cut.$r.log" || fail "rank $r printed no error"
    done
  else
    kill_ranks  # 2000 epochs: waiting for the job would outlast any timeout
    wait "$job"
  fi
else
  # Two configurations, alike but for "hierarchical"; plugin_dirs made
  # absolute, as the copies live elsewhere.
  python3 - "$config" "$out" <<'EOF' || { echo "FAIL: cannot write the configurations"; exit 1; }
import json, os, sys
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(src))
base = os.path.dirname(os.path.abspath(src))
cfg["plugin_dirs"] = [os.path.normpath(os.path.join(base, d)) for d in cfg.get("plugin_dirs", [])]
for mode, on in (("flat", False), ("hier", True)):
    for b in cfg["backends"]:
        if b.get("library") == "backplane_cpu":
            b.setdefault("options", {})["hierarchical"] = on
    json.dump(cfg, open(os.path.join(out, mode + ".json"), "w"), indent=1)
EOF
  port=29720
  : >"$out/figures.txt"
  for ((i = 1; i <= repeats; i++)); do
    order=(flat hier)
    (( i % 2 == 0 )) && order=(hier flat)
    for mode in "${order[@]}"; do
      # bench_collectives' worker reads its options from its third argument:
      # "flat" is {"hierarchical": false}, "shm" the defaults.
      arg=shm
      [[ $mode == flat ]] && arg=flat
      run_job "coll-$mode-$i" $((port++)) 120 -- "$bench" --worker 5 "$arg"
      for r in 0 1 2 3; do
        [[ "${codes[$r]}" == 0 ]] || { show_logs "coll-$mode-$i"; fail "bench_collectives $mode rank $r: ${codes[$r]}"; }
      done
      large="$(awk '/^RESULT/ { print $3 }' "$out/coll-$mode-$i.0.log")"
      small="$(awk '/^RESULT/ { print $5 }' "$out/coll-$mode-$i.0.log")"
      run_job "train-$mode-$i" $((port++)) 120 -- "$cli" train --epochs 20 --seed 7 --config "$out/$mode.json" \
        --data "$data" --metrics-out "$out/train-$mode-$i.json"
      for r in 0 1 2 3; do
        [[ "${codes[$r]}" == 0 ]] || { show_logs "train-$mode-$i"; fail "backplane train $mode rank $r: ${codes[$r]}"; }
      done
      step="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds_per_step"] * 1e3)' \
        "$out/train-$mode-$i.json" 2>/dev/null)"
      echo "repeat $i $mode: all_reduce 64 MiB ${large:-?} ms, 4 KiB ${small:-?} us, train ${step:-?} ms/step"
      echo "$i $mode ${large:-nan} ${small:-nan} ${step:-nan}" >>"$out/figures.txt"
    done
  done
  python3 - "$out/figures.txt" <<'EOF' || failed=1
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
fig = {}
for i, mode, large, small, step in rows:
    fig.setdefault(i, {})[mode] = (float(large), float(small), float(step))
for k, name in ((0, "all_reduce 64 MiB ms"), (1, "all_reduce 4 KiB us "), (2, "train ms/step       ")):
    ratios = [v["hier"][k] / v["flat"][k] for v in fig.values() if "hier" in v and "flat" in v]
    flat = [v["flat"][k] for v in fig.values() if "flat" in v]
    hier = [v["hier"][k] for v in fig.values() if "hier" in v]
    if not ratios:
        print(f"FAIL: no {name} figures"); sys.exit(1)
    print(f"{name}: flat {min(flat):.3f}-{max(flat):.3f}, hierarchical {min(hier):.3f}-{max(hier):.3f}; "
          f"hierarchical / flat per repeat {', '.join(f'{r:.2f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.2f})")
EOF
fi

if [[ $failed -ne 0 ]]; then
  echo "FAIL: run_netns_hosts.sh phase $phase"
  exit 1
fi
echo "ok: run_netns_hosts.sh phase $phase"
exit 0

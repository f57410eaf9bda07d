# Sourced by the network-namespace test scripts (run_netns_ddp.sh,
# run_netns_hosts.sh): what they share. Each script defines fail() and
# keeps the namespaces it made in the array `created`.

# kill_ranks: kills every process inside the namespaces this run made.
kill_ranks() {
  local ns p
  for ns in "${created[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
}

# cleanup: kill_ranks, then deletes the namespaces (the scripts' EXIT trap).
cleanup() {
  local ns
  kill_ranks
  for ns in "${created[@]}"; do ip netns delete "$ns" 2>/dev/null; done
  created=()
}

# wait_for_epoch LOG PID: returns once LOG has a line "epoch 3/..." (the
# job trains, so a cut now lands mid-job); fails (fail(), status 1) when
# PID ended first or 120 s passed.
wait_for_epoch() {
  local log="$1" pid="$2" deadline=$(( $(date +%s) + 120 ))
  until grep -q "^epoch 3/" "$log" 2>/dev/null; do
    if [[ $(date +%s) -ge $deadline ]] || ! kill -0 "$pid" 2>/dev/null; then
      fail "the job did not reach epoch 3 ($log: its process ended or 120 s passed)"
      return 1
    fi
    sleep 0.1
  done
}

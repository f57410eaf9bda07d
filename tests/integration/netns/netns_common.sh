# Sourced by the network-namespace test scripts (run_netns_ddp.sh,
# run_netns_hosts.sh): what they share. Each script defines fail().

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

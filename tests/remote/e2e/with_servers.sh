#!/usr/bin/env bash
# Runs a command against N fresh `backplane serve` processes on loopback:
#   with_servers.sh --cli BACKPLANE --server-config FILE --servers N --config OUT.json
#                   [--serve BACKEND] [--op-fallback VALUE] -- COMMAND [ARGS...]
# Each server hosts backend BACKEND (default cpu) of FILE on an ephemeral port;
# --op-fallback sets the remote entry's "op_fallback" (e.g. "host:cpu"). OUT.json is
# written with a required "remote" backend whose endpoints are the servers,
# in order (so rank r of a job lands on server r), and a "cpu" backend for
# comparisons; then COMMAND runs. Afterwards every server is stopped with
# SIGTERM and must exit 0 (a clean stop). Exits with COMMAND's status, or 1
# when a server fails to start or to stop.
set -euo pipefail

cli="" server_config="" servers=1 config="" serve="cpu" op_fallback=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --server-config) server_config="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --serve) serve="$2"; shift 2 ;;
    --op-fallback) op_fallback=", \"op_fallback\": \"$2\""; shift 2 ;;
    --) shift; break ;;
    *) echo "with_servers.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$cli" && -n "$server_config" && -n "$config" && $# -gt 0 ]] || {
  echo "usage: with_servers.sh --cli BACKPLANE --server-config FILE --servers N --config OUT.json -- COMMAND..." >&2
  exit 2
}

workdir="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT

endpoints=()
for ((i = 0; i < servers; ++i)); do
  log="$workdir/server$i.log"
  "$cli" serve --config "$server_config" --backend "$serve" --listen 127.0.0.1:0 >"$log" 2>&1 &
  pids+=("$!")
  port=""
  for ((t = 0; t < 300; ++t)); do
    if grep -q '^ready' "$log" 2>/dev/null; then
      port="$(sed -n 's/.* on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)"
      break
    fi
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [[ -z "$port" ]]; then
    echo "with_servers.sh: FAIL: server $i did not become ready; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "with_servers.sh: server $i ready on 127.0.0.1:$port"
  endpoints+=("\"127.0.0.1:$port\"")
done

plugin_dir="$(cd "$(dirname "$cli")/../plugins" && pwd)"
joined="$(IFS=,; echo "${endpoints[*]}")"
cat >"$config" <<JSON
{
  "schema_version": 1,
  "plugin_dirs": ["$plugin_dir"],
  "default_backend": "remote",
  "backends": [
    {"name": "remote", "library": "backplane_remote", "required": true,
     "options": {"endpoints": [$joined], "connect_timeout_ms": 5000}$op_fallback},
    {"name": "cpu", "library": "backplane_cpu", "required": true}
  ]
}
JSON

set +e
"$@"
rc=$?
set -e

for ((i = 0; i < servers; ++i)); do
  kill -TERM "${pids[$i]}" 2>/dev/null || true
done
for ((i = 0; i < servers; ++i)); do
  set +e
  wait "${pids[$i]}"
  src=$?
  set -e
  if [[ $src -ne 0 ]]; then
    echo "with_servers.sh: FAIL: server $i exited with $src after SIGTERM (expected a clean stop); its output:" >&2
    cat "$workdir/server$i.log" >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
done
pids=()
exit $rc

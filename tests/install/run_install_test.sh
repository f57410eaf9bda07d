#!/usr/bin/env bash
# Install test: `cmake --install` this build into a fresh temporary prefix,
# build examples/host_app, examples/ddp_host_app and the example plugins
# (examples/plugin, minimal_plugin_cpp, minimal_plugin_c) against it, then run them and the
# installed `backplane` CLI and check their output. Run by ctest (install.out_of_tree).
set -euo pipefail

usage() {
  echo "usage: $0 --build-dir=DIR --source-dir=DIR [--generator=G] [--config=TYPE]" \
       "[--libdir=lib] [--cxx=COMPILER] [--sanitize=LIST]" >&2
  exit 2
}

build_dir="" source_dir="" generator="Ninja" config="Release" libdir="lib" cxx="" sanitize=""
for arg in "$@"; do
  case "$arg" in
    --build-dir=*) build_dir="${arg#*=}" ;;
    --source-dir=*) source_dir="${arg#*=}" ;;
    --generator=*) generator="${arg#*=}" ;;
    --config=*) config="${arg#*=}" ;;
    --libdir=*) libdir="${arg#*=}" ;;
    --cxx=*) cxx="${arg#*=}" ;;
    --sanitize=*) sanitize="${arg#*=}" ;;
    *) echo "unknown argument: $arg" >&2; usage ;;
  esac
done
[[ -n "$build_dir" && -n "$source_dir" ]] || usage
[[ -n "$config" ]] || config="Release"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/backplane-install-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }
# Runs a command; on failure prints its output and stops.
run_logged() {
  local log="$tmp/log.txt"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "command failed: $*"
  fi
}

step "install $build_dir -> $prefix"
run_logged cmake --install "$build_dir" --prefix "$prefix" --config "$config"
[[ -x "$prefix/bin/backplane" ]] || fail "bin/backplane was not installed"
cpu_plugin="$prefix/$libdir/backplane/libbackplane_cpu.so"
[[ -f "$cpu_plugin" ]] || fail "the cpu plugin was not installed at $cpu_plugin"
# The cpu and cuda plugins are a front library and an engine it loads from its
# own folder: one without the other fails at the first use of a device.
for front in cpu cuda_nccl; do
  [[ -f "$prefix/$libdir/backplane/libbackplane_$front.so" ]] || continue
  engine="$prefix/$libdir/backplane/libbackplane_${front}_engine.so"
  [[ -f "$engine" ]] || fail "libbackplane_$front.so was installed without its engine $engine"
done
[[ -f "$prefix/share/backplane/backends.json" ]] || fail "share/backplane/backends.json was not installed"

# The examples build with the same generator, build type and compiler; under a
# sanitizer build they need the same runtime as the installed libraries.
cmake_args=(-G "$generator" -DCMAKE_BUILD_TYPE="$config" -DCMAKE_PREFIX_PATH="$prefix")
[[ -n "$cxx" ]] && cmake_args+=(-DCMAKE_CXX_COMPILER="$cxx")
if [[ -n "$sanitize" ]]; then
  flags="-fsanitize=$sanitize -fno-omit-frame-pointer"
  cmake_args+=(-DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize"
               -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=$sanitize")
fi

for example in host_app plugin ddp_host_app minimal_plugin_cpp minimal_plugin_c; do
  step "build examples/$example against the installed package"
  run_logged cmake -S "$source_dir/examples/$example" -B "$tmp/$example" "${cmake_args[@]}"
  run_logged cmake --build "$tmp/$example" --config "$config"
done
example_plugin="$tmp/plugin/libexample_host.so"
[[ -f "$example_plugin" ]] || fail "examples/plugin did not produce $example_plugin"

for plugin in "$example_plugin" "$tmp/minimal_plugin_cpp/libminimal_plugin_cpp.so" \
              "$tmp/minimal_plugin_c/libminimal_plugin_c.so"; do
  step "$(basename "$plugin") exports bp_plugin_entry only"
  [[ -f "$plugin" ]] || fail "the example build did not produce $plugin"
  exports="$(nm -D --defined-only "$plugin" | awk '{print $NF}' | grep -v '^$' | sort -u)"
  [[ "$exports" == "bp_plugin_entry" ]] || fail "unexpected exports from $plugin: $exports"
done

# cpu resolves through plugin_dirs, the example plugin through an absolute path.
config_file="$tmp/backends.json"
cat >"$config_file" <<JSON
{
  "schema_version": 1,
  "plugin_dirs": ["$prefix/$libdir/backplane"],
  "default_backend": "cpu",
  "backends": [
    {"name": "cpu", "library": "backplane_cpu", "required": true},
    {"name": "example", "library": "$example_plugin", "required": true}
  ]
}
JSON

step "run host_app"
if ! host_out="$("$tmp/host_app/host_app" "$config_file" 2>&1)"; then
  echo "$host_out" >&2
  fail "host_app exited with an error"
fi
echo "$host_out"
expect() {  # expect <output> <line or pattern> <what>
  grep -qE -- "$2" <<<"$1" || fail "expected $3 (pattern: $2)"
}
expect "$host_out" '^a \+ row \[2, 3\]: 11 22 33 14 25 36$' "the broadcast add"
expect "$host_out" '^a \* a \[2, 3\]: 1 4 9 16 25 36$' "the elementwise product"
expect "$host_out" '^a @ w \[2, 2\]: 4 5 10 11$' "the matmul"
expect "$host_out" '^set_distributed_params on cpu:0: registered' "registration on cpu (Gloo collectives)"
expect "$host_out" '^set_distributed_params on example:0: error capability_missing: .*collective' \
  "the typed capability_missing error naming 'collective'"
expect "$host_out" '^backend example: loaded' "the example backend to load"

step "run examples/ddp_host_app with 2 ranks through the installed launcher"
ddp_out="$("$prefix/bin/backplane" launch -n 2 --timeout 60 -- "$tmp/ddp_host_app/ddp_host_app" "$config_file" \
  1 2>&1)" || { echo "$ddp_out" >&2; fail "ddp_host_app failed"; }
echo "$ddp_out"
expect "$ddp_out" '^\[rank 0\] test accuracy 0\.' "ddp_host_app's test accuracy from rank 0"

json_check() {  # json_check <json text>: both backends loaded; prints a summary
  python3 -c '
import json, sys
doc = json.loads(sys.stdin.read())
backends = {b["name"]: b for b in doc["backends"]}
want = sys.argv[1].split(",")
for name in want:
    b = backends.get(name)
    if b is None:
        sys.exit("backend %s is missing from the list" % name)
    if b["status"] != "loaded" or b["error"] is not None:
        sys.exit("backend %s: status %s: %s" % (name, b["status"], b["error"]))
    if not b["devices"]:
        sys.exit("backend %s has no devices" % name)
    print("%s: loaded, %d device(s), capabilities %s" % (name, len(b["devices"]), b["capabilities"]))
print("config:", doc["config"])
' "$2" <<<"$1"
}

step "installed backplane list --json --config"
list_json="$("$prefix/bin/backplane" list --json --config "$config_file")" || fail "backplane list --json failed"
json_check "$list_json" "cpu,example" || { echo "$list_json" >&2; fail "backplane list --json"; }

step "installed backplane check --config"
"$prefix/bin/backplane" check --config "$config_file" || fail "backplane check exited $?"

step "the example plugin's own backends.json (its build folder + BACKPLANE_PLUGIN_DIR)"
example_json="$("$prefix/bin/backplane" list --json --config "$tmp/plugin/backends.json")" \
  || fail "backplane list --config examples/plugin's backends.json failed"
json_check "$example_json" "example,cpu" || { echo "$example_json" >&2; fail "examples/plugin backends.json"; }

for example in minimal_plugin_cpp minimal_plugin_c; do
  step "the installed CLI runs conformance on examples/$example (its own backends.json)"
  conf_out="$("$prefix/bin/backplane" conformance --config "$tmp/$example/backends.json" --backend minimal 2>&1)" \
    || { echo "$conf_out" >&2; fail "backplane conformance on examples/$example"; }
  expect "$conf_out" '[1-9][0-9]* passed, 0 failed' "cases of $example passing, none failing"
done

step "installed backplane list with no config finds the installed default"
mkdir "$tmp/cwd"
default_json="$(cd "$tmp/cwd" && env -u BACKPLANE_CONFIG -u BACKPLANE_PLUGIN_PATH \
  "$prefix/bin/backplane" list --json)" || fail "backplane list (installed default config) failed"
json_check "$default_json" "cpu" || { echo "$default_json" >&2; fail "installed default config"; }

step "installed backplane train from another folder finds the installed config and data"
train_out="$(cd "$tmp/cwd" && env -u BACKPLANE_CONFIG -u BACKPLANE_PLUGIN_PATH \
  "$prefix/bin/backplane" train --nproc 1 --epochs 1 2>&1)" || { echo "$train_out" >&2; fail "installed train"; }
expect "$train_out" " on /.*/share/backplane/digits\.csv\.gz " "the installed digits data"
expect "$train_out" '^test accuracy 0\.' "a test accuracy"

step "installed backplane --version"
"$prefix/bin/backplane" --version | grep -q "^backplane [0-9]" || fail "backplane --version"

echo "PASS"

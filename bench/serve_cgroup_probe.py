#!/usr/bin/env python3
"""`backplane serve` in a 1 GiB memory cgroup under the memory patterns that
used to get it killed: does it live, answer out_of_memory, and keep an idle
session working?

Patterns (each against a fresh server, clients outside the cgroup):
  one:  one session holds 700 MiB, queues 40 matmuls, then six 64 MiB writes;
  four: four sessions of 76 MiB each do the same at once.
An idle session opened first must still work at the end. Prints, per
pattern, whether the server lived, the requests refused with out_of_memory,
and the cgroup's peak usage. Needs root and a writable memory cgroup (v1 or
v2); says so and exits 77 otherwise.

    sudo PYTHONPATH=build/python python3 bench/serve_cgroup_probe.py [--cli build/bin/backplane]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20


def make_cgroup(limit):
    name = f"bp-serve-probe-{os.getpid()}"
    v2 = "/sys/fs/cgroup/cgroup.controllers"
    if os.path.exists(v2) and "memory" in open(v2).read():
        path = "/sys/fs/cgroup/" + name
        os.mkdir(path)
        open(path + "/memory.max", "w").write(str(limit))
        open(path + "/memory.swap.max", "w").write("0") if os.path.exists(path + "/memory.swap.max") else None
        return path, "memory.peak", "memory.events"
    path = "/sys/fs/cgroup/memory/" + name
    os.mkdir(path)
    open(path + "/memory.limit_in_bytes", "w").write(str(limit))
    if os.path.exists(path + "/memory.memsw.limit_in_bytes"):
        open(path + "/memory.memsw.limit_in_bytes", "w").write(str(limit))
    return path, "memory.max_usage_in_bytes", "memory.oom_control"


def start_server(cli, plugins, folder, cgroup):
    config = os.path.join(folder, "server.json")
    with open(config, "w") as f:
        json.dump({"schema_version": 1, "plugin_dirs": [plugins], "default_backend": "cpu",
                   "backends": [{"name": "cpu", "library": "backplane_cpu", "required": True}]}, f)
    log = open(os.path.join(folder, "serve.log"), "w")
    p = subprocess.Popen(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, cli, "serve",
                          "--config", config, "--listen", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    endpoint, cap = None, ""
    for line in p.stdout:
        if " on 127.0.0.1:" in line and endpoint is None:
            endpoint = line.split(" on ", 1)[1].split()[0].rstrip(".,;:")
        if line.strip().startswith("memory:"):
            cap = line.strip()
        if line.startswith("ready"):
            break
    if endpoint is None:
        sys.exit("backplane serve did not start; see " + log.name)
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p, endpoint, cap


def registry(bp, plugins, endpoint, folder, n):
    path = os.path.join(folder, f"client{n}.json")
    with open(path, "w") as f:
        json.dump({"schema_version": 1, "plugin_dirs": [plugins],
                   "backends": [{"name": "remote", "library": "backplane_remote", "required": True,
                                 "options": {"endpoints": [endpoint]}}]}, f)
    return bp.Registry.from_config(path)


def pattern(bp, np, device, hold_mib, refused, lock):
    """Holds `hold_mib`, queues 40 matmuls, then six 64 MiB writes; counts out_of_memory."""
    kept = []

    def attempt(what):
        try:
            t = what()
            kept.append(t)
            return t
        except Exception as e:  # an out_of_memory refusal surfaces here or at the next read
            with lock:
                refused.append(type(e).__name__ + ": " + str(e).splitlines()[0][:160])
            return None

    attempt(lambda: bp.zeros([hold_mib * MiB // 4], device=device))
    m = attempt(lambda: bp.rand_uniform([1024, 1024], 1, device=device))
    if m is not None:
        c = None
        for _ in range(40):
            c = attempt(lambda: m @ m)
    payload = np.ones(64 * MiB // 4, dtype=np.float32)
    for _ in range(6):
        attempt(lambda: bp.tensor(payload, device=device))
    try:
        float(kept[-1].sum()) if kept else None  # a synchronising read: pipelined failures arrive here
    except Exception as e:
        with lock:
            refused.append(type(e).__name__ + ": " + str(e).splitlines()[0][:160])
    del kept


def run(args, bp, np, name, sessions, hold_mib):
    path, peak_file, events_file = make_cgroup(1 << 30)
    with tempfile.TemporaryDirectory(prefix="bp-serve-probe-") as folder:
        server, endpoint, cap = start_server(args.cli, args.plugins, folder, path)
        try:
            idle_reg = registry(bp, args.plugins, endpoint, folder, 0)
            idle = idle_reg.backend("remote").device(0)
            small = bp.tensor([1.0, 2.0, 3.0], device=idle)
            regs = [registry(bp, args.plugins, endpoint, folder, i + 1) for i in range(sessions)]
            refused, lock = [], threading.Lock()
            threads = [threading.Thread(target=pattern,
                                        args=(bp, np, r.backend("remote").device(0), hold_mib, refused, lock))
                       for r in regs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            alive = server.poll() is None
            try:
                idle_ok = (small + small).tolist() == [2.0, 4.0, 6.0]
            except Exception as e:
                idle_ok = f"no: {e}"
            peak = int(open(os.path.join(path, peak_file)).read()) if os.path.exists(
                os.path.join(path, peak_file)) else -1
            events = open(os.path.join(path, events_file)).read().replace("\n", " ")
            oom = sum(1 for r in refused if "OutOfMemory" in r or "out_of_memory" in r or "limit of" in r)
            print(f"{name}: server {'alive' if alive else 'DEAD (exit ' + str(server.returncode) + ')'}; "
                  f"idle session works: {idle_ok}; {len(refused)} refusal(s), {oom} of them out_of_memory; "
                  f"cgroup peak {peak / MiB:.0f} MiB of 1024; {events.strip()}")
            for r in refused[:3]:
                print("   ", r)
            print("   server:", cap)
            del small, idle, idle_reg, regs
            return alive
        finally:
            server.terminate()
            server.wait()
            time.sleep(0.5)
            try:
                os.rmdir(path)
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="build/bin/backplane")
    ap.add_argument("--plugins", default="build/plugins")
    args = ap.parse_args()
    args.cli = os.path.abspath(args.cli)
    args.plugins = os.path.abspath(args.plugins)
    if os.geteuid() != 0:
        print("skipped: the probe makes a memory cgroup, which needs root")
        return 77
    try:
        import numpy as np
        import backplane as bp
    except ImportError as e:
        print(f"skipped: {e} (set PYTHONPATH=build/python; NumPy is needed)")
        return 77
    try:
        os.rmdir(make_cgroup(1 << 30)[0])
    except OSError as e:
        print(f"skipped: no writable memory cgroup ({e})")
        return 77
    lived = [run(args, bp, np, "one session, 700 MiB", 1, 700),
             run(args, bp, np, "four sessions, 76 MiB each", 4, 76)]
    return 0 if all(lived) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`backplane serve` under a flood of silent connections: how many real
`backplane list` runs (a remote config, default client options) get in.

Three floods, each held (for --seconds at least) while the server closes
and the flood reopens connections: 16 and 200 silent connections from 127.0.0.1 (the
clients' own address), and 200 spread over 127.0.0.2..21. During each,
--runs `backplane list` runs start one after another; the figure printed is
how many of them listed the served device. The server runs with its defaults
(loopback, --handshake-timeout-ms 5000, --max-handshakes 128,
--max-handshakes-per-address 16).

    python3 bench/serve_flood.py [--cli build/bin/backplane] [--plugins build/plugins]
"""
import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time


class SilentFlood:
    """`count` connections that never send a byte, from `sources` in turn;
    one the server closes is opened again at once."""

    def __init__(self, port, sources, count):
        self.port = port
        self.sources = [sources[i % len(sources)] for i in range(count)]
        self.stop = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_from(self, source):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((source, 0))
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        return s

    def run(self):
        sel = selectors.DefaultSelector()
        for src in self.sources:
            sel.register(self.open_from(src), selectors.EVENT_READ, src)
        while not self.stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                try:
                    if key.fileobj.recv(1):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                sel.unregister(key.fileobj)
                key.fileobj.close()
                sel.register(self.open_from(key.data), selectors.EVENT_READ, key.data)
                self.reopened += 1
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def start_server(cli, plugins, folder):
    config = os.path.join(folder, "server.json")
    with open(config, "w") as f:
        json.dump({"schema_version": 1, "plugin_dirs": [plugins], "default_backend": "cpu",
                   "backends": [{"name": "cpu", "library": "backplane_cpu", "required": True}]}, f)
    log = open(os.path.join(folder, "serve.log"), "w")
    p = subprocess.Popen([cli, "serve", "--config", config, "--listen", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    endpoint = None
    for line in p.stdout:
        if " on 127.0.0.1:" in line and endpoint is None:
            endpoint = line.split(" on ", 1)[1].split()[0].rstrip(".,;:")
        if line.startswith("ready"):
            break
    if endpoint is None:
        p.kill()
        sys.exit("backplane serve did not print its address; see " + log.name)
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p, endpoint


def client_config(plugins, endpoint, folder):
    path = os.path.join(folder, "client.json")
    with open(path, "w") as f:
        json.dump({"schema_version": 1, "plugin_dirs": [plugins],
                   "backends": [{"name": "remote", "library": "backplane_remote", "required": True,
                                 "options": {"endpoints": [endpoint]}}]}, f)
    return path


def one_flood(args, name, sources, count):
    with tempfile.TemporaryDirectory(prefix="bp-serve-flood-") as folder:
        server, endpoint = start_server(args.cli, args.plugins, folder)
        try:
            config = client_config(args.plugins, endpoint, folder)
            port = int(endpoint.rsplit(":", 1)[1])
            env = {k: v for k, v in os.environ.items() if not k.startswith("BACKPLANE_")}
            got_in, waits = 0, []
            with SilentFlood(port, sources, count) as flood:
                time.sleep(0.5)
                deadline = time.monotonic() + args.seconds
                for _ in range(args.runs):
                    begun = time.monotonic()
                    r = subprocess.run([args.cli, "list", "--config", config], env=env,
                                       capture_output=True, text=True)
                    waits.append(time.monotonic() - begun)
                    if r.returncode == 0 and "@ " + endpoint in r.stdout:
                        got_in += 1
                    elif args.verbose:
                        print("  refused:", (r.stderr or r.stdout).strip().splitlines()[-1:])
                while time.monotonic() < deadline:  # the flood lasts at least --seconds
                    time.sleep(0.1)
                reopened = flood.reopened
            runs = len(waits)
            print(f"{name}: {got_in} of {runs} `backplane list` runs got in "
                  f"(longest {max(waits):.1f} s, median {sorted(waits)[runs // 2]:.1f} s; "
                  f"the flood reopened {reopened} connections in {args.seconds:.0f} s)")
            return got_in, runs
        finally:
            server.terminate()
            server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default="build/bin/backplane")
    ap.add_argument("--plugins", default="build/plugins")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.cli = os.path.abspath(args.cli)
    args.plugins = os.path.abspath(args.plugins)
    floods = [("16 silent from 127.0.0.1", ["127.0.0.1"], 16),
              ("200 silent from 127.0.0.1", ["127.0.0.1"], 200),
              ("200 silent over 127.0.0.2..21", [f"127.0.0.{i}" for i in range(2, 22)], 200)]
    short = 0
    for name, sources, count in floods:
        got_in, runs = one_flood(args, name, sources, count)
        short += got_in * 10 < runs * 9
    print("every flood let at least 9 of 10 runs in" if short == 0
          else f"{short} flood(s) let fewer than 9 of 10 runs in")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())

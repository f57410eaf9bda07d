#!/usr/bin/env python3
"""PyTorch's torch.distributed on backplane's "backplane" c10d backend, against PyTorch's gloo in the same run.

It starts 2 ranks on this host itself (one free loopback port per run). Each rank makes two process
groups: the default group on "backplane" (registered by `import backplane.torch`) and
`dist.new_group(backend="gloo")`, and times the same work on each, alternating between them (backplane
first in even repeats, gloo first in odd ones), so that a change in the machine's load falls on both:

1. a DistributedDataParallel training step of the digits MLP (64-128-10, ReLU, cross-entropy, SGD lr 0.1
   momentum 0.9, batch 32 per rank), one DDP model per group, both from the same initial weights and on
   the same batches (their losses are checked to agree first). Timed: on rank 0, `--steps` steps after
   warm-up, each from zero_grad through forward (indexing the batch), backward with DDP's gradient
   all-reduce and the optimizer step to loss.item(); ms/step is the block's mean. Target: backplane /
   gloo <= 0.6.
2. torch.distributed.all_reduce (sum) of 4 KiB (1024 f32) and of 16 MiB (4M f32), CPU tensors. Timed: on
   rank 0, a loop of `--iters` calls (16 MiB: `--iters` / 25, at least 5) after warm-up and a barrier on
   the group; the figure is the loop's mean per call. Targets: backplane / gloo <= 0.25 (4 KiB), <= 0.8
   (16 MiB).

Each figure is the median over `--repeats` repeats (the range in parentheses); each ratio is the median of
the repeats' ratios. Timings are noisy on a shared machine: read the ratios, and the load average printed
with them. A rank that fails makes the run fail (exit 1) with that rank's stderr.

Run from the repository root, after building the package with the PyTorch bridge:

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_bridge.py [--repeats 7] [--steps 200] [--iters 500]

The ranks get BACKPLANE_CONFIG from --config (default: BACKPLANE_CONFIG, else the build tree's
build/share/backplane/backends.json when there is one) and one thread each (OMP_NUM_THREADS=1 unless set).
"""

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
WORLD = 2
SIZES = [("4 KiB", 1024), ("16 MiB", 4 << 20)]
TARGETS = {"ddp": 0.6, "4 KiB": 0.25, "16 MiB": 0.8}
LOSS_TOLERANCE = 1e-5


def big_iters(iters):
    return max(5, iters // 25)


# ---------------------------------------------------------------------------------------------------
# One rank (run with --worker by the launching process, RANK etc. in the environment)


def load_digits(path):
    import gzip

    import numpy as np
    import torch

    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    return torch.from_numpy(rows[:, :64]).float() / 16.0, torch.from_numpy(rows[:, 64].copy())


def batches(n_train, rank, world, batch_size):
    """This rank's batches (indices into the training rows), epoch after epoch, like DistributedSampler."""
    import torch

    epoch = 0
    while True:
        order = torch.randperm(n_train, generator=torch.Generator().manual_seed(epoch))
        total = (n_train + world - 1) // world * world
        order = torch.cat([order, order[: total - n_train]])[rank:total:world]
        for b in range(0, len(order), batch_size):
            yield order[b:b + batch_size]
        epoch += 1


def worker(o):
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import backplane.torch  # noqa: F401  registers the "backplane" c10d backend

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("backplane")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"backplane": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    names = list(groups)
    lead = rank == 0

    def ordered(r):
        return names if r % 2 == 0 else names[::-1]

    # all_reduce: the results first, then the timings.
    for name, g in groups.items():
        for label, n in SIZES:
            t = torch.full((n,), float(rank + 1))
            dist.all_reduce(t, group=g)
            expect = world * (world + 1) / 2
            if not bool((t == expect).all()):
                raise SystemExit(f"all_reduce of {label} on {name}: got {t[:4].tolist()}..., expected {expect}")
    reduce_ms = {label: {name: [] for name in names} for label, _ in SIZES}
    for label, n in SIZES:
        iters = o.iters if n <= 1024 else big_iters(o.iters)
        tensor = torch.zeros(n)
        for name in names:  # warm-up
            for _ in range(max(3, iters // 10)):
                dist.all_reduce(tensor, group=groups[name])
        for r in range(o.repeats):
            for name in ordered(r):
                g = groups[name]
                dist.barrier(group=g)
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(tensor, group=g)
                reduce_ms[label][name].append((time.perf_counter() - t0) / iters * 1e3)

    # DDP: one model per group from the same weights, the same batches on each.
    x, y = load_digits(o.data)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train = perm[:int(0.8 * len(y) + 0.5)]
    x, y = x[train], y[train]
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    models = {name: DDP(copy.deepcopy(mlp), process_group=groups[name]) for name in names}
    opts = {name: torch.optim.SGD(models[name].parameters(), lr=0.1, momentum=0.9) for name in names}
    feeds = {name: batches(len(y), rank, world, 32) for name in names}
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name):
        idx = next(feeds[name])
        opts[name].zero_grad()
        loss = loss_fn(models[name](x[idx]), y[idx])
        loss.backward()
        opts[name].step()
        return loss.item()

    for s in range(o.warmup):  # side by side: the same losses
        losses = {name: step(name) for name in names}
        a, b = losses["backplane"], losses["gloo"]
        if abs(a - b) > LOSS_TOLERANCE * max(1.0, abs(b)):
            raise SystemExit(f"DDP warm-up step {s}: loss {a!r} on backplane but {b!r} on gloo")
    step_ms = {name: [] for name in names}
    for r in range(o.repeats):
        for name in ordered(r):
            dist.barrier(group=groups[name])
            t0 = time.perf_counter()
            for _ in range(o.steps):
                step(name)
            step_ms[name].append((time.perf_counter() - t0) / o.steps * 1e3)
    final = {name: step(name) for name in names}

    dist.barrier(group=groups["gloo"])
    if lead:
        print("RESULT " + json.dumps({"ddp": step_ms, "all_reduce": reduce_ms, "final_loss": final,
                                      "torch": torch.__version__, "threads": torch.get_num_threads()}),
              flush=True)
    dist.destroy_process_group(groups["gloo"])
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------------
# The launching process


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_config():
    if os.environ.get("BACKPLANE_CONFIG"):
        return os.environ["BACKPLANE_CONFIG"]
    in_build = os.path.join(REPO, "build", "share", "backplane", "backends.json")
    return in_build if os.path.isfile(in_build) else ""


def tail(path, limit=8000):
    with open(path, errors="replace") as f:
        text = f.read()
    return text if len(text) <= limit else "...\n" + text[-limit:]


def launch(o, argv):
    """Runs WORLD ranks of this script with --worker; returns rank 0's RESULT, or exits 1."""
    port = free_port()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", env["OMP_NUM_THREADS"])
    if "BACKPLANE_JOB_TOKEN" not in env and "BACKPLANE_JOB_TOKEN_FILE" not in env:
        env["BACKPLANE_JOB_TOKEN"] = secrets.token_hex(32)
    if o.config:
        env["BACKPLANE_CONFIG"] = o.config
    env.update(WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with tempfile.TemporaryDirectory(prefix="torch_bridge_") as tmp:
        procs, outs, errs = [], [], []
        for rank in range(WORLD):
            outs.append(os.path.join(tmp, f"rank{rank}.out"))
            errs.append(os.path.join(tmp, f"rank{rank}.err"))
            with open(outs[-1], "w") as out, open(errs[-1], "w") as err:
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + argv,
                                              env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                                              stdin=subprocess.DEVNULL, stdout=out, stderr=err))
        deadline = time.monotonic() + o.timeout
        failed = None
        while any(p.poll() is None for p in procs):
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        timed_out = failed is None and any(p.poll() is None for p in procs)
        if failed is not None or timed_out:
            time.sleep(1 if failed is not None else 0)  # let the other rank report its side
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            why = (f"rank {failed} exited with {procs[failed].returncode}" if failed is not None
                   else f"the ranks did not finish within {o.timeout:g} s (--timeout)")
            print(f"torch_bridge.py: {why} (MASTER_PORT {port})", file=sys.stderr)
            for rank in ([failed] + [r for r in range(WORLD) if r != failed] if failed is not None
                         else range(WORLD)):
                print(f"--- rank {rank} (exit {procs[rank].returncode}) stderr:\n{tail(errs[rank])}"
                      f"--- rank {rank} stdout:\n{tail(outs[rank], 2000)}", file=sys.stderr)
            sys.exit(1)
        with open(outs[0]) as f:
            lines = [line for line in f if line.startswith("RESULT ")]
        if not lines:
            print(f"torch_bridge.py: rank 0 printed no result; its stderr:\n{tail(errs[0])}", file=sys.stderr)
            sys.exit(1)
        return json.loads(lines[-1][len("RESULT "):]), port


def summary(values):
    return statistics.median(values), min(values), max(values)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="timed blocks per contender (default 7)")
    p.add_argument("--steps", type=int, default=200, help="DDP steps per timed block (default 200)")
    p.add_argument("--warmup", type=int, default=30, help="DDP warm-up steps, losses compared (default 30)")
    p.add_argument("--iters", type=int, default=500,
                   help="all_reduce calls per timed block for 4 KiB (default 500); 16 MiB: iters/25, at least 5")
    p.add_argument("--config", default=default_config(),
                   help="backends.json for the ranks (default: BACKPLANE_CONFIG, else build/share/backplane/"
                        "backends.json when it exists)")
    p.add_argument("--data", default=os.path.join(REPO, "data", "digits.csv.gz"), help="the digits CSV")
    p.add_argument("--timeout", type=float, default=900, help="seconds before the ranks are killed")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    o = p.parse_args()
    if o.repeats < 1 or o.steps < 1 or o.iters < 1 or o.warmup < 0:
        p.error("--repeats, --steps and --iters must be at least 1, --warmup at least 0")
    if o.worker:
        return worker(o)

    if not os.path.isfile(o.data):
        p.error(f"no such file: {o.data} (--data)")
    if o.config and not os.path.isfile(o.config):
        p.error(f"no such file: {o.config} (--config)")
    argv = ["--repeats", str(o.repeats), "--steps", str(o.steps), "--warmup", str(o.warmup),
            "--iters", str(o.iters), "--data", o.data]
    load_before = os.getloadavg()
    print(f"torch_bridge.py: {WORLD} ranks on this host, one process group on each backend (backplane, "
          f"gloo), alternating; {o.repeats} repeat{'s' if o.repeats > 1 else ''}; "
          f"config {o.config or '(the package default)'}", flush=True)
    started = time.perf_counter()
    r, port = launch(o, argv)
    load_after = os.getloadavg()
    print(f"PyTorch {r['torch']}, {r['threads']} thread(s) per rank, MASTER_PORT {port}, "
          f"{time.perf_counter() - started:.1f} s")
    print("DDP: digits MLP 64-128-10, SGD lr 0.1 momentum 0.9, batch 32 per rank; "
          f"{o.steps} steps per block after {o.warmup} warm-up steps (losses equal on both)")
    print(f"all_reduce: sum of f32 CPU tensors; {o.iters} calls per block (4 KiB), {big_iters(o.iters)} (16 MiB)")
    print()
    rows = [("DDP step, digits MLP", "ms/step", 1.0, r["ddp"], TARGETS["ddp"])]
    for label, _ in SIZES:
        unit, scale = ("us/call", 1e3) if label == "4 KiB" else ("ms/call", 1.0)
        rows.append((f"all_reduce {label}", unit, scale, r["all_reduce"][label], TARGETS[label]))
    head = f"{'measure':22s} {'unit':8s} {'backplane':>26s} {'gloo':>26s} {'ratio':>20s} {'target':>8s}"
    print(head)
    print("-" * len(head))
    for name, unit, scale, ms, target in rows:
        cols = []
        for backend in ("backplane", "gloo"):
            med, lo, hi = summary([v * scale for v in ms[backend]])
            cols.append(f"{med:.3f} ({lo:.3f}-{hi:.3f})")
        ratios = [a / b for a, b in zip(ms["backplane"], ms["gloo"])]
        med, lo, hi = summary(ratios)
        verdict = "met" if med <= target else "MISSED"
        print(f"{name:22s} {unit:8s} {cols[0]:>26s} {cols[1]:>26s} {f'{med:.3f} ({lo:.3f}-{hi:.3f})':>20s} "
              f"{f'<= {target:g}':>8s} {verdict}")
    print()
    print("figures: median over the repeats (range); ratio: backplane / gloo, the median of the repeats' ratios")
    print("load average (1, 5, 15 min): before %.2f %.2f %.2f, after %.2f %.2f %.2f" % (load_before + load_after))
    return 0


if __name__ == "__main__":
    sys.exit(main())

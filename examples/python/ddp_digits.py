#!/usr/bin/env python3
"""Data-parallel training from Python: the MLP (64-128-10) of `backplane train` on the digits data.

Run it with 2 ranks (each rank trains on its shard of every global batch; backward all-reduces
the gradients of the registered parameters), from the repository root after building the package
(cmake --build --preset release --target backplane_python):

    build/bin/backplane launch -n 2 -- env PYTHONPATH=build/python /usr/bin/python3 examples/python/ddp_digits.py
    PYTHONPATH=build/python mpirun -n 2 -x PYTHONPATH /usr/bin/python3 examples/python/ddp_digits.py
                                            # + --allow-run-as-root --oversubscribe as needed

or alone (one rank): PYTHONPATH=build/python /usr/bin/python3 examples/python/ddp_digits.py. The
interpreter must be the one the bindings were built for (Debian's /usr/bin/python3 by default).

It reproduces `backplane train` step for step (the same split, shuffles, initialisation, batches,
optimizer and hyper-parameters, hence the same ops in the same order), so for the same --seed and
number of ranks it reaches the same losses and test accuracy.
"""

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

import backplane as bp
from backplane import nn

FEATURES, CLASSES = 64, 10
MASK64 = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, whose output sequence the C++ standard fixes: the shuffles of
    `backplane train` (tools/backplane/digits.hpp) draw from it."""

    N, M = 312, 156

    def __init__(self, seed):
        mt = [seed & MASK64]
        for i in range(1, self.N):
            prev = mt[-1]
            mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.mt, self.index = mt, self.N

    def _twist(self):
        mt, n, m = self.mt, self.N, self.M
        for i in range(n):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % n] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + m) % n] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def permutation(n, seed):
    """0..n-1 in the order digits::permutation gives (Fisher-Yates over mt19937_64)."""
    order = list(range(n))
    rng = MT19937_64(seed)
    for i in range(n, 1, -1):
        j = rng() % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def load_digits(path):
    """The digits CSV (gzip'd or plain): 64 pixels 0..16, then the label. x is scaled to [0, 1]."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if rows.shape[1] != FEATURES + 1:
        raise SystemExit(f"{path}: expected {FEATURES + 1} values per row, got {rows.shape[1]}")
    return (rows[:, :FEATURES].astype(np.float32) / np.float32(16)), rows[:, FEATURES].copy()


def split(x, y, train_fraction, seed):
    order = permutation(len(y), seed)
    n_train = int(train_fraction * len(order) + 0.5)
    train, test = order[:n_train], order[n_train:]
    return (x[train], y[train]), (x[test], y[test])


def shard(rows, rank, world, seed, epoch):
    """This rank's rows of an epoch, like PyTorch's DistributedSampler (and `backplane train`)."""
    order = permutation(rows, (seed * 1000003 + epoch) & MASK64)
    total = (len(order) + world - 1) // world * world
    order += order[: total - len(order)]
    return order[rank:total:world]


def in_a_job():
    return any(v in os.environ for v in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"))


def find_data(flag):
    if flag:
        return flag
    beside_config = os.path.join(os.path.dirname(str(bp.Registry.default_config_path())), "digits.csv.gz")
    in_repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "digits.csv.gz")
    for candidate in (beside_config, in_repo):
        if os.path.isfile(candidate):
            return os.path.normpath(candidate)
    raise SystemExit("cannot find digits.csv.gz: pass --data FILE")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="rows per rank per step")
    p.add_argument("--lr", type=float, default=0.0, help="default 0.1 for sgd, 0.001 for adam")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="", help="default: the config's default_backend")
    p.add_argument("--config", default="", help="backends.json (default: BACKPLANE_CONFIG, else the installed one)")
    p.add_argument("--data", default="", help="the digits CSV (default: beside the config, else data/)")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--train-fraction", type=float, default=0.8)
    p.add_argument("--metrics-out", default="", help="write a JSON summary here (rank 0)")
    o = p.parse_args()
    lr = o.lr or (0.001 if o.optimizer == "adam" else 0.1)

    rv = bp.Rendezvous.from_env() if in_a_job() else bp.Rendezvous.single_process()
    rank, world = rv.rank, rv.world_size
    lead = rank == 0
    registry = bp.Registry.from_config(o.config) if o.config else bp.default_registry()
    backend = registry.backend(o.backend) if o.backend else registry.default_backend
    device = backend.device(rv.local_rank % backend.device_count)  # one device per local rank, round robin

    data_path = find_data(o.data)
    (train_x, train_y), (test_x, test_y) = split(*load_digits(data_path), o.train_fraction, o.seed)

    bp.init_distributed(rv, bucket_mb=o.bucket_mb)
    try:
        l1 = nn.Linear(FEATURES, 128, seed=o.seed * 2 + 1, device=device)
        l2 = nn.Linear(128, CLASSES, seed=o.seed * 2 + 2, device=device)
        params = l1.parameters() + l2.parameters()
        # The capability decides here: a device without 'collective' follows its
        # backend's collective_fallback (an error names the remedy).
        for i, param in enumerate(params):
            bp.set_distributed_params(param, bp.DistributedParamId(i))
        opt = nn.SGD(params, lr=lr, momentum=o.momentum) if o.optimizer == "sgd" else nn.Adam(params, lr=lr)

        def forward(x):
            return l2(bp.relu(l1(x)))

        if lead:
            print(f"ddp_digits.py: MLP 64-128-10 on {data_path} ({len(train_y)} train / {len(test_y)} test rows), "
                  f"{world} rank{'s' if world > 1 else ''} on {device.id}, batch {o.batch_size} per rank, "
                  f"{o.optimizer} lr {lr:g}, {o.epochs} epochs, seed {o.seed}", flush=True)
        group = bp.distributed_group(device)
        bp.reset_grad_sync_stats()
        epoch_loss, steps, train_seconds = [], 0, 0.0
        for epoch in range(1, o.epochs + 1):
            rows = shard(len(train_y), rank, world, o.seed, epoch)
            n_steps = (len(rows) + o.batch_size - 1) // o.batch_size
            loss_sum, t_epoch = 0.0, time.perf_counter()
            for s in range(n_steps):
                t0 = time.perf_counter()
                idx = rows[s * o.batch_size:(s + 1) * o.batch_size]
                x = bp.tensor(train_x[idx], device=device)
                y = bp.tensor(train_y[idx], device=device)
                loss = nn.cross_entropy(forward(x), y)
                opt.zero_grad()
                loss.backward()  # all-reduces the registered parameters' gradients
                opt.step()
                loss_sum += loss.item()
                train_seconds += time.perf_counter() - t0
                steps += 1
            # The epoch's loss over every rank's shard.
            local = bp.tensor([np.float32(loss_sum / n_steps)], device=device)
            epoch_loss.append(group.all_reduce(local, bp.ReduceOp.mean).item())
            if lead:
                rate = len(rows) * world / max(time.perf_counter() - t_epoch, 1e-9)
                print(f"epoch {epoch}/{o.epochs}: {n_steps} steps, loss {epoch_loss[-1]:.4f}, {rate:.0f} samples/s",
                      flush=True)
        stats = bp.grad_sync_stats()
        with bp.no_grad():
            accuracy = nn.accuracy(forward(bp.tensor(test_x, device=device)), bp.tensor(test_y, device=device))
        per_step = train_seconds / max(steps, 1)
        if lead:
            print(f"test accuracy {accuracy:.4f} | {steps} steps | {1 / per_step:.1f} steps/s | "
                  f"{per_step * 1e3:.3f} ms/step | all_reduce {100 * stats.seconds / max(train_seconds, 1e-9):.0f}% "
                  f"of step time ({stats.collectives} collectives)", flush=True)
            if o.metrics_out:
                with open(o.metrics_out, "w") as f:
                    json.dump({"test_accuracy": accuracy, "steps": steps, "epoch_loss": epoch_loss, "nproc": world,
                               "seconds_per_step": per_step, "optimizer": o.optimizer, "lr": lr, "seed": o.seed},
                              f, indent=2)
        group.barrier()
    finally:
        bp.shutdown_distributed()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except bp.Error as e:
        print(f"ddp_digits.py: {type(e).__name__} ({e.code}): {e}", file=sys.stderr)
        sys.exit(1)

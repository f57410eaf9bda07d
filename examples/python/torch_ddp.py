#!/usr/bin/env python3
"""Plain PyTorch DistributedDataParallel on backplane's collectives: the digits MLP (64-128-10).

A standard DDP script (DistributedSampler, DDP, SGD); what makes it run on backplane is one import,
`import backplane.torch`, which registers the "backplane" c10d backend, and that backend's name in
init_process_group (--backend gloo runs the same script on PyTorch's own gloo, to compare). Run it with
2 ranks from the repository root after building the package with the PyTorch bridge:

    build/bin/backplane launch -n 2 -- env PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_ddp.py

It needs PyTorch in that interpreter (Debian's python3-torch). Rank 0 prints the loss of each epoch
(the mean over every rank's batches) and the test accuracy at the end.
"""

import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import backplane.torch  # registers the "backplane" c10d backend

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "digits.csv.gz")


def load_digits(path):
    """The digits CSV (gzip'd or plain): 64 pixels 0..16, then the label. x is scaled to [0, 1]."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    return torch.from_numpy(rows[:, :64]).float() / 16, torch.from_numpy(rows[:, 64].copy())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="backplane", help='the c10d backend (default "backplane"; or gloo)')
    p.add_argument("--data", default=os.path.normpath(DATA), help="the digits CSV (default: the repository's)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="rows per rank per step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher (env://).
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # The same 80/20 split on every rank; the sampler gives each rank its share of the training rows.
    x, y = load_digits(args.data)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed))
    n_train = int(0.8 * len(y) + 0.5)
    train = TensorDataset(x[order[:n_train]], y[order[:n_train]])
    test_x, test_y = x[order[n_train:]], y[order[n_train:]]
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)  # DDP also broadcasts rank 0's initial weights
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    if rank == 0:
        print(f"torch_ddp.py: MLP 64-128-10 on {args.data} ({len(train)} train / {len(test_y)} test rows), "
              f"{world} rank(s) on the {dist.get_backend()} backend, batch {args.batch_size} per rank, "
              f"{args.epochs} epochs", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        model.train()
        started, loss_sum, steps = time.perf_counter(), 0.0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            loss_sum += loss.item()
            steps += 1
        mean_loss = torch.tensor([loss_sum / steps])
        dist.all_reduce(mean_loss)  # sum over the ranks
        if rank == 0:
            ms = (time.perf_counter() - started) / steps * 1e3
            print(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss.item() / world:.4f}, {steps} steps, "
                  f"{ms:.2f} ms/step", flush=True)

    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    if rank == 0:
        print(f"test accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

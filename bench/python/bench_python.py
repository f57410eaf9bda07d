#!/usr/bin/env python3
"""Benchmarks of the Python bindings, each beside a reference measured in the same run.

1. The cost of a tiny op from Python: a 16-element f32 add (`a + b` and `backplane.add`, a new
   tensor each time) against PyTorch's eager `torch.add` / `x + y` on the same machine.
   Goal: backplane / PyTorch <= 1.
2. DLPack hand-off, backplane -> NumPy and backplane -> PyTorch (and back), for tensors from
   4 KiB to 64 MiB: the time per hand-off should not depend on the size (no copy). The
   reference is a copy of the same bytes (NumPy's ndarray.copy), which grows with the size.

Run: build/bin/bench_python [--quick]  (the launcher sets PYTHONPATH and the interpreter), or
PYTHONPATH=build/python /usr/bin/python3 bench/python/bench_python.py. Timings are noisy: read
the ratios. Buffers are touched before timing (first-touch page faults are slow on small VMs).
"""

import argparse
import gc
import statistics
import sys
import time

import numpy as np

import backplane as bp

try:
    import torch
except ImportError:  # the PyTorch columns are left out
    torch = None


def per_call_ns(fn, calls, repeats):
    """The median over `repeats` runs of the mean time of one call in a loop of `calls`."""
    fn()
    samples = []
    for _ in range(repeats):
        gc.disable()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls)
        gc.enable()
    return statistics.median(samples), min(samples)


def tiny_op(calls, repeats):
    print(f"== tiny op: 16-element f32 add, new tensor per call (median of {repeats} x {calls} calls; min in [])")
    a = bp.tensor(np.arange(16, dtype=np.float32))
    b = bp.tensor(np.ones(16, dtype=np.float32))
    rows = [("backplane  a + b", lambda: a + b), ("backplane  bp.add(a, b)", lambda: bp.add(a, b))]
    if torch is not None:
        torch.set_num_threads(1)
        x = torch.arange(16, dtype=torch.float32)
        y = torch.ones(16, dtype=torch.float32)
        rows += [("PyTorch    torch.add(x, y)", lambda: torch.add(x, y)), ("PyTorch    x + y", lambda: x + y)]
    results = {}
    for name, fn in rows:
        med, best = per_call_ns(fn, calls, repeats)
        results[name] = med
        print(f"  {name:28s} {med:8.0f} ns/op  [{best:.0f}]")
    if torch is not None:
        ref = results["PyTorch    torch.add(x, y)"]
        for name in ("backplane  a + b", "backplane  bp.add(a, b)"):
            print(f"  ratio {name.split(None, 1)[1]:18s} / torch.add = {results[name] / ref:.2f}  (goal <= 1)")
    return results


def handoff(sizes_mib, calls, repeats):
    print(f"== DLPack hand-off of an f32 tensor (median of {repeats} x {calls} hand-offs; us per hand-off)")
    header = f"  {'size':>9s} {'bp->NumPy':>10s} {'bp->torch':>10s} {'NumPy->bp':>10s} {'torch->bp':>10s} {'copy ref':>10s}"
    print(header)
    for mib in sizes_mib:
        n = int(mib * (1 << 20)) // 4
        src = np.arange(n, dtype=np.float32)  # touched
        t = bp.tensor(src)
        cols = [per_call_ns(lambda: np.from_dlpack(t), calls, repeats)[0]]
        if torch is not None:
            cols.append(per_call_ns(lambda: torch.from_dlpack(t), calls, repeats)[0])
        else:
            cols.append(float("nan"))
        cols.append(per_call_ns(lambda: bp.from_dlpack(src), calls, repeats)[0])
        if torch is not None:
            tt = torch.from_numpy(src.copy())
            cols.append(per_call_ns(lambda: bp.from_dlpack(tt), calls, repeats)[0])
        else:
            cols.append(float("nan"))
        dst = np.empty_like(src)  # touched by the first copy, outside the timed runs
        copy_calls = max(1, min(calls, int(256 / max(mib, 1e-3))))
        cols.append(per_call_ns(lambda: np.copyto(dst, src), copy_calls, repeats)[0])
        size = f"{mib:g} MiB" if mib >= 1 else f"{mib * 1024:g} KiB"
        print(f"  {size:>9s} " + " ".join(f"{c / 1000:10.2f}" for c in cols))
        # Sharing, not copying: a write through backplane is seen through the consumers.
        view_np, view_t = np.from_dlpack(t), (torch.from_dlpack(t) if torch is not None else None)
        t.copy_(bp.full([n], 7.0))
        assert view_np[n - 1] == 7.0 and (view_t is None or view_t[n - 1].item() == 7.0)
        del t, src, dst, view_np, view_t


def main():
    p = argparse.ArgumentParser(description="backplane Python bindings benchmarks")
    p.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    o = p.parse_args()
    print(f"backplane {bp.__version__} from {bp.__file__}; Python {sys.version.split()[0]}; NumPy {np.__version__}; "
          f"PyTorch {torch.__version__ if torch is not None else 'not installed'}")
    calls, repeats = (2000, 3) if o.quick else (100000, 7)
    tiny_op(calls, repeats)
    handoff([1 / 256, 1, 16, 64], 200 if o.quick else 2000, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Trains the digits MLP on a partial backend (an example plugin that runs
three ops, with "op_fallback" and "collective_fallback" set to host:cpu) and
on cpu, same seed and ranks, and checks that the two learn the same thing:
the same per-epoch losses (within float tolerance) and test accuracy, and a
fallback report naming what ran on cpu.

usage: partial_train.py CLI CONFIG DATA OUT BACKEND
"""
import json
import math
import os
import subprocess
import sys


def train(cli, config, data, out, backend):
    metrics = os.path.join(out, f"metrics_{backend}.json")
    cmd = [cli, "train", "--config", config, "--data", data, "--backend", backend, "--nproc", "2",
           "--epochs", "3", "--seed", "7", "--metrics-out", metrics]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    sys.stdout.write(run.stdout + run.stderr)
    if run.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {run.returncode}")
    with open(metrics, encoding="utf-8") as f:
        return json.load(f), run.stdout + run.stderr


def main():
    cli, config, data, out, backend = sys.argv[1:6]
    os.makedirs(out, exist_ok=True)
    partial, text = train(cli, config, data, out, backend)
    cpu, _ = train(cli, config, data, out, "cpu")
    for a, b in zip(partial["epoch_loss"], cpu["epoch_loss"], strict=True):
        if not math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6):
            sys.exit(f"FAIL: epoch losses differ: {partial['epoch_loss']} ({backend}) vs {cpu['epoch_loss']} (cpu)")
    if abs(partial["test_accuracy"] - cpu["test_accuracy"]) > 1e-9:
        sys.exit(f"FAIL: accuracy {partial['test_accuracy']} ({backend}) vs {cpu['test_accuracy']} (cpu)")
    fallbacks = partial.get("op_fallbacks", {})
    if not fallbacks or not any(v.get("calls", 0) > 0 for v in fallbacks.values()):
        sys.exit(f"FAIL: the metrics name no op that fell back: {fallbacks}")
    if "op_fallback" not in text:
        sys.exit("FAIL: train printed no op_fallback summary line")
    top = list(fallbacks)[:3]
    print(f"ok: {backend} trained like cpu (accuracy {partial['test_accuracy']}, losses {partial['epoch_loss']}); "
          f"{len(fallbacks)} (op, dtype) pairs fell back, most time first: {', '.join(top)}")


if __name__ == "__main__":
    main()

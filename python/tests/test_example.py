# examples/python/ddp_digits.py with 2 ranks, under `backplane launch -n 2`
# and under `mpirun -n 2`: it must reach exactly the losses and test accuracy
# of `backplane train` with the same seed and number of ranks (the same ops
# in the same order on the same data).
import json
import os
import subprocess
import sys

import pytest

from conftest import free_port
from test_collectives import mpirun_command

TIMEOUT = 240


@pytest.fixture(scope="module")
def example(source_dir):
    return os.path.join(source_dir, "examples", "python", "ddp_digits.py")


def env_for_ranks():
    env = dict(os.environ)
    # One thread per rank, as `backplane train` gives its ranks on this many cores.
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    env.setdefault("BACKPLANE_JOB_TOKEN", "python-example-test-token")
    return env


@pytest.fixture(scope="module")
def reference(cli, data_file, tmp_path_factory):
    metrics = tmp_path_factory.mktemp("cli") / "metrics.json"
    proc = subprocess.run([cli, "train", "--nproc", "2", "--data", data_file, "--metrics-out", str(metrics)],
                          env=env_for_ranks(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(metrics.read_text())


def check(metrics_file, reference, output):
    m = json.loads(metrics_file.read_text())
    assert m["nproc"] == 2 and m["steps"] == reference["steps"]
    assert m["test_accuracy"] == reference["test_accuracy"], output
    assert m["epoch_loss"] == pytest.approx(reference["epoch_loss"], rel=1e-6)
    assert reference["test_accuracy"] > 0.9


def test_under_backplane_launch(cli, example, data_file, reference, tmp_path):
    metrics = tmp_path / "metrics.json"
    proc = subprocess.run([cli, "launch", "-n", "2", "--", sys.executable, example, "--data", data_file,
                           "--metrics-out", str(metrics)],
                          env=env_for_ranks(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test accuracy" in proc.stdout
    check(metrics, reference, proc.stdout)


def test_under_mpirun(example, data_file, reference, tmp_path):
    metrics = tmp_path / "metrics.json"
    env = env_for_ranks()
    env["MASTER_PORT"] = str(free_port())
    cmd = mpirun_command(2) + ["-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS", sys.executable, example,
                               "--data", data_file, "--metrics-out", str(metrics)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check(metrics, reference, proc.stdout)


def test_single_process(example, data_file, tmp_path):
    metrics = tmp_path / "metrics.json"
    env = env_for_ranks()
    for v in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        env.pop(v, None)
    proc = subprocess.run([sys.executable, example, "--data", data_file, "--epochs", "2", "--metrics-out",
                           str(metrics)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(metrics.read_text())["nproc"] == 1

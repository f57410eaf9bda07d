# examples/python/torch_ddp.py (plain PyTorch DDP on the "backplane" c10d
# backend that `import backplane.torch` registers) with 2 ranks under
# `backplane launch -n 2`: it must exit 0, print one loss per epoch and reach a
# test accuracy above 0.9. Skipped where PyTorch or backplane.torch cannot be
# imported (a build without the PyTorch bridge).
import os
import re
import subprocess
import sys

import pytest

try:
    import torch  # noqa: F401
except ImportError as e:
    pytest.skip(f"PyTorch cannot be imported by {sys.executable} ({e})", allow_module_level=True)
try:
    import backplane.torch  # noqa: F401
except ImportError as e:
    pytest.skip(f"backplane.torch cannot be imported ({e}): the package was built without the PyTorch bridge",
                allow_module_level=True)

TIMEOUT = 240
EPOCHS = 5


@pytest.fixture(scope="module")
def example(source_dir):
    return os.path.join(source_dir, "examples", "python", "torch_ddp.py")


def env_for_ranks():
    env = dict(os.environ)
    # One thread per rank: 2 ranks share this many cores.
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def test_torch_ddp_under_backplane_launch(cli, example, data_file):
    proc = subprocess.run([cli, "launch", "-n", "2", "--", sys.executable, example, "--data", data_file,
                           "--epochs", str(EPOCHS)],
                          env=env_for_ranks(), capture_output=True, text=True, timeout=TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "on the backplane backend" in proc.stdout, output
    # Rank 0 alone prints, one line per epoch.
    epochs = re.findall(r"^\[rank (\d+)\] epoch (\d+)/\d+: loss ([0-9.]+)", proc.stdout, re.MULTILINE)
    assert [(r, int(e)) for r, e, _ in epochs] == [("0", e) for e in range(1, EPOCHS + 1)], output
    assert float(epochs[-1][2]) < float(epochs[0][2]), output
    accuracy = re.findall(r"^\[rank 0\] test accuracy ([0-9.]+)$", proc.stdout, re.MULTILINE)
    assert len(accuracy) == 1, output
    assert float(accuracy[0]) > 0.9, output

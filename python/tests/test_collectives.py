# Collectives: a 2-rank process group in one process (one thread per rank)
# and across two processes under `backplane launch -n 2` and `mpirun -n 2`.
# The in-process test is also the GIL test: group creation and every
# collective block until the other rank arrives, so each completes only if a
# thread blocked in C++ lets the other thread run Python meanwhile. Were the
# GIL held, the second rank could never make its call: the group's timeout
# would turn that into a backplane.Timeout or CollectiveError, failing the test.
import os
import shutil
import subprocess
import sys
import threading

import pytest

import backplane as bp
from conftest import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 60  # seconds; only reached on a failure


def run_ranks(fn, world=2):
    port = free_port()
    results, errors = [None] * world, []
    inside = threading.Barrier(world, timeout=TIMEOUT)

    def rank_main(rank):
        try:
            rv = bp.Rendezvous(rank, world, "127.0.0.1", port, timeout=TIMEOUT)
            results[rank] = fn(rank, rv, inside)
        except BaseException as e:  # reported by the main thread
            errors.append((rank, e))
            inside.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_two_threads_progress_at_once_inside_collectives(cpu):
    log = []

    def rank_main(rank, rv, inside):
        group = bp.ProcessGroup.create(cpu, rv)
        x = bp.tensor([1.0, 2.0]) * (rank + 1)
        out = {"sum": group.all_reduce(x).tolist()}
        # Rank 0 enters all_reduce first and waits there for rank 1, which runs
        # ops, a backward and a read in Python meanwhile.
        if rank == 1:
            inside.wait()  # rank 0 is about to block in C++
            w = bp.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
            (w @ w).sum().backward()
            log.append(("rank 1 computed while rank 0 waited", w.grad.tolist()))
            out["mean"] = group.all_reduce(x, bp.ReduceOp.mean).tolist()
        else:
            inside.wait()
            out["mean"] = group.all_reduce(x, bp.ReduceOp.mean).tolist()
        out["gather"] = group.all_gather(bp.tensor([float(rank)])).tolist()
        out["bcast"] = group.broadcast(bp.tensor([float(rank)]), root=0).tolist()
        y = bp.tensor([float(rank)])
        group.all_reduce_(y, "max")
        out["inplace"] = y.tolist()
        out["scatter"] = group.reduce_scatter(bp.tensor([[1.0], [2.0]])).tolist()
        group.barrier()
        return out

    r0, r1 = run_ranks(rank_main)
    for rank, out in enumerate((r0, r1)):
        assert out["sum"] == [3.0, 6.0]
        assert out["mean"] == [1.5, 3.0]
        assert out["gather"] == [[0.0], [1.0]]
        assert out["bcast"] == [0.0]
        assert out["inplace"] == [1.0]
        assert out["scatter"] == [[2.0], [4.0]][rank]
    assert log == [("rank 1 computed while rank 0 waited", [[7.0, 11.0], [9.0, 13.0]])]


def test_ops_from_many_threads(cpu):
    # Independent graphs on several threads at once (the GIL is released in
    # every op): each gets its own, correct gradients.
    results, errors = {}, []

    def work(i):
        try:
            x = bp.full([64, 64], float(i), requires_grad=True)
            for _ in range(20):
                y = (x @ x).mean()
            y.backward()
            results[i] = x.grad.sum().item()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):  # d mean(x @ x) / dx = 2 * 64 * i / 64^2 per element, 4096 elements
        assert results[i] == pytest.approx(2 * 64 * i / 4096 * 4096, rel=1e-5)


def test_local_fallback_group(nocoll_registry):
    rv = bp.Rendezvous.single_process(timeout=10)
    group = bp.ProcessGroup.create(nocoll_registry.backend("lenient").device(0), rv)
    assert group.is_local and group.world_size == 1
    assert group.all_reduce(bp.tensor([2.0], device=group.device)).tolist() == [2.0]
    with pytest.raises(bp.CapabilityMissing):
        bp.ProcessGroup.create(nocoll_registry.backend("plain").device(0), bp.Rendezvous.single_process())


def worker_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), HERE] if p)
    env.setdefault("BACKPLANE_JOB_TOKEN", "python-collective-test-token")
    return env


def test_two_processes_under_backplane_launch(cli):
    worker = os.path.join(HERE, "collective_worker.py")
    proc = subprocess.run([cli, "launch", "-n", "2", "--timeout", str(TIMEOUT), "--", sys.executable, worker],
                          env=worker_env(), capture_output=True, text=True, timeout=TIMEOUT * 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 ok" in proc.stdout and "rank 1 ok" in proc.stdout


def mpirun_command(n):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["-x", "BACKPLANE_JOB_TOKEN", "-x", "MASTER_PORT", "-x", "PYTHONPATH", "-x", "BACKPLANE_CONFIG"]


def test_two_processes_under_mpirun():
    env = worker_env()
    env["MASTER_PORT"] = str(free_port())
    worker = os.path.join(HERE, "collective_worker.py")
    proc = subprocess.run(mpirun_command(2) + [sys.executable, worker], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT * 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 ok" in proc.stdout and "rank 1 ok" in proc.stdout

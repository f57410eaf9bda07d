# One rank of the 2-rank collective test (test_collectives.py starts it under
# `backplane launch -n 2` and `mpirun -n 2`): the collectives of a process
# group across processes, then data-parallel gradient synchronisation. Exits
# non-zero (an assertion) on a wrong result; prints "rank R ok" at the end.
import backplane as bp

rv = bp.Rendezvous.from_env()
rank, world = rv.rank, rv.world_size
assert world == 2, world
device = bp.default_registry().default_backend.device(0)
group = bp.ProcessGroup.create(device, rv, timeout=60)
assert (group.rank, group.world_size) == (rank, world)

x = bp.tensor([1.0, 2.0, 3.0]) * (rank + 1)
assert group.all_reduce(x).tolist() == [3.0, 6.0, 9.0]
assert group.all_reduce(x, bp.ReduceOp.mean).tolist() == [1.5, 3.0, 4.5]
assert group.all_reduce(x, "max").tolist() == [2.0, 4.0, 6.0]
y = bp.tensor([10.0, 20.0]) + rank
assert group.all_reduce_(y) is y and y.tolist() == [21.0, 41.0]
assert group.broadcast(bp.full([2], float(rank + 5)), root=1).tolist() == [6.0, 6.0]
assert group.all_gather(bp.tensor([float(rank)])).tolist() == [[0.0], [1.0]]
assert group.reduce_scatter(bp.tensor([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1)).tolist() == \
    [[3.0, 6.0], [9.0, 12.0]][rank]
group.barrier()

# Data-parallel: each rank's gradient differs; backward averages them.
bp.init_distributed(rv)
w = bp.tensor([1.0, 1.0], requires_grad=True)
bp.set_distributed_params(w, bp.DistributedParamId(42))
assert bp.is_distributed(w)
(w * bp.tensor([1.0, 2.0]) * float(rank + 1)).sum().backward()
assert w.grad.tolist() == [1.5, 3.0], w.grad.tolist()
assert bp.grad_sync_stats().gradients >= 1
bp.shutdown_distributed()
print(f"rank {rank} ok", flush=True)

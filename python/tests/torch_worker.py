# One rank of the torch.distributed tests (test_torch_bridge.py starts N of
# these with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set): unchanged
# PyTorch code on the c10d backend that `import backplane.torch` registers.
# argv[1] names the scenario. Results are checked against a gloo group in the
# same process and against an expected value computed here from every rank's
# input (each rank's input is a function of its rank, so every rank knows them
# all): gloo is the reference where it supports the call, the local value where
# it does not (bfloat16, bool, AVG, reduce_scatter, _all_gather_base, views).
# Prints "rank R ok" at the end; on a failure, the traceback and
# "rank R FAILED in <scenario>", and exits 1 without waiting for the peers.
import datetime
import faulthandler
import functools
import gzip
import operator
import os
import signal
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

import backplane.torch  # noqa: F401  (registers the "backplane" c10d backend)

warnings.filterwarnings("ignore", message=".*(deprecated|private function).*")

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=60)
# The killed-peer scenario's group timeout: a survivor must raise within it
# (the peer's exit is seen at once; only a missed exit would wait it out).
KILL_TIMEOUT = datetime.timedelta(seconds=20)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
DTYPES = FLOATS + INTS + [torch.bool]
COMPLEX = [torch.complex64, torch.complex128]
ARITH = ["SUM", "PRODUCT", "MIN", "MAX"]
BITWISE = ["BAND", "BOR", "BXOR"]


class Failure(AssertionError):
    pass


def expect(cond, message):
    if not cond:
        raise Failure(message)


def init(backend="backplane", timeout=TIMEOUT, **kwargs):
    dist.init_process_group(backend, timeout=timeout, **kwargs)
    expect(dist.get_backend() == backend, f"get_backend() is {dist.get_backend()!r}, not {backend!r}")
    expect((dist.get_rank(), dist.get_world_size()) == (RANK, WORLD),
           f"rank/size {(dist.get_rank(), dist.get_world_size())}, expected {(RANK, WORLD)}")


def make(dtype, shape, seed, rank):
    """Small exact values: sums and products over 3 ranks are exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1009 + rank * 17 + 1)
    if dtype in COMPLEX:
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        return torch.complex(make(part, shape, seed, rank), make(part, shape, seed + 7, rank))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 6, shape, generator=g).to(dtype)
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=g).to(dtype)
    return (torch.randint(-4, 5, shape, generator=g).to(torch.float64) / 2).to(dtype)


def combine(op, xs):
    boolean = xs[0].dtype == torch.bool
    fn = {
        "SUM": operator.or_ if boolean else operator.add,  # bool SUM is OR, PRODUCT AND (as NCCL)
        "PRODUCT": operator.and_ if boolean else operator.mul,
        "MIN": torch.minimum,
        "MAX": torch.maximum,
        "BAND": operator.and_,
        "BOR": operator.or_,
        "BXOR": operator.xor,
    }[op]
    return functools.reduce(fn, [x.clone() for x in xs])


def as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def same(actual, expected, rtol=0.0, atol=0.0):
    """None when equal (dtype, shape and values), else why not."""
    actual, expected = as_list(actual), as_list(expected)
    if len(actual) != len(expected):
        return f"{len(actual)} tensors, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            return f"tensor {i}: {err}\n  got      {brief(a)}\n  expected {brief(e)}"
    return None


def brief(t):
    return t.tolist() if t.numel() <= 64 else f"{t.reshape(-1)[:32].tolist()} ... ({t.numel()} elements)"


def show(x):
    return [brief(t) for t in as_list(x)]


class Checker:
    """Runs one call on the backplane group and on the gloo group, on copies of the same inputs."""

    def __init__(self, bp, gloo):
        self.bp, self.gloo, self.cases = bp, gloo, 0

    def __call__(self, what, fn, inputs, expected, gloo=True, rtol=0.0, atol=0.0):
        # fn(group, inputs) -> the result (a tensor or a list); expected None: not checked on this rank.
        self.cases += 1
        label = f"{what} (rank {RANK} of {WORLD})"
        ref = None
        if gloo:
            try:
                ref = fn(self.gloo, [clone(x) for x in inputs])
            except Exception as e:
                raise Failure(f"{label}: the reference, gloo, raised (the test's error): {e}") from e
            if expected is not None:
                why = same(ref, expected, rtol, atol)
                expect(why is None, f"{label}: the test's expected value disagrees with gloo: {why}")
        try:
            got = fn(self.bp, [clone(x) for x in inputs])
        except Exception as e:
            raise Failure(f"{label}: backplane raised {type(e).__name__}: {e}"
                          + (f" (gloo gave {show(ref)})" if gloo else "")) from e
        if expected is not None:
            why = same(got, expected, rtol, atol)
            expect(why is None, f"{label}: backplane's result is wrong: {why}"
                   + (f"\n  gloo gave {show(ref)}" if gloo else ""))
        return got


def clone(x):
    if isinstance(x, list):
        return [clone(t) for t in x]
    return None if x is None else x.clone()


def gloo_has(dtype):
    return dtype not in (torch.bfloat16, torch.bool)


# --- collectives ---------------------------------------------------------

def collectives():
    init("backplane")
    bp = dist.distributed_c10d._get_default_group()
    gloo = dist.new_group(backend="gloo")
    expect(dist.get_backend(gloo) == "gloo", "the gloo group")
    check = Checker(bp, gloo)
    ranks = range(WORLD)
    shape = (3, 5)

    def allreduce(op):
        return lambda g, xs: (dist.all_reduce(xs[0], op=getattr(dist.ReduceOp, op), group=g), xs[0])[1]

    for i, dtype in enumerate(DTYPES):
        for op in ARITH + (BITWISE if not dtype.is_floating_point else []):
            seed = 100 + i
            check(f"all_reduce {op} {dtype}", allreduce(op), [make(dtype, shape, seed, RANK)],
                  combine(op, [make(dtype, shape, seed, r) for r in ranks]), gloo=gloo_has(dtype))

    # A large tensor (several pipeline chunks), a 0-d and an empty one.
    for dtype, n in [(torch.float32, (1 << 18) + 3), (torch.int64, 70001), (torch.bfloat16, 100003)]:
        check(f"all_reduce SUM {dtype} of {n} elements", allreduce("SUM"), [make(dtype, (n,), 5, RANK)],
              combine("SUM", [make(dtype, (n,), 5, r) for r in ranks]), gloo=gloo_has(dtype))
    check("all_reduce SUM 0-d", allreduce("SUM"), [torch.tensor(RANK + 0.5)],
          torch.tensor(sum(r + 0.5 for r in ranks)))
    check("all_reduce SUM empty", allreduce("SUM"), [torch.zeros(0)], torch.zeros(0))
    # int64 beyond 2^53 and 2^32: no detour through double or int32.
    big = torch.tensor([2**62 // WORLD + RANK, -(2**40) - RANK, 2**33 + 1], dtype=torch.int64)
    check("all_reduce SUM int64 beyond 2^53", allreduce("SUM"), [big],
          sum(torch.tensor([2**62 // WORLD + r, -(2**40) - r, 2**33 + 1], dtype=torch.int64) for r in ranks))
    # Random float32: every rank must get the same bits (DDP's replicas depend on it).
    noise = torch.randn(4099, generator=torch.Generator().manual_seed(RANK))
    summed = check("all_reduce SUM float32 randn", allreduce("SUM"), [noise],
                   sum(torch.randn(4099, generator=torch.Generator().manual_seed(r)) for r in ranks),
                   rtol=1e-5, atol=1e-5)
    gathered = [torch.empty_like(summed) for _ in ranks]
    dist.all_gather(gathered, summed, group=gloo)
    for r in ranks:
        expect(torch.equal(gathered[r], summed),
               f"all_reduce SUM float32: rank {r}'s result differs from rank {RANK}'s in "
               f"{int((gathered[r] != summed).sum())} of {summed.numel()} elements")

    # AVG: the exact mean, or a RuntimeError that names AVG, the same on every rank.
    for dtype in (torch.float32, torch.float64):
        x = make(dtype, shape, 9, RANK)
        try:
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            outcome = "result"
            why = same(x, combine("SUM", [make(dtype, shape, 9, r) for r in ranks]) / WORLD, 1e-6, 1e-6)
            expect(why is None, f"all_reduce AVG {dtype}: {why}")
        except RuntimeError as e:
            outcome = "error"
            expect("avg" in str(e).lower(), f"all_reduce AVG {dtype} raised without naming AVG: {e}")
        if RANK == 0:
            print(f"rank 0: all_reduce AVG {dtype}: {outcome}", flush=True)
        outcomes = [None] * WORLD
        dist.all_gather_object(outcomes, outcome, group=gloo)
        expect(len(set(outcomes)) == 1, f"all_reduce AVG {dtype}: per rank {outcomes}")

    # Complex numbers (torch.distributed views them as pairs of reals).
    for dtype in COMPLEX:
        check(f"all_reduce SUM {dtype}", allreduce("SUM"), [make(dtype, shape, 11, RANK)],
              combine("SUM", [make(dtype, shape, 11, r) for r in ranks]))
        x = make(dtype, shape, 12, RANK)
        dist.distributed_c10d._get_default_group().allreduce([x]).wait()
        why = same(x, combine("SUM", [make(dtype, shape, 12, r) for r in ranks]))
        expect(why is None, f"ProcessGroup.allreduce([{dtype}]) SUM (no view_as_real by torch): {why}")

    # Non-contiguous views and a slice with a storage offset: the result lands in the view, the rest is kept.
    views = {"x.t()": lambda b: b.t(), "x[:, ::2]": lambda b: b[:, ::2], "x[1:3]": lambda b: b[1:3],
             "x[::2, 1::2]": lambda b: b[::2, 1::2]}
    for name, view in views.items():
        for dtype in (torch.float32, torch.int64):
            bases = [make(dtype, (4, 6), 21, r) for r in ranks]
            expected = bases[RANK].clone()
            view(expected).copy_(combine("SUM", [view(b) for b in bases]))
            check(f"all_reduce SUM into {name} {dtype}",
                  lambda g, xs: (dist.all_reduce(view(xs[0]), group=g), xs[0])[1],
                  [bases[RANK]], expected, gloo=False)
            for src in ranks:
                expected = bases[RANK].clone()
                view(expected).copy_(view(bases[src]))
                check(f"broadcast from {src} into {name} {dtype}",
                      lambda g, xs: (dist.broadcast(view(xs[0]), src, group=g), xs[0])[1],
                      [bases[RANK]], expected, gloo=False)

    # all_reduce_coalesced: tensors of different shapes, one dtype.
    shapes = [(4,), (2, 3), (5,), ()]
    for dtype in (torch.float32, torch.int64, torch.float16, torch.bfloat16, torch.bool):
        for op in ("SUM", "MAX"):
            check(f"all_reduce_coalesced {op} {dtype}",
                  lambda g, xs: (dist.all_reduce_coalesced(xs, op=getattr(dist.ReduceOp, op), group=g), xs)[1],
                  [make(dtype, s, 30 + k, RANK) for k, s in enumerate(shapes)],
                  [combine(op, [make(dtype, s, 30 + k, r) for r in ranks]) for k, s in enumerate(shapes)],
                  gloo=gloo_has(dtype))

    for dtype in DTYPES + COMPLEX:
        for src in ranks:
            check(f"broadcast from {src} {dtype}",
                  lambda g, xs: (dist.broadcast(xs[0], src, group=g), xs[0])[1],
                  [make(dtype, shape, 40, RANK)], make(dtype, shape, 40, src),
                  gloo=gloo_has(dtype) and not dtype.is_complex)  # torch views only all_reduce/all_gather as reals
        check(f"all_gather {dtype}",
              lambda g, xs: (dist.all_gather(xs[1:], xs[0], group=g), xs[1:])[1],
              [make(dtype, shape, 41, RANK)] + [torch.empty(shape, dtype=dtype) for _ in ranks],
              [make(dtype, shape, 41, r) for r in ranks], gloo=gloo_has(dtype))

    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.uint8):
        check(f"_all_gather_base {dtype}",
              lambda g, xs: (dist._all_gather_base(xs[1], xs[0], group=g), xs[1])[1],
              [make(dtype, (2, 3), 42, RANK), torch.empty((2 * WORLD, 3), dtype=dtype)],
              torch.cat([make(dtype, (2, 3), 42, r) for r in ranks]), gloo=False)

    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        ins = [make(dtype, (3,), 43, RANK), make(dtype, (2, 2), 44, RANK)]
        check(f"all_gather_coalesced {dtype}",
              lambda g, xs: (dist.all_gather_coalesced(xs[1], xs[0], group=g), [t for out in xs[1] for t in out])[1],
              [ins, [[torch.empty_like(t) for t in ins] for _ in ranks]],
              [t for r in ranks for t in (make(dtype, (3,), 43, r), make(dtype, (2, 2), 44, r))],
              gloo=gloo_has(dtype))

    for i, dtype in enumerate(DTYPES):
        for op in ["SUM", "MAX"] + (["PRODUCT", "MIN"] if dtype in (torch.float32, torch.int64) else []):
            for dst in ranks:
                seed = 50 + i
                check(f"reduce {op} to {dst} {dtype}",
                      lambda g, xs: (dist.reduce(xs[0], dst, op=getattr(dist.ReduceOp, op), group=g), xs[0])[1],
                      [make(dtype, shape, seed, RANK)],
                      combine(op, [make(dtype, shape, seed, r) for r in ranks]) if RANK == dst else None,
                      gloo=gloo_has(dtype))

    for dtype in (torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool, torch.bfloat16, torch.float16):
        for root in ranks:
            check(f"gather to {root} {dtype}",
                  lambda g, xs: (dist.gather(xs[0], xs[1:] if RANK == root else None, root, group=g), xs[1:])[1],
                  [make(dtype, shape, 60, RANK)] + ([torch.empty(shape, dtype=dtype) for _ in ranks]
                                                      if RANK == root else []),
                  [make(dtype, shape, 60, r) for r in ranks] if RANK == root else [],
                  gloo=gloo_has(dtype))
            check(f"scatter from {root} {dtype}",
                  lambda g, xs: (dist.scatter(xs[0], xs[1:] if RANK == root else None, root, group=g), xs[0])[1],
                  [torch.empty(shape, dtype=dtype)] + ([make(dtype, shape, 61 + r, root) for r in ranks]
                                                       if RANK == root else []),
                  make(dtype, shape, 61 + RANK, root), gloo=gloo_has(dtype))

    # reduce_scatter: rank q's input_list[r] goes to rank r.
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int8, torch.bfloat16, torch.bool):
        for op in ("SUM", "MAX", "PRODUCT"):
            check(f"reduce_scatter {op} {dtype}",
                  lambda g, xs: (dist.reduce_scatter(xs[0], xs[1:], op=getattr(dist.ReduceOp, op), group=g),
                                 xs[0])[1],
                  [torch.empty(shape, dtype=dtype)] + [make(dtype, shape, 70 + r, RANK) for r in ranks],
                  combine(op, [make(dtype, shape, 70 + RANK, q) for q in ranks]), gloo=False)
            check(f"_reduce_scatter_base {op} {dtype}",
                  lambda g, xs: (dist._reduce_scatter_base(xs[0], xs[1], op=getattr(dist.ReduceOp, op), group=g),
                                 xs[0])[1],
                  [torch.empty((2, 3), dtype=dtype), make(dtype, (2 * WORLD, 3), 71, RANK)],
                  combine(op, [make(dtype, (2 * WORLD, 3), 71, q)[2 * RANK:2 * RANK + 2] for q in ranks]),
                  gloo=False)

    # all_to_all_single: equal splits, then rank r sending (r + 2q) % 3 rows (some none) to rank q.
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.uint8):
        ins = [make(dtype, (2 * WORLD, 3), 80, r) for r in ranks]
        check(f"all_to_all_single {dtype}",
              lambda g, xs: (dist.all_to_all_single(xs[0], xs[1], group=g), xs[0])[1],
              [torch.empty_like(ins[RANK]), ins[RANK]],
              torch.cat([ins[q][2 * RANK:2 * RANK + 2] for q in ranks]), gloo=gloo_has(dtype))
        count = [[(r + 2 * q) % 3 for q in ranks] for r in ranks]
        ins = [make(dtype, (sum(count[r]), 2), 81, r) for r in ranks]
        pieces = [list(torch.split(ins[r], count[r])) for r in ranks]
        out_rows = sum(count[q][RANK] for q in ranks)
        check(f"all_to_all_single with splits {count} {dtype}",
              lambda g, xs: (dist.all_to_all_single(xs[0], xs[1], [count[q][RANK] for q in ranks],
                                                    count[RANK], group=g), xs[0])[1],
              [torch.empty((out_rows, 2), dtype=dtype), ins[RANK]],
              torch.cat([pieces[q][RANK] for q in ranks]), gloo=gloo_has(dtype))

    # Work objects: async_op, wait(), is_completed(), the future's value; several in flight at once.
    x = make(torch.float32, shape, 90, RANK)
    work = dist.all_reduce(x, async_op=True)
    expect(isinstance(work, dist.Work), f"all_reduce(async_op=True) returned {type(work)}")
    expect(work.wait() is True, "Work.wait() did not return True")
    expect(work.is_completed(), "Work.is_completed() is False after wait()")
    expected = combine("SUM", [make(torch.float32, shape, 90, r) for r in ranks])
    expect(same(x, expected) is None, f"async all_reduce: {same(x, expected)}")
    x = make(torch.float32, shape, 91, RANK)
    value = dist.all_reduce(x, async_op=True).get_future().wait()
    expected = combine("SUM", [make(torch.float32, shape, 91, r) for r in ranks])
    expect(isinstance(value, list) and len(value) == 1, f"all_reduce's future gave {value!r}")
    expect(same(value[0], expected) is None and same(x, expected) is None,
           f"all_reduce's future: {same(value[0], expected)} / {same(x, expected)}")
    y = make(torch.int64, shape, 92, RANK)
    doubled = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait()
    expect(same(doubled, 2 * combine("SUM", [make(torch.int64, shape, 92, r) for r in ranks])) is None,
           "a callback chained on all_reduce's future")
    xs = [make(torch.float64, (7,), 93 + k, RANK) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in xs]
    b = make(torch.int32, shape, 97, RANK)
    works.append(dist.broadcast(b, 0, async_op=True))
    outs = [torch.empty(shape, dtype=torch.int32) for _ in ranks]
    works.append(dist.all_gather(outs, make(torch.int32, shape, 98, RANK), async_op=True))
    for w in reversed(works):
        w.wait()
    for k in range(4):
        why = same(xs[k], combine("SUM", [make(torch.float64, (7,), 93 + k, r) for r in ranks]))
        expect(why is None, f"async all_reduce {k} of 4 in flight: {why}")
    expect(same(b, make(torch.int32, shape, 97, 0)) is None, "async broadcast in flight with others")
    expect(same(outs, [make(torch.int32, shape, 98, r) for r in ranks]) is None, "async all_gather in flight")
    for w in (bp.allreduce([torch.ones(2)]), bp.broadcast([torch.ones(2)]),
              bp.allgather([[torch.empty(2) for _ in ranks]], [torch.ones(2)]), bp.barrier()):
        expect(isinstance(w, dist.Work), f"ProcessGroup call returned {type(w)}")
        w.wait()
        w.get_future().wait()

    dist.barrier()
    dist.barrier(group=gloo)
    print(f"rank {RANK}: {check.cases} collective cases agree with gloo / the expected values", flush=True)
    dist.destroy_process_group()


# --- subgroups -----------------------------------------------------------

def subgroup(default_backend="backplane"):
    init(default_backend)
    world_bp = dist.new_group(backend="backplane")
    sets = [[0, WORLD - 1], [1]]
    groups = [dist.new_group(s, backend="backplane") for s in sets]
    inherit = dist.new_group([0, WORLD - 1])
    if default_backend == "backplane" and RANK in (0, WORLD - 1):
        expect(dist.get_backend(inherit) == "backplane", "a new_group without backend= has the default's")
    check_group(world_bp, list(range(WORLD)), "the whole world")
    for members, g in zip(sets, groups):
        check_group(g, members, f"group {members}")
        x = torch.full((3,), float(RANK + 1))
        dist.all_reduce(x, group=world_bp)  # everyone is still in step
        expect(x.tolist() == [float(sum(range(1, WORLD + 1)))] * 3, f"world all_reduce after {members}: {x}")
    dist.destroy_process_group(groups[1])
    x = torch.full((2,), float(RANK))
    dist.all_reduce(x)
    expect(x.tolist() == [float(sum(range(WORLD)))] * 2, f"default group after destroying a subgroup: {x}")
    dist.destroy_process_group()


def check_group(g, members, name):
    if RANK not in members:
        expect(g is dist.GroupMember.NON_GROUP_MEMBER, f"{name}: a non-member got {g!r}")
        expect(dist.get_rank(g) == -1, f"{name}: get_rank for a non-member")
        x = torch.full((2,), 7.0)
        expect(dist.all_reduce(x, group=g) is None and x.tolist() == [7.0, 7.0],
               f"{name}: all_reduce on a non-member touched the tensor")
        return
    n, me = len(members), members.index(RANK)
    expect((dist.get_rank(g), dist.get_world_size(g)) == (me, n),
           f"{name}: rank/size {(dist.get_rank(g), dist.get_world_size(g))}, expected {(me, n)}")
    expect(dist.get_backend(g) == "backplane", f"{name}: backend {dist.get_backend(g)}")
    x = torch.full((3,), float(RANK + 1))
    dist.all_reduce(x, group=g)
    expect(x.tolist() == [float(sum(m + 1 for m in members))] * 3, f"{name}: all_reduce gave {x}")
    b = torch.full((2,), float(RANK))
    dist.broadcast(b, members[-1], group=g)
    expect(b.tolist() == [float(members[-1])] * 2, f"{name}: broadcast from global rank {members[-1]} gave {b}")
    outs = [torch.empty(2, dtype=torch.int64) for _ in members]
    dist.all_gather(outs, torch.tensor([RANK, 10 * RANK]), group=g)
    expect([o.tolist() for o in outs] == [[m, 10 * m] for m in members], f"{name}: all_gather gave {outs}")
    r = torch.tensor([float(RANK + 1)])
    dist.reduce(r, members[0], group=g)
    if RANK == members[0]:
        expect(r.item() == sum(m + 1 for m in members), f"{name}: reduce gave {r}")
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(RANK * 10 + k)) for k in range(n)], group=g)
    expect(out.tolist() == [float(sum(m * 10 + me for m in members))] * 2, f"{name}: reduce_scatter gave {out}")
    a2a = torch.empty(n)
    dist.all_to_all_single(a2a, torch.tensor([float(RANK * 100 + k) for k in range(n)]), group=g)
    expect(a2a.tolist() == [float(m * 100 + me) for m in members], f"{name}: all_to_all_single gave {a2a}")
    if n > 1 and me in (0, n - 1):
        peer = members[-1] if me == 0 else members[0]
        got = torch.empty(3)
        if me == 0:
            dist.send(torch.tensor([1.0, 2.0, float(RANK)]), peer, group=g)
            dist.recv(got, peer, group=g)
        else:
            dist.recv(got, peer, group=g)
            dist.send(torch.tensor([1.0, 2.0, float(RANK)]), peer, group=g)
        expect(got.tolist() == [1.0, 2.0, float(peer)], f"{name}: send/recv gave {got}")
    dist.barrier(group=g)


# --- point to point --------------------------------------------------------

def p2p():
    init("backplane")
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    # A ring of blocking send/recv (even ranks send first).
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.int8, torch.float64):
        out, got = make(dtype, (4, 3), 1, RANK), torch.empty((4, 3), dtype=dtype)
        if RANK % 2 == 0:
            dist.send(out, nxt)
            sender = dist.recv(got, prv)
        else:
            sender = dist.recv(got, prv)
            dist.send(out, nxt)
        expect(sender == prv, f"recv from {prv} says it came from {sender}")
        why = same(got, make(dtype, (4, 3), 1, prv))
        expect(why is None, f"ring send/recv {dtype} from {prv}: {why}")
    # Every rank isends to every other before posting any irecv, small and 4 MiB.
    for n in (17, 1 << 20):
        peers = [p for p in range(WORLD) if p != RANK]
        outs = {p: torch.arange(n, dtype=torch.float32) + 1000 * RANK + p for p in peers}
        ins = {p: torch.empty(n) for p in peers}
        sends = [dist.isend(outs[p], p) for p in peers]
        recvs = [dist.irecv(ins[p], p) for p in peers]
        for w in sends + recvs:
            expect(isinstance(w, dist.Work), f"isend/irecv returned {type(w)}")
            w.wait()
            expect(w.is_completed(), "isend/irecv Work not completed after wait()")
        for p in peers:
            expect(torch.equal(ins[p], torch.arange(n, dtype=torch.float32) + 1000 * p + RANK),
                   f"isend/irecv of {n} floats: from {p} got {ins[p][:8].tolist()}...")
    # Tags: two messages 0 -> 1, received in the other order.
    if RANK in (0, 1):
        if RANK == 0:
            works = [dist.isend(torch.full((5,), 1.0), 1, tag=11), dist.isend(torch.full((5,), 2.0), 1, tag=22)]
        else:
            a, b = torch.empty(5), torch.empty(5)
            works = [dist.irecv(b, 0, tag=22), dist.irecv(a, 0, tag=11)]
        for w in works:
            w.wait()
        if RANK == 1:
            expect(a.tolist() == [1.0] * 5 and b.tolist() == [2.0] * 5,
                   f"tag 11 received {a.tolist()}, tag 22 received {b.tolist()}")
    # batch_isend_irecv around the ring.
    out, got = torch.tensor([RANK, -RANK], dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)])
    for r in reqs:
        r.wait()
    expect(got.tolist() == [prv, -prv], f"batch_isend_irecv from {prv}: {got.tolist()}")
    dist.barrier()
    dist.destroy_process_group()


# --- DDP -------------------------------------------------------------------

def load_digits():
    path = os.environ.get("BACKPLANE_TEST_DATA")
    expect(path, "BACKPLANE_TEST_DATA is not set")
    with gzip.open(path, "rt") as f:
        rows = [[float(v) for v in line.split(",")] for line in f if line.strip()]
    data = torch.tensor(rows)
    return data[:, :64] / 16.0, data[:, 64].long()


def ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    init("backplane")
    bp = dist.distributed_c10d._get_default_group()
    gloo = dist.new_group(backend="gloo")
    x, y = load_digits()
    per_rank = len(x) // WORLD  # the same number of steps on every rank
    x, y = x[RANK::WORLD][:per_rank], y[RANK::WORLD][:per_rank]

    def flat(model):
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def train(group, hook=None, epochs=3, batch=32):
        torch.manual_seed(1234 + RANK)  # replicas differ until DDP broadcasts rank 0's
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        net = DDP(model, process_group=group)
        start = flat(model)
        everyone = [torch.empty_like(start) for _ in range(WORLD)]
        dist.all_gather(everyone, start, group=gloo)
        expect(all(torch.equal(e, everyone[0]) for e in everyone), "DDP did not start every replica from rank 0's")
        if hook is not None:
            net.register_comm_hook(group, hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        order = torch.Generator().manual_seed(99)
        for _ in range(epochs):
            perm = torch.randperm(per_rank, generator=order)
            for i in range(0, per_rank - batch + 1, batch):
                idx = perm[i:i + batch]
                loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        end = flat(model)
        dist.all_gather(everyone, end, group=gloo)
        for r in range(WORLD):
            expect(torch.equal(everyone[r], end), f"after training, rank {r}'s replica differs from rank {RANK}'s "
                   f"(max |diff| {float((everyone[r] - end).abs().max())})")
        return end, accuracy

    for name, hook, tol in [("DDP", None, (1e-5, 1e-6)),
                            ("DDP with allreduce_hook", default_hooks.allreduce_hook, (1e-5, 1e-6)),
                            ("DDP with fp16_compress_hook", default_hooks.fp16_compress_hook, (1e-3, 1e-4))]:
        ours, accuracy = train(bp, hook)
        theirs, gloo_accuracy = train(gloo, hook)
        expect(accuracy > 0.8, f"{name} on backplane: training accuracy {accuracy:.3f} (gloo: {gloo_accuracy:.3f})")
        diff = float((ours - theirs).abs().max())
        why = same(ours, theirs, *tol)
        expect(why is None, f"{name}: weights trained on backplane differ from gloo's by up to {diff:g}")
        print(f"rank {RANK}: {name}: accuracy {accuracy:.3f}, max |backplane - gloo| {diff:g}", flush=True)
    dist.destroy_process_group()


# --- initialisation --------------------------------------------------------

def sanity(label):
    x = torch.tensor([float(RANK + 1), 1.0])
    dist.all_reduce(x)
    expect(x.tolist() == [float(sum(range(1, WORLD + 1))), float(WORLD)], f"{label}: all_reduce gave {x}")
    outs = [torch.empty(1, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(outs, torch.tensor([RANK]))
    expect([o.item() for o in outs] == list(range(WORLD)), f"{label}: all_gather gave {outs}")
    g = dist.new_group(backend="backplane")
    y = torch.ones(1)
    dist.all_reduce(y, group=g)
    expect(y.item() == WORLD, f"{label}: all_reduce on a new_group gave {y}")
    dist.barrier()


def init_file(path):
    init("backplane", init_method="file://" + path, rank=RANK, world_size=WORLD)
    sanity("file:// init")
    dist.destroy_process_group()


def init_store(directory, tcp_port):
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), WORLD, RANK == 0, TIMEOUT)
    init("backplane", store=store, rank=RANK, world_size=WORLD)
    sanity("store=TCPStore")
    dist.destroy_process_group()
    # The same process again, with other stores: each destroy leaves nothing behind.
    init("backplane", store=dist.FileStore(os.path.join(directory, "filestore"), WORLD), rank=RANK, world_size=WORLD)
    sanity("store=FileStore, after destroy_process_group")
    dist.destroy_process_group()
    init("backplane", init_method=f"tcp://127.0.0.1:{tcp_port}", rank=RANK, world_size=WORLD)
    sanity("tcp:// init, after two destroy_process_group")
    dist.destroy_process_group()
    # Quick cycles, each destroyed right after a collective whose tensor Python has already dropped.
    for cycle in range(10):
        init("backplane", init_method="file://" + os.path.join(directory, f"cycle{cycle}"), rank=RANK,
             world_size=WORLD)
        dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()


# --- a remote backend serving torch's CPU tensors ---------------------------

def remote(config_dir):
    # Each rank's config maps torch's cpu to a `remote` backend on its own
    # `backplane serve`; the servers' cpu devices form the group. Set before
    # the package's default registry is made (at init_process_group).
    os.environ["BACKPLANE_CONFIG"] = os.path.join(config_dir, f"rank{RANK}.json")
    init("backplane")
    where = dist.group.WORLD.target("cpu")
    expect(where.startswith("remote:0"), f"torch's cpu tensors go to {where}, not the remote backend")
    x = torch.arange(6, dtype=torch.float32).view(2, 3) * (RANK + 1)
    dist.all_reduce(x)
    expect(x.flatten().tolist() == [float(i * sum(range(1, WORLD + 1))) for i in range(6)], f"all_reduce: {x}")
    y = torch.arange(6, dtype=torch.float32).view(2, 3) * (RANK + 1)
    dist.all_reduce(y.t(), op=dist.ReduceOp.MAX)  # not contiguous: copied, reduced, written back
    expect(y.flatten().tolist() == [float(i * WORLD) for i in range(6)], f"all_reduce(MAX) of a view: {y}")
    out = [torch.zeros(2, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(out, torch.full((2,), RANK, dtype=torch.int64))
    expect([o.tolist() for o in out] == [[r, r] for r in range(WORLD)], f"all_gather: {out}")
    b = torch.full((3,), float(RANK))
    dist.broadcast(b, WORLD - 1)
    expect(b.tolist() == [float(WORLD - 1)] * 3, f"broadcast: {b}")
    dist.destroy_process_group()


# --- failures --------------------------------------------------------------

def killed():
    init("backplane", timeout=KILL_TIMEOUT)
    x = torch.ones(4)
    dist.all_reduce(x)
    expect(x.tolist() == [float(WORLD)] * 4, f"all_reduce before the kill gave {x}")
    if RANK == 1:
        time.sleep(1.0)  # the others are inside the next all_reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    limit = KILL_TIMEOUT.total_seconds()
    for attempt in ("the collective in progress when rank 1 died", "the next collective"):
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError as e:
            message = str(e)
        else:
            raise Failure(f"{attempt}: all_reduce succeeded without rank 1")
        elapsed = time.monotonic() - start
        print(f"rank {RANK}: {attempt}: RuntimeError after {elapsed:.1f} s: {message}", flush=True)
        expect(elapsed < limit, f"{attempt}: the error took {elapsed:.1f} s (timeout {KILL_TIMEOUT})")
        expect("rank" in message.lower(), f"{attempt}: the error does not name the rank: {message}")
    dist.destroy_process_group()


def errors():
    init("backplane")
    usable_calls = [0]

    def usable(after):
        usable_calls[0] += 1
        x = torch.tensor([float(RANK + 1), float(usable_calls[0])])
        try:
            dist.all_reduce(x)
        except Exception as e:
            raise Failure(f"the group is unusable after {after} (a local error aborted it?): {e}") from e
        expect(x.tolist() == [float(sum(range(1, WORLD + 1))), float(usable_calls[0] * WORLD)],
               f"all_reduce after {after} gave {x.tolist()}")

    def rejected(what, call):
        try:
            result = call()
            if isinstance(result, dist.Work):
                result.wait()
        except RuntimeError as e:
            print(f"rank {RANK}: {what}: RuntimeError: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        except Exception as e:
            raise Failure(f"{what}: raised {type(e).__name__}, not RuntimeError: {e}") from e
        else:
            raise Failure(f"{what}: no error")
        usable(what)

    usable("nothing")
    rejected("all_reduce int16", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)))
    rejected("all_reduce int16, async_op", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16), async_op=True))
    rejected("all_reduce PREMUL_SUM", lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)))
    rejected("all_reduce BAND float32", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND))
    rejected("recv without a source", lambda: dist.recv(torch.empty(3)))
    rejected("irecv without a source", lambda: dist.irecv(torch.empty(3)))
    rejected("broadcast from rank world_size + 5", lambda: dist.broadcast(torch.ones(2), WORLD + 5))
    rejected("all_gather into world_size + 1 outputs",
             lambda: dist.all_gather([torch.empty(2) for _ in range(WORLD + 1)], torch.ones(2)))
    rejected("_all_gather_base into a wrong-sized output",
             lambda: dist._all_gather_base(torch.empty(2 * WORLD + 1), torch.ones(2)))
    rejected("reduce_scatter of world_size + 1 inputs",
             lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(WORLD + 1)]))
    dist.barrier()
    dist.destroy_process_group()


def exit_without_destroy():
    init("backplane")
    x = torch.ones(2)
    dist.all_reduce(x)
    expect(x.tolist() == [float(WORLD)] * 2, f"all_reduce gave {x}")
    peer = (RANK + 1) % WORLD
    got = torch.empty(2)
    works = [dist.isend(torch.ones(2), peer), dist.irecv(got, (RANK - 1) % WORLD)]
    for w in works:
        w.wait()
    dist.barrier()
    print(f"rank {RANK}: leaving at {time.time():.3f} without destroy_process_group", flush=True)


SCENARIOS = {
    "collectives": collectives,
    "subgroup": subgroup,
    "p2p": p2p,
    "ddp": ddp,
    "init_file": init_file,
    "init_store": init_store,
    "killed": killed,
    "errors": errors,
    "exit": exit_without_destroy,
    "remote": remote,
}


def main():
    faulthandler.register(signal.SIGUSR1)  # the test dumps a hung rank's stacks with it
    if len(sys.argv) < 2 or sys.argv[1] not in SCENARIOS:
        print(f"usage: torch_worker.py {{{'|'.join(SCENARIOS)}}} [args]", file=sys.stderr)
        sys.exit(64)
    name = sys.argv[1]
    try:
        SCENARIOS[name](*sys.argv[2:])
    except BaseException:
        traceback.print_exc()
        print(f"rank {RANK} FAILED in {name}", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not through exit handlers that could wait for the peers
    print(f"rank {RANK} ok", flush=True)


if __name__ == "__main__":
    main()

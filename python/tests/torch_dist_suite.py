# PyTorch's own distributed test-suite (torch.testing._internal.distributed.
# distributed_test, the tests behind upstream's test_distributed_spawn.py) on
# the "backplane" c10d backend: the tests that apply to a third-party CPU
# backend, each in WORLD_SIZE freshly spawned processes that join through a
# file:// init. Not part of ctest (several minutes); run by hand:
#
#   PYTHONPATH=build/python BACKPLANE_CONFIG=build/share/backplane/backends.json \
#       python3 python/tests/torch_dist_suite.py [--world-size 2|3] [--backend backplane|gloo]
#       [--extra] [--list] [-k SUBSTRING] [TEST_NAME ...]
#
# --backend gloo runs the same selection on gloo, for reference. Upstream gates
# some backend-neutral tests on hard-coded backend names (gloo, mpi, the GPU
# backends); UNLOCKED re-enables those, nothing else of the suite is changed.
# Debian's torch lacks the expecttest module that common_utils imports: a
# stand-in with what it uses (TestCase, ACCEPT) is installed when it is missing.
import argparse
import logging
import os
import sys
import types
import unittest


def parse(argv):
    parser = argparse.ArgumentParser(description="PyTorch's distributed tests on the backplane backend")
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    parser.add_argument("--backend", default=os.environ.get("BACKEND", "backplane"))
    parser.add_argument("--list", action="store_true", help="print the selected tests and exit")
    parser.add_argument("--extra", action="store_true", help="also the tests of EXTRA")
    parser.add_argument("-k", dest="substring", help="only the selected tests whose name contains this")
    parser.add_argument("tests", nargs="*", help="these tests instead of the selection")
    return parser.parse_args(argv)


# Spawned ranks run this file again as __mp_main__, with the argv left below:
# they take the world size and backend from the environment set here.
ARGS = parse(sys.argv[1:])
os.environ["BACKEND"] = ARGS.backend
os.environ["WORLD_SIZE"] = str(ARGS.world_size)
sys.argv = sys.argv[:1]  # common_utils parses sys.argv when imported

try:
    import expecttest  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("expecttest")
    stand_in.ACCEPT = False
    stand_in.TestCase = unittest.TestCase
    sys.modules["expecttest"] = stand_in

if ARGS.backend == "backplane":
    import backplane.torch  # noqa: F401  (registers the backend, here and in every spawned rank)

import torch.nn.parallel._replicated_tensor_ddp_utils as replicated  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# Upstream's TestDistBackend._run turns on DDP's ReplicatedTensor mode, whose
# import fails on Python 3.11 with torch 1.13 (torch.distributed._shard: a
# dataclass with a mutable default), on gloo as on backplane: DDP keeps its plain mode.
replicated._set_ddp_with_replicated_tensor = lambda value: None

# Before distributed_test is imported: its decorators read these sets.
DistTestCases.backend_feature["plugin"].add(ARGS.backend)
DistTestCases.backend_feature["ddp"].add(ARGS.backend)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

for _logger in ("torch.testing._internal.common_distributed", "torch.distributed.distributed_c10d"):
    logging.getLogger(_logger).setLevel(logging.WARNING)

OPS = ["sum", "product", "min", "max"]

SELECTED = [
    # groups and ranks
    "test_get_rank", "test_get_backend", "test_Backend_enum_class", "test_destroy_group",
    "test_get_rank_size_group", "test_destroy_full_group", "test_get_rank_size_full_group",
    "test_dump_DDP_relevant_env_vars",
    # collectives
    "test_barrier", "test_barrier_group", "test_barrier_full_group",
    "test_broadcast", "test_broadcast_group", "test_broadcast_full_group",
    *[f"test_reduce_{op}" for op in OPS], *[f"test_reduce_group_{op}" for op in OPS],
    *[f"test_reduce_full_group_{op}" for op in OPS], "test_reduce_sum_twice",
    *[f"test_all_reduce_{op}" for op in OPS], "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops", *[f"test_all_reduce_group_{op}" for op in OPS],
    *[f"test_all_reduce_full_group_{op}" for op in OPS], "test_all_reduce_coalesced_max_complex_unsupported",
    "test_scatter_checks", "test_scatter", "test_scatter_complex", "test_scatter_group", "test_scatter_full_group",
    "test_gather_checks", "test_gather", "test_gather_group", "test_gather_full_group",
    "test_all_gather", "test_all_gather_complex", "test_all_gather_group", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex", "test_all_gather_coalesced_group",
    "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_with_empty",
    # point to point
    "test_send_recv", "test_send_recv_with_tag", "test_isend", "test_irecv",
    # DDP on CPU (upstream's other DDP tests need GPUs)
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph", "test_static_graph_api_cpu",
    "test_ddp_logging_data_cpu",
]

# Backend-neutral tests that upstream skips unless BACKEND is one it names.
UNLOCKED = [
    *[f"test_all_reduce_coalesced_{op}" for op in OPS],  # gloo only
    *[f"test_all_reduce_coalesced_group_{op}" for op in OPS],
    *[f"test_all_reduce_coalesced_full_group_{op}" for op in OPS],
    *[f"test_all_to_all_single_{split}_split{kind}"  # mpi only
      for split in ("equal", "unequal") for kind in ("", "_complex", "_group", "_full_group")],
    "test_get_future",  # mpi, nccl, gloo
    "test_scatter_object_list",  # gloo
    "test_broadcast_object_list", "test_gather_object", "test_all_gather_object_default_pg",  # nccl, gloo
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",  # gloo
]

# Unlocked too, but run only with --extra: they also match the error's text
# against gloo's wording (" Timed out ", " closed " or " timeout ").
EXTRA = ["test_barrier_timeout_group", "test_barrier_timeout_full_group"]


def unlocked(name):
    original = getattr(DistributedTest._DistTestBase, name)

    def test(self):
        return original(self)

    test.__name__ = test.__qualname__ = name
    test.__doc__ = original.__doc__
    return test


class TestBackplaneDistributed(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


for _name in UNLOCKED + EXTRA:
    setattr(TestBackplaneDistributed, _name, unlocked(_name))


def main():
    names = ARGS.tests or SELECTED + UNLOCKED + (EXTRA if ARGS.extra else [])
    if ARGS.substring:
        names = [n for n in names if ARGS.substring in n]
    unknown = [n for n in names if not hasattr(TestBackplaneDistributed, n)]
    if unknown:
        sys.exit(f"no such test in torch's distributed_test: {', '.join(unknown)}")
    if ARGS.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestBackplaneDistributed(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())

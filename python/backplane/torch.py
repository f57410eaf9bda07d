"""PyTorch on backplane: ``import backplane.torch`` registers the c10d backend ``"backplane"``.

After the import, unchanged torch.distributed code runs its collectives on backplane's
communicators (shared memory between ranks on one host, Gloo between hosts, NCCL on CUDA
devices, a remote server's group), chosen by ``"torch_devices"`` in backends.json
(``BACKPLANE_CONFIG``, else the installed default)::

    import torch.distributed as dist
    import backplane.torch  # registers "backplane"
    dist.init_process_group("backplane")  # env://, file:// or store=, as with gloo

Rendezvous goes through the store torch hands the backend: no second port, no extra variables.
"""

import torch.distributed as _dist

from . import default_registry as _default_registry

try:
    from ._backplane_torch import ProcessGroupBackplane
except ImportError as _e:  # built only where libtorch's development files were found
    raise ImportError(
        "backplane.torch: the PyTorch bridge is not built in this installation (" + str(_e) + "); "
        "install libtorch-dev (Debian) and rebuild with -DBACKPLANE_WITH_TORCH=ON") from _e

BACKEND = "backplane"


def _create(store, rank, world_size, timeout):
    # torch passes a PrefixStore per group, the group's rank and size, and its timeout.
    return ProcessGroupBackplane(store, rank, world_size, timeout, _default_registry())


if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create)

__all__ = ["BACKEND", "ProcessGroupBackplane"]

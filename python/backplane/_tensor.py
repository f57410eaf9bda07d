"""The parts of backplane.Tensor written in Python: indexing, iteration, numpy(), __array__,
and the no_grad()/op_fallback_off() contexts. Speed-critical methods are in C++ (_backplane)."""

import functools

from . import _backplane
from ._backplane import Tensor, InvalidArgument

__all__ = ["no_grad", "op_fallback_off"]


class no_grad:
    """Turns autodiff recording off on this thread: as a context manager or a decorator.

    >>> with backplane.no_grad():
    ...     y = model(x)          # records nothing, y.requires_grad is False
    """

    def __init__(self):
        self._contexts = []

    def __enter__(self):
        ctx = _backplane._NoGradContext()
        ctx.__enter__()
        self._contexts.append(ctx)
        return None

    def __exit__(self, *exc):
        self._contexts.pop().__exit__(*exc)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper


class op_fallback_off:
    """Turns every backend's op_fallback off on this thread: as a context manager or a decorator.

    What a device lacks raises its typed error again (UnsupportedOp, CapabilityMissing), as with
    BACKPLANE_OP_FALLBACK=error; other threads keep their fallbacks. Nests. Enter and exit it on
    the same thread (a with block always does).

    >>> with backplane.op_fallback_off():
    ...     y = x + 1             # raises UnsupportedOp if x's device lacks add for its dtype
    """

    def __init__(self):
        self._contexts = []

    def __enter__(self):
        ctx = _backplane._OpFallbackOffContext()
        ctx.__enter__()
        self._contexts.append(ctx)
        return None

    def __exit__(self, *exc):
        self._contexts[-1].__exit__(*exc)  # raises, and keeps it, when exited on another thread
        self._contexts.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with op_fallback_off():
                return fn(*args, **kwargs)

        return wrapper


def _normalize_index(index, ndim):
    if not isinstance(index, tuple):
        index = (index,)
    expanded = []
    ellipsis_seen = False
    consumed = sum(1 for i in index if i is not None and i is not Ellipsis)
    for item in index:
        if item is Ellipsis:
            if ellipsis_seen:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ellipsis_seen = True
            expanded.extend([slice(None)] * (ndim - consumed))
        else:
            expanded.append(item)
    if consumed > ndim:
        raise IndexError(f"too many indices for a tensor of {ndim} dimensions: {consumed}")
    return expanded


def _is_int(item):
    return not isinstance(item, (slice, list, tuple)) and hasattr(item, "__index__") and not (
        isinstance(item, Tensor) and item.ndim != 0)


def _getitem(self, index):
    """Basic indexing: ints, slices (positive steps), None (a new axis), ``...``, and one
    integer sequence or i64 tensor per axis (index_select). Slices are views."""
    items = _normalize_index(index, self.ndim)
    out = self
    axis = 0
    for item in items:
        if item is None:
            continue
        extent = out.shape[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(extent)
            if step <= 0:
                raise IndexError("backplane tensors take slices with a positive step only")
            if (start, stop, step) != (0, extent, 1):
                out = out.slice(axis, start, max(start, stop), step)
        elif isinstance(item, (list, tuple)) or isinstance(item, Tensor) and item.ndim == 1:
            out = out.index_select(axis, item)
        elif _is_int(item):
            i = item.__index__()
            if i < -extent or i >= extent:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {extent}")
            if i < 0:
                i += extent
            out = out.slice(axis, i, i + 1)
        else:
            raise IndexError(f"unsupported index {item!r}: use ints, slices, None, ... or integer sequences")
        axis += 1
    # The result's dims in the order of the index: None adds one, an int removes its axis.
    shape = []
    axis = 0
    for item in items:
        if item is None:
            shape.append(1)
        elif _is_int(item):
            axis += 1
        else:
            shape.append(out.shape[axis])
            axis += 1
    shape.extend(out.shape[axis:])
    if tuple(shape) != out.shape:
        out = out.reshape(shape)
    return out


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    for i in range(self.shape[0]):
        yield self[i]


def _numpy(self):
    """A NumPy array sharing this tensor's memory where the device's memory is host-visible
    (the cpu backend), else a copy. Writes to a shared array are not recorded by autodiff,
    so a tensor that requires grad refuses: use t.detach().numpy()."""
    import numpy as np

    if self.requires_grad:
        raise InvalidArgument(
            "numpy() of a tensor that requires grad would bypass autodiff; use t.detach().numpy()")
    if _backplane.Capability.host_visible in self.device.capabilities and self.dtype != _backplane.DType.bf16:
        return np.asarray(memoryview(self))  # writable and shared (the buffer protocol)
    array = np.from_dlpack(self)  # a host copy for memory the host cannot address
    if self.dtype == _backplane.DType.bool_:
        array = array.view(np.bool_)  # DLPack 0.6 has no boolean code: it travels as uint8
    return array


def _array(self, dtype=None, copy=None):
    array = _numpy(self.detach() if self.requires_grad else self)
    if dtype is not None:
        array = array.astype(dtype, copy=False)
    return array


Tensor.__getitem__ = _getitem
Tensor.__iter__ = _iter
Tensor.numpy = _numpy
Tensor.__array__ = _array
Tensor.__array_priority__ = 1000

# DLPack both ways with NumPy and PyTorch: memory is shared (a write through
# one side is read through the other), lifetimes hold in both directions, the
# capsule protocol (renaming on consumption, versioned capsules, stream,
# dl_device and copy arguments) is followed.
import ctypes
import gc
import weakref

import numpy as np
import pytest

import backplane as bp

torch = pytest.importorskip("torch")

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def capsule_name(capsule):
    return _capsule_name(capsule).decode()


# ---- backplane -> NumPy / PyTorch ----------------------------------------------------------

def test_numpy_from_backplane_shares_memory():
    t = bp.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    t.copy_(bp.tensor([[5.0, 6.0], [7.0, 8.0]]))  # write through backplane
    assert a.tolist() == [[5.0, 6.0], [7.0, 8.0]]  # read through NumPy


def test_torch_from_backplane_shares_memory_both_ways():
    t = bp.arange(6).reshape(2, 3)
    x = torch.from_dlpack(t)
    assert x.dtype == torch.float32 and list(x.shape) == [2, 3]
    x[1, 2] = 42.0  # write through torch
    assert t.tolist()[1][2] == 42.0  # read through backplane
    t.copy_(bp.zeros([2, 3]))  # write through backplane
    assert x.sum().item() == 0.0  # read through torch


def test_views_keep_their_strides():
    t = bp.arange(12).reshape(3, 4).transpose(0, 1)
    x = torch.from_dlpack(t)
    assert x.tolist() == t.tolist() and x.stride() == (1, 4)
    assert np.from_dlpack(t).tolist() == t.tolist()


def test_export_outlives_the_backplane_tensor():
    t = bp.full([1000], 3.0)
    x = torch.from_dlpack(t)
    a = np.from_dlpack(t)
    del t
    gc.collect()
    junk = [bp.full([1000], 9.0) for _ in range(20)]  # would reuse freed memory
    assert x.sum().item() == 3000.0 and a.sum() == 3000.0
    del junk


def test_dtypes_travel():
    for dtype, tdtype in [(bp.f64, torch.float64), (bp.i32, torch.int32), (bp.i64, torch.int64),
                          (bp.u8, torch.uint8), (bp.i8, torch.int8), (bp.f16, torch.float16)]:
        t = bp.tensor(np.ones(3, dtype=np.float16)) if dtype == bp.f16 else bp.ones([3], dtype=dtype)
        x = torch.from_dlpack(t)
        assert x.dtype == tdtype and x.tolist() == [1, 1, 1]
        back = bp.from_dlpack(x)
        assert back.dtype == dtype
    flags = bp.tensor([True, False])
    assert torch.from_dlpack(flags).tolist() == [1, 0]  # DLPack 0.6 has no bool: uint8
    assert bp.from_dlpack(flags).dtype == bp.bool_  # backplane's own export comes back as bool


# ---- NumPy / PyTorch -> backplane ----------------------------------------------------------

def test_backplane_from_numpy_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = bp.from_dlpack(a)
    assert t.dtype == bp.f32 and t.shape == (2, 3)
    a[0, 0] = 42.0  # write through NumPy
    assert t.tolist()[0][0] == 42.0  # read through backplane
    t.copy_(bp.ones([2, 3]))  # write through backplane
    assert a.tolist() == [[1.0] * 3] * 2  # read through NumPy


def test_backplane_from_torch_shares_memory():
    x = torch.zeros(4, dtype=torch.float64)
    t = bp.from_dlpack(x)
    x[2] = 5.0
    assert t.tolist() == [0.0, 0.0, 5.0, 0.0]
    t.copy_(bp.full([4], 2.0, dtype=bp.f64))
    assert x.tolist() == [2.0] * 4
    strided = torch.arange(12.0).reshape(3, 4)[:, ::2]
    assert bp.from_dlpack(strided).tolist() == strided.tolist()


def test_import_keeps_the_producer_alive_until_the_last_view_goes():
    a = np.arange(8, dtype=np.float32)
    alive = weakref.ref(a)
    t = bp.from_dlpack(a)
    v = t.reshape(2, 4)  # a view shares the import
    del a
    gc.collect()
    assert alive() is not None  # held by the managed tensor backplane owns
    del t
    gc.collect()
    assert alive() is not None and v.sum().item() == 28.0
    del v
    gc.collect()
    assert alive() is None  # the producer's deleter ran (under the GIL)


def test_producer_released_inside_backward():
    # The imported tensor's last reference belongs to the autodiff graph, which
    # backward() frees with the GIL released: the deleter must take the GIL.
    a = np.ones(4, dtype=np.float32)
    alive = weakref.ref(a)
    w = bp.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    loss = (bp.from_dlpack(a) * w).sum()
    del a
    gc.collect()
    assert alive() is not None
    loss.backward()
    del loss
    gc.collect()
    assert alive() is None
    assert w.grad.tolist() == [1.0] * 4


def test_from_dlpack_of_a_backplane_tensor_shares_it():
    t = bp.zeros([3])
    u = bp.from_dlpack(t)
    u.copy_(bp.ones([3]))
    assert t.tolist() == [1.0, 1.0, 1.0]
    c = bp.from_dlpack(t, copy=True)
    c.copy_(bp.zeros([3]))
    assert t.tolist() == [1.0, 1.0, 1.0]


# ---- the capsule protocol ---------------------------------------------------------------------

def test_capsules_are_consumed_once():
    t = bp.arange(3)
    capsule = t.__dlpack__()
    assert capsule_name(capsule) == "dltensor"
    u = bp.from_dlpack(capsule)
    assert capsule_name(capsule) == "used_dltensor"
    assert u.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="already consumed"):
        bp.from_dlpack(capsule)
    # NumPy consumes our capsules the same way; an unconsumed one frees itself.
    capsule = bp.to_dlpack(t)
    del capsule
    gc.collect()
    x = torch.arange(3.0)
    assert bp.from_dlpack(torch.utils.dlpack.to_dlpack(x)).tolist() == [0.0, 1.0, 2.0]


def test_versioned_capsule_when_asked():
    t = bp.arange(4)
    capsule = t.__dlpack__(max_version=(1, 0))
    assert capsule_name(capsule) == "dltensor_versioned"
    u = bp.from_dlpack(capsule)
    assert capsule_name(capsule) == "used_dltensor_versioned"
    u.copy_(bp.zeros([4]))
    assert t.tolist() == [0.0] * 4  # shared
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"  # a 0.x consumer gets the legacy one


def test_stream_device_and_copy_arguments():
    t = bp.ones([2])
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=7)  # host memory has no streams
    assert capsule_name(t.__dlpack__(stream=-1)) == "dltensor"
    assert capsule_name(t.__dlpack__(dl_device=(1, 0))) == "dltensor"
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    copied = bp.from_dlpack(t.__dlpack__(copy=True))
    copied.copy_(bp.zeros([2]))
    assert t.tolist() == [1.0, 1.0]


class ProducerOf:
    """Anything with __dlpack__: forwards to a torch tensor and records the arguments."""

    def __init__(self, x, accepts_max_version):
        self.x, self.accepts_max_version, self.calls = x, accepts_max_version, []

    def __dlpack__(self, stream=None, **kwargs):
        self.calls.append(dict(stream=stream, **kwargs))
        if kwargs and not self.accepts_max_version:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.x.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def test_any_producer_and_version_negotiation():
    x = torch.arange(4.0)
    new = ProducerOf(x, accepts_max_version=True)
    assert bp.from_dlpack(new).tolist() == x.tolist()
    assert new.calls == [{"stream": None, "max_version": (1, 0)}]
    old = ProducerOf(x, accepts_max_version=False)
    t = bp.from_dlpack(old)
    assert [c.get("max_version") for c in old.calls] == [(1, 0), None]  # retried without it
    x[0] = 9.0
    assert t.tolist()[0] == 9.0
    with pytest.raises(bp.InvalidArgument, match="__dlpack__"):
        bp.from_dlpack(object())


# A foreign DLPack 1.0 producer written with ctypes: its deleter is a Python
# callback, so the test sees when (and that) backplane runs it.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                                     ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def versioned_capsule(values, flags, deleted):
    buf = (ctypes.c_float * len(values))(*values)
    shape = (ctypes.c_int64 * 1)(len(values))
    strides = (ctypes.c_int64 * 1)(1)
    managed = DLManagedTensorVersioned()
    keep = [buf, shape, strides, managed]

    @DELETER
    def deleter(_):
        deleted.append(True)
        keep.clear()

    keep.append(deleter)
    managed.major, managed.minor, managed.deleter, managed.flags = 1, 0, deleter, flags
    managed.dl_tensor = DLTensor(ctypes.cast(buf, ctypes.c_void_p), DLDevice(1, 0), 1, DLDataType(2, 32, 1),
                                 shape, strides, 0)
    return _capsule_new(ctypes.addressof(managed), b"dltensor_versioned", None), buf, keep


def test_foreign_versioned_capsule():
    deleted = []
    capsule, buf, keep = versioned_capsule([1.0, 2.0, 3.0], 0, deleted)
    t = bp.from_dlpack(capsule)
    assert t.tolist() == [1.0, 2.0, 3.0]
    buf[1] = 20.0  # shared
    assert t.tolist() == [1.0, 20.0, 3.0]
    assert deleted == []
    del t
    gc.collect()
    assert deleted == [True]
    # Read-only memory is copied, and the producer is released at once.
    deleted = []
    capsule, buf, keep = versioned_capsule([4.0, 5.0], 1, deleted)
    t = bp.from_dlpack(capsule)
    assert deleted == [True] and t.tolist() == [4.0, 5.0]
    t.copy_(bp.zeros([2]))
    assert list(buf) == [4.0, 5.0]

# Errors: backplane.Error with one subclass per Errc, carrying the C++ message
# and a .code; standard exceptions as second bases where one fits; no C++
# exception reaches Python as a crash or a bare RuntimeError.
import json

import pytest

import backplane as bp

CLASSES = {
    "InvalidArgument": bp.Errc.invalid_argument,
    "ConfigError": bp.Errc.config_error,
    "NotFound": bp.Errc.not_found,
    "PluginLoadFailed": bp.Errc.plugin_load_failed,
    "AbiMismatch": bp.Errc.abi_mismatch,
    "BackendUnavailable": bp.Errc.backend_unavailable,
    "CapabilityMissing": bp.Errc.capability_missing,
    "UnsupportedOp": bp.Errc.unsupported_op,
    "ShapeMismatch": bp.Errc.shape_mismatch,
    "DtypeMismatch": bp.Errc.dtype_mismatch,
    "DeviceMismatch": bp.Errc.device_mismatch,
    "OutOfMemory": bp.Errc.out_of_memory,
    "DeviceError": bp.Errc.device_error,
    "Timeout": bp.Errc.timeout,
    "CollectiveError": bp.Errc.collective_error,
    "IoError": bp.Errc.io_error,
    "InternalError": bp.Errc.internal,
}


def test_one_class_per_code():
    assert set(CLASSES.values()) == set(bp.Errc.__members__.values())
    for name in CLASSES:
        cls = getattr(bp, name)
        assert issubclass(cls, bp.Error) and issubclass(bp.Error, Exception)
        assert cls.__module__ == "backplane" and cls.__name__ == name
    assert issubclass(bp.InvalidArgument, ValueError)
    assert issubclass(bp.Timeout, TimeoutError)
    assert issubclass(bp.NotFound, LookupError)
    assert issubclass(bp.OutOfMemory, MemoryError)
    assert issubclass(bp.IoError, OSError)
    assert not issubclass(bp.Error, RuntimeError)


def check(info, cls, fragment):
    assert type(info.value) is cls
    assert info.value.code == CLASSES[cls.__name__]
    assert fragment in str(info.value)


def test_codes_and_messages(registry, tmp_path):
    with pytest.raises(bp.ConfigError) as info:
        bp.Registry.from_config(str(tmp_path / "missing.json"))
    check(info, bp.ConfigError, "missing.json")
    with pytest.raises(bp.NotFound) as info:
        registry.backend("nope")
    check(info, bp.NotFound, "nope")
    with pytest.raises(bp.ShapeMismatch) as info:
        bp.ones([2]) + bp.ones([3])
    check(info, bp.ShapeMismatch, "[2]")
    with pytest.raises(bp.DtypeMismatch) as info:
        bp.ones([2]) + bp.ones([2], dtype=bp.f64)
    check(info, bp.DtypeMismatch, "f64")
    with pytest.raises(bp.InvalidArgument) as info:
        bp.ones([2]).reshape(3)
    check(info, bp.InvalidArgument, "reshape")


def test_failed_backend(tmp_path):
    config = {"schema_version": 1, "plugin_dirs": [str(tmp_path)],
              "backends": [{"name": "ghost", "library": "no_such_plugin", "required": False}]}
    reg = bp.Registry.from_json(json.dumps(config), str(tmp_path))
    ghost = reg.backend("ghost")
    assert ghost.status == bp.BackendStatus.failed and not ghost.loaded
    assert ghost.error_code == bp.Errc.plugin_load_failed and "no_such_plugin" in ghost.error
    with pytest.raises(bp.BackendUnavailable) as info:
        ghost.device(0)
    check(info, bp.BackendUnavailable, "ghost")
    config["backends"][0]["required"] = True
    with pytest.raises(bp.BackendUnavailable):
        bp.Registry.from_json(json.dumps(config), str(tmp_path))


def test_timeout_is_typed():
    store = bp.Rendezvous.single_process(timeout=5).store()
    store.set("k", b"v")
    assert store.get("k") == b"v" and store.check(["k"]) and store.add("n", 2) == 2
    with pytest.raises(bp.Timeout) as info:
        store.get("never", timeout=0.2)
    check(info, bp.Timeout, "never")


def test_bad_arguments_are_typed():
    with pytest.raises(bp.InvalidArgument):
        bp.tensor([1.0], device="cpu:x")
    with pytest.raises(bp.InvalidArgument):
        bp.tensor([1.0], dtype="complex128")
    with pytest.raises(bp.NotFound):
        bp.tensor([1.0], device="gpu")
    with pytest.raises(bp.InvalidArgument):
        bp.Rendezvous(rank=3, world_size=2)
    with pytest.raises(TypeError):  # a wrong Python type stays a TypeError, as everywhere in Python
        bp.ones([2]).softmax("x")


def test_error_can_be_raised_and_caught_from_python():
    with pytest.raises(bp.Error):
        raise bp.CapabilityMissing("made in Python")


def test_other_extensions_keep_their_own_exception_types():
    # pybind11 shares exception translators between modules built with the same
    # version; backplane's must stay local, or importing backplane would turn
    # torch's RuntimeErrors into backplane errors.
    torch = pytest.importorskip("torch")
    import datetime
    import torch.distributed as dist

    from conftest import free_port

    with pytest.raises((RuntimeError, TimeoutError)) as info:  # torch's own: TimeoutError
        dist.TCPStore("127.0.0.1", free_port(), 1, False, timeout=datetime.timedelta(seconds=0.2))
    assert not isinstance(info.value, bp.Error), type(info.value).__mro__
    assert torch.ones(1).item() == 1.0

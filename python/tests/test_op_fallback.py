# Op placement from Python: a cpu backend narrowed to a few ops and f32
# ("small") falls back to a full cpu backend ("cpu"); ops it lacks run there
# while tensors keep "small"'s device. Backend.op_fallback, op_fallback_stats(),
# reset_op_fallback_stats(), Registry.set_op_fallback and op_fallback_off().
import json
import threading

import numpy as np
import pytest

import backplane as bp


@pytest.fixture
def placed(plugin_dir):
    """A fresh registry per test (set_op_fallback changes it): "small" runs fill, copy and matmul
    on f32 only and falls back to "cpu"."""
    config = {
        "schema_version": 1,
        "plugin_dirs": [plugin_dir],
        "default_backend": "small",
        "backends": [
            {"name": "cpu", "library": "backplane_cpu", "required": True, "options": {"threads": 1}},
            {"name": "small", "library": "backplane_cpu", "required": True,
             "options": {"threads": 1, "ops": ["fill", "copy", "matmul"], "dtypes": ["f32"]},
             "op_fallback": "host:cpu"},
        ],
    }
    return bp.Registry.from_json(json.dumps(config), plugin_dir)


@pytest.fixture
def small(placed):
    return placed.backend("small")


def stats_for(backend, op):
    return [s for s in backend.op_fallback_stats() if s.op == op]


def test_fallback_spelling(placed, small):
    assert small.op_fallback == "host:cpu"
    assert placed.backend("cpu").op_fallback == "error"
    dev = small.device(0)
    assert not dev.supports("add", "f32") and dev.supports("matmul", "f32")
    assert "i64" not in dev.capabilities


def test_ops_the_device_lacks_run_on_the_host(small):
    dev = small.device(0)
    small.reset_op_fallback_stats()
    t = bp.ones([2, 3], device=dev)
    assert t.device == dev and t.dtype == bp.f32
    s = t + t
    assert s.device == dev
    np.testing.assert_array_equal(s.numpy(), np.full((2, 3), 2.0, dtype=np.float32))
    r = (s - 3.0).relu()
    np.testing.assert_array_equal(r.numpy(), np.zeros((2, 3), dtype=np.float32))
    total = bp.sum(s)
    assert total.device == dev and total.item() == pytest.approx(12.0)
    assert (t @ bp.ones([3, 2], device=dev)).tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_a_dtype_the_device_lacks_is_held_on_the_host(small):
    dev = small.device(0)
    a = bp.tensor([1, 2, 3], device=dev, dtype=bp.int64)
    assert a.device == dev and a.dtype == bp.i64
    assert a.tolist() == [1, 2, 3]
    b = bp.tensor(np.arange(4, dtype=np.int64), device=dev)
    assert b.device == dev and b.dtype == bp.i64
    np.testing.assert_array_equal((b + 1).numpy(), np.arange(1, 5, dtype=np.int64))


def test_stats_count_what_fell_back(small):
    small.reset_op_fallback_stats()
    dev = small.device(0)
    t = bp.ones([4], device=dev)
    for _ in range(3):
        t = t + 1.0
    assert t.tolist() == [4.0] * 4
    adds = stats_for(small, "add")
    assert adds and all(s.dtype == "f32" for s in adds)
    assert sum(s.calls for s in adds) >= 3
    every = small.op_fallback_stats()
    assert all(isinstance(s, bp.OpFallbackStats) for s in every)
    assert [s.seconds for s in every] == sorted((s.seconds for s in every), reverse=True)
    for s in every:
        assert s.bytes_moved == s.bytes_to_host + s.bytes_from_host and s.seconds >= 0
    assert "add" in repr(adds[0])
    small.reset_op_fallback_stats()
    assert small.op_fallback_stats() == []


def test_op_fallback_off_brings_the_typed_error_back(small):
    dev = small.device(0)
    t = bp.ones([2], device=dev)
    with bp.op_fallback_off():
        with pytest.raises(bp.UnsupportedOp) as info:
            t + t
        assert info.value.code == bp.Errc.unsupported_op
        assert small.op_fallback == "host:cpu"  # the setting is unchanged, only this thread ignores it
    assert (t + t).tolist() == [2.0, 2.0]  # on again after the block


def test_op_fallback_off_nests_and_decorates(small):
    t = bp.ones([2], device=small.device(0))
    off = bp.op_fallback_off()
    with off:
        with off:
            with pytest.raises(bp.UnsupportedOp):
                t + t
        with pytest.raises(bp.UnsupportedOp):
            t + t
    assert (t + t).tolist() == [2.0, 2.0]

    @bp.op_fallback_off()
    def add(x):
        return x + x

    with pytest.raises(bp.UnsupportedOp):
        add(t)
    assert (t + t).tolist() == [2.0, 2.0]


def test_op_fallback_off_is_per_thread(small):
    t = bp.ones([2], device=small.device(0))
    results = []

    def other():
        results.append((t + t).tolist())

    with bp.op_fallback_off():
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        with pytest.raises(bp.UnsupportedOp):
            t + t
    assert results == [[2.0, 2.0]]


def test_op_fallback_off_exits_on_its_own_thread(small):
    t = bp.ones([2], device=small.device(0))
    off = bp.op_fallback_off()
    off.__enter__()
    errors = []

    def other():
        try:
            off.__exit__(None, None, None)
        except bp.InvalidArgument as e:
            errors.append(str(e))

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert errors and "thread" in errors[0]
    with pytest.raises(bp.UnsupportedOp):  # still off here
        t + t
    off.__exit__(None, None, None)
    assert (t + t).tolist() == [2.0, 2.0]


def test_set_op_fallback(placed, small):
    t = bp.ones([2], device=small.device(0))
    placed.set_op_fallback("small", "error")
    assert small.op_fallback == "error"
    with pytest.raises(bp.UnsupportedOp):
        t + t
    placed.set_op_fallback("small", "host:cpu")
    assert small.op_fallback == "host:cpu"
    assert (t + t).tolist() == [2.0, 2.0]
    placed.set_op_fallback("small", None)
    assert small.op_fallback == "error"
    with pytest.raises(bp.UnsupportedOp):
        t + t


def test_set_op_fallback_errors(placed, small):
    with pytest.raises(bp.ConfigError, match="nowhere"):
        placed.set_op_fallback("small", "host:nowhere")
    with pytest.raises(bp.ConfigError):
        placed.set_op_fallback("small", "host:small")  # itself
    with pytest.raises(bp.ConfigError):
        placed.set_op_fallback("cpu", "host:small")  # small falls back to cpu: no chains
    with pytest.raises(bp.NotFound):
        placed.set_op_fallback("nowhere", "error")
    with pytest.raises(bp.InvalidArgument, match="host:<backend>"):
        placed.set_op_fallback("small", "local")
    with pytest.raises(bp.InvalidArgument):
        placed.set_op_fallback("small", 3)
    assert small.op_fallback == "host:cpu"  # none of them changed it

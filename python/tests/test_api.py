# The Python API over the cpu backend: registry, capabilities, tensors from
# lists, buffers and arrays, every op and operator with broadcasting (checked
# against NumPy), indexing, autodiff, no_grad, nn and distributed parameters.
import array
import math

import numpy as np
import pytest

import backplane as bp


def close(t, expected, tol=1e-5):
    np.testing.assert_allclose(np.asarray(t.tolist(), dtype=np.float64), np.asarray(expected, dtype=np.float64),
                               rtol=tol, atol=tol)


# ---- registry and capabilities ---------------------------------------------------------

def test_registry_from_env_and_config(registry):
    assert "cpu" in [b.name for b in registry.backends]
    again = bp.Registry.from_config(str(registry.config_path))
    assert again.backend("cpu").loaded
    assert bp.Registry.default_config_path() == registry.config_path
    assert registry.default_backend.name == "cpu"


def test_backend_and_device(registry, cpu):
    backend = registry.backend("cpu")
    assert backend.status == bp.BackendStatus.loaded and backend.error == "" and backend.error_code is None
    assert backend.device_count == len(backend.devices) >= 1
    assert cpu.id == "cpu:0" and str(cpu) == "cpu:0" and cpu.index == 0
    assert cpu.backend.name == "cpu"
    assert cpu == backend.device(0) and hash(cpu) == hash(backend.device(0))
    assert cpu.supports("add", "f32") and cpu.supports(bp.Op.matmul, bp.f32)
    assert backend.collective_fallback == "error"
    cpu.synchronize()


def test_capabilities(cpu, registry):
    caps = cpu.capabilities
    assert bp.Capability.collective in caps and "collective" in caps and caps.has("host_visible")
    assert "f32" in caps and bp.Capability.f32 in list(caps)
    assert "collective" in caps.names() and len(caps) == len(caps.names())
    assert "collective" in str(caps)
    assert registry.backend("cpu").capabilities.has(bp.Capability.matmul)
    assert bp.capability_for(bp.f64) == bp.Capability.f64
    with pytest.raises(bp.InvalidArgument, match="unknown capability"):
        "bogus" in caps


def test_capability_missing_without_collective(nocoll_registry):
    plain = nocoll_registry.backend("plain").device(0)
    assert "collective" not in plain.capabilities
    w = bp.zeros([2], device=plain)
    with pytest.raises(bp.CapabilityMissing) as info:
        bp.set_distributed_params(w, bp.DistributedParamId(42))
    assert info.value.code == bp.Errc.capability_missing
    assert "collective" in str(info.value)
    assert not bp.is_distributed(w) and bp.distributed_params(w) is None
    # The 'local' fallback: unregistered, no error.
    lenient = nocoll_registry.backend("lenient").device(0)
    v = bp.zeros([2], device=lenient)
    assert bp.set_distributed_params(v, 7) is v
    assert not bp.is_distributed(v)


def test_distributed_params_on_a_collective_device(cpu):
    w = bp.zeros([3], device=cpu)
    assert bp.set_distributed_params(w, bp.DistributedParamId(42)) is w
    assert bp.is_distributed(w)
    assert bp.distributed_params(w).param_id == bp.DistributedParamId(42)
    assert bp.distributed_params(w).param_id.value == 42


# ---- making tensors -------------------------------------------------------------------

def test_tensor_from_lists_infers_dtype(cpu):
    t = bp.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=cpu)
    assert t.shape == (2, 3) and t.dtype == bp.f32 and t.device == cpu and t.ndim == 2 and t.numel() == 6
    assert bp.tensor([1, 2]).dtype == bp.i64
    assert bp.tensor([True, False]).dtype == bp.bool_
    assert bp.tensor([1, 2.5]).dtype == bp.f32
    assert bp.tensor(3.5).shape == () and bp.tensor(3.5).item() == 3.5
    assert bp.tensor([1, 2], dtype="f64").dtype == bp.f64
    assert bp.tensor([1.5, -2.5], dtype=bp.i32).tolist() == [1, -2]  # truncation toward zero
    assert bp.tensor([[1, 2], [3, 4]], device="cpu:0").tolist() == [[1, 2], [3, 4]]
    assert bp.tensor([]).shape == (0,)


def test_tensor_rejects_ragged_and_bad_values():
    with pytest.raises(bp.InvalidArgument, match="ragged"):
        bp.tensor([[1, 2], [3]])
    with pytest.raises(bp.InvalidArgument):
        bp.tensor(["a"])
    with pytest.raises(bp.InvalidArgument):
        bp.tensor([2 ** 70])


def test_tensor_from_buffers_and_arrays():
    assert bp.tensor(array.array("f", [1, 2, 3])).tolist() == [1.0, 2.0, 3.0]
    assert bp.tensor(array.array("i", [1, 2])).dtype == bp.i32
    assert bp.tensor(b"\x01\x02").tolist() == [1, 2]
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = bp.tensor(a)
    assert t.dtype == bp.f64 and t.shape == (3, 4) and t.tolist() == a.tolist()
    # Strided, non-contiguous views are copied element by element.
    assert bp.tensor(a[::2, ::-1]).tolist() == a[::2, ::-1].tolist()
    assert bp.tensor(a.T).tolist() == a.T.tolist()
    # tensor() copies: later writes to the source are not seen.
    a[0, 0] = 100
    assert t.tolist()[0][0] == 0
    assert bp.tensor(np.array([True, False])).dtype == bp.bool_
    assert bp.tensor(np.float16([1.5])).dtype == bp.f16 and bp.tensor(np.float16([1.5])).tolist() == [1.5]
    with pytest.raises(bp.DtypeMismatch):
        bp.tensor(np.array([1, 2], dtype=np.uint32))


def test_tensor_from_torch():
    torch = pytest.importorskip("torch")
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = bp.tensor(src)
    assert t.tolist() == src.tolist() and t.dtype == bp.f32
    src[0, 0] = 42  # a copy
    assert t.tolist()[0][0] == 0
    assert bp.tensor(src, dtype=bp.f64).dtype == bp.f64


def test_creation_functions(cpu):
    assert bp.zeros([2, 3]).tolist() == [[0.0] * 3] * 2
    assert bp.ones(2, dtype=bp.i64).tolist() == [1, 1]
    assert bp.full([2], 7.5).tolist() == [7.5, 7.5]
    assert bp.arange(4).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert bp.arange(1, 7, 2, dtype=bp.i64).tolist() == [1, 3, 5]
    assert bp.empty([3]).shape == (3,)
    a = bp.randn([100], seed=3)
    assert a.tolist() == bp.randn([100], seed=3).tolist()
    u = bp.rand_uniform([1000], seed=1, low=2.0, high=3.0).numpy()
    assert u.min() >= 2.0 and u.max() < 3.0


def test_reads():
    t = bp.tensor([[1, 2], [3, 4]], dtype=bp.i32)
    assert t.tolist() == [[1, 2], [3, 4]] and isinstance(t.tolist()[0][0], int)
    assert bp.tensor([True]).tolist() == [True] and bp.tensor([True]).item() is True
    assert float(bp.tensor([2.5])) == 2.5 and int(bp.tensor([3])) == 3
    assert len(t) == 2 and [row.tolist() for row in t] == [[1, 2], [3, 4]]
    with pytest.raises(bp.InvalidArgument):
        t.item()
    with pytest.raises(bp.InvalidArgument):
        bool(t)
    assert "dtype=i32" in repr(t) and "[[1, 2], [3, 4]]" in repr(t)


def test_numpy_shares_memory():
    t = bp.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = t.numpy()
    a[0, 0] = 9.0  # through NumPy ...
    assert t.tolist()[0][0] == 9.0  # ... seen by backplane
    t.copy_(bp.tensor([[5.0, 6.0], [7.0, 8.0]]))  # through backplane ...
    assert a.tolist() == [[5.0, 6.0], [7.0, 8.0]]  # ... seen by NumPy
    assert bp.tensor([True, False]).numpy().dtype == np.bool_
    assert np.asarray(bp.arange(3)).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(bp.InvalidArgument, match="detach"):
        bp.tensor([1.0], requires_grad=True).numpy()


# ---- ops ------------------------------------------------------------------------------

A = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], dtype=np.float32)
B = np.array([0.5, 2.0, -1.0], dtype=np.float32)


def test_binary_operators_broadcast_like_numpy():
    a, b = bp.tensor(A), bp.tensor(B)
    close(a + b, A + B)
    close(a - b, A - B)
    close(a * b, A * B)
    close(a / b, A / B)
    close(abs(a) ** b, np.abs(A) ** B)
    close(b + a, B + A)
    close(-a, -A)
    close(abs(a), np.abs(A))
    close(bp.maximum(a, b), np.maximum(A, B))
    close(bp.minimum(a, b), np.minimum(A, B))
    col = bp.tensor([[1.0], [2.0]])
    close(a * col, A * np.array([[1.0], [2.0]]))
    assert bp.broadcast_shapes([2, 1, 3], [4, 1]) == (2, 4, 3)
    with pytest.raises(bp.ShapeMismatch) as info:
        a + bp.tensor([1.0, 2.0])
    assert info.value.code == bp.Errc.shape_mismatch and isinstance(info.value, ValueError)


def test_scalars_and_arrays_as_operands():
    a = bp.tensor(A)
    close(a + 1, A + 1)
    close(2 * a, 2 * A)
    close(1 - a, 1 - A)
    close(1 / bp.tensor([2.0, 4.0]), [0.5, 0.25])
    close(2 ** bp.tensor([1.0, 3.0]), [2.0, 8.0])
    close(a + B, A + B)  # a NumPy operand becomes a tensor of a's dtype
    close(B + a, B + A)  # NumPy hands the op to the tensor (__array_ufunc__ = None)
    close(a + [1.0, 2.0, 3.0], A + np.array([1.0, 2.0, 3.0]))
    assert (bp.tensor([1, 2]) * 3).tolist() == [3, 6]
    with pytest.raises(bp.InvalidArgument):
        bp.tensor([1, 2]) * 2.5  # no implicit promotion: 2.5 is no i64


def test_comparisons_and_where():
    a, b = bp.tensor(A), bp.tensor(B)
    assert (a > b).dtype == bp.bool_
    assert (a > b).tolist() == (A > B).tolist()
    assert (a >= 1).tolist() == (A >= 1).tolist()
    assert (a < b).tolist() == (A < B).tolist()
    assert (a <= b).tolist() == (A <= B).tolist()
    assert (a == a).tolist() == [[True] * 3] * 2
    assert (a != b).tolist() == (A != B).tolist()
    close(bp.where(a > 0, a, bp.zeros([1])), np.where(A > 0, A, 0))
    assert hash(a) != hash(b)  # identity hashing while == is elementwise
    assert (a == None) is False and (a != None) is True  # noqa: E711


def test_unary_ops():
    x = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    t = bp.tensor(x)
    for name, ref in [("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("tanh", np.tanh), ("sin", np.sin),
                      ("cos", np.cos)]:
        close(getattr(bp, name)(t), ref(x))
        close(getattr(t, name)(), ref(x))
    close(t.sigmoid(), 1 / (1 + np.exp(-x)))
    close(bp.relu(bp.tensor(A)), np.maximum(A, 0))
    close(bp.tensor(A).clamp(-1, 2), np.clip(A, -1, 2))
    with pytest.raises(bp.InvalidArgument):
        t.clamp(2, 1)
    with pytest.raises(bp.DtypeMismatch):
        bp.exp(bp.tensor([1, 2]))


def test_reductions():
    a = bp.tensor(A)
    close(a.sum(), A.sum())
    close(a.sum(0), A.sum(0))
    close(a.sum(axis=-1, keepdim=True), A.sum(-1, keepdims=True))
    close(a.sum(axis=(0, 1)), A.sum())
    close(a.mean(1), A.mean(1))
    close(bp.max(a, 0), A.max(0))
    close(a.min(), A.min())
    assert a.argmax().item() == int(A.argmax())
    assert a.argmax(1).tolist() == A.argmax(1).tolist()
    assert a.argmin(0).dtype == bp.i64
    assert a.sum(keepdim=True).shape == (1, 1)
    with pytest.raises(bp.InvalidArgument):
        a.sum(2)


def test_matmul_and_softmax():
    a = bp.tensor(A)
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    close(a @ bp.tensor(w), A @ w)
    close(bp.matmul(a, w), A @ w)
    batch = np.ones((4, 2, 3), dtype=np.float32)
    close(bp.tensor(batch) @ bp.tensor(w), batch @ w)
    e = np.exp(A - A.max(1, keepdims=True))
    close(a.softmax(1), e / e.sum(1, keepdims=True))
    close(bp.log_softmax(a, -1), np.log(e / e.sum(1, keepdims=True)))
    with pytest.raises(bp.ShapeMismatch):
        a @ a


def test_shape_ops_and_indexing():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = bp.tensor(x)
    assert t.reshape(6, 4).shape == (6, 4) and t.reshape((4, -1)).shape == (4, 6)
    assert bp.reshape(t, [24]).tolist() == x.reshape(24).tolist()
    assert t.permute(2, 0, 1).tolist() == x.transpose(2, 0, 1).tolist()
    assert t.transpose(0, 2).tolist() == x.swapaxes(0, 2).tolist()
    assert t.T.tolist() == x.T.tolist()
    assert t.slice(2, 1, 3).tolist() == x[:, :, 1:3].tolist()
    assert t[1].tolist() == x[1].tolist()
    assert t[-1, 2].tolist() == x[-1, 2].tolist()
    assert t[:, 1:, ::2].tolist() == x[:, 1:, ::2].tolist()
    assert t[..., 3].tolist() == x[..., 3].tolist()
    assert t[None, 0].shape == x[None, 0].shape
    assert t[:, [2, 0]].tolist() == x[:, [2, 0]].tolist()
    assert t[0, 1, 2].item() == x[0, 1, 2]
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(IndexError):
        t[:, ::-1]
    assert bp.cat([t, t], axis=1).tolist() == np.concatenate([x, x], axis=1).tolist()
    idx = bp.tensor([2, 0])
    assert t.index_select(1, idx).tolist() == x[:, [2, 0]].tolist()
    g = bp.tensor([[0, 1], [1, 0]])
    m = bp.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert m.gather(1, g).tolist() == [[1.0, 2.0], [4.0, 3.0]]
    view = t.slice(0, 0, 1)
    assert view.is_contiguous() and not t.transpose(0, 1).is_contiguous()
    assert t.transpose(0, 1).contiguous().is_contiguous()


def test_casts_and_placement(cpu):
    t = bp.tensor([1.7, -1.7])
    assert t.astype(bp.i64).tolist() == [1, -1]
    assert bp.cast(t, "f64").dtype == bp.f64
    assert t.to(bp.f64).dtype == bp.f64 and t.to("f64").dtype == bp.f64
    assert t.to(cpu).device == cpu and t.to("cpu:0").device == cpu
    assert bp.to(t, cpu).tolist() == t.tolist()
    assert bp.dtype("float32") == bp.f32 and bp.dtype(np.float64) == bp.f64 and bp.dtype(np.dtype("int32")) == bp.i32
    assert bp.dtype(float) == bp.f64 and bp.dtype(bool) == bp.bool_


# ---- autodiff ---------------------------------------------------------------------------

def test_backward_and_grad():
    x = bp.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = bp.tensor([[1.0], [0.5], [-1.0]], requires_grad=True)
    assert x.requires_grad and x.grad is None
    y = (x.reshape(1, 3) @ w).sum() + (x * x).sum()
    assert y.requires_grad
    y.backward()
    close(x.grad, [1.0 + 2, 0.5 + 4, -1.0 + 6])
    close(w.grad, [[1.0], [2.0], [3.0]])
    # Gradients accumulate until cleared, as in PyTorch.
    (x * 3).sum().backward()
    close(x.grad, [6.0, 7.5, 8.0])
    x.grad = None
    assert x.grad is None
    with pytest.raises(bp.InvalidArgument):
        bp.tensor([1.0]).backward()  # nothing requires grad


def test_backward_with_gradient_and_retain_graph():
    x = bp.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y.backward(bp.tensor([1.0, 10.0]), retain_graph=True)
    close(x.grad, [2.0, 40.0])
    x.grad = None
    y.backward([1.0, 1.0])
    close(x.grad, [2.0, 4.0])
    with pytest.raises(bp.InvalidArgument):
        y.backward([1.0, 1.0])  # the graph was freed


def test_requires_grad_flags_and_detach():
    t = bp.tensor([1.0])
    assert t.requires_grad_() is t and t.requires_grad
    with pytest.raises(bp.InvalidArgument):
        t.requires_grad = False
    d = t.detach()
    assert not d.requires_grad and d.tolist() == t.tolist()
    with pytest.raises(bp.DtypeMismatch):
        bp.tensor([1, 2], requires_grad=True)
    z = bp.zeros([2], requires_grad=True)
    assert z.requires_grad


def test_no_grad_context_and_decorator():
    x = bp.tensor([1.0], requires_grad=True)
    assert bp.is_grad_enabled()
    with bp.no_grad():
        assert not bp.is_grad_enabled()
        assert not (x * 2).requires_grad
        with bp.no_grad():
            pass
        assert not bp.is_grad_enabled()
    assert bp.is_grad_enabled() and (x * 2).requires_grad

    @bp.no_grad()
    def f():
        return (x * 2).requires_grad

    assert f() is False and bp.is_grad_enabled()


# ---- nn ---------------------------------------------------------------------------------

def test_linear_cross_entropy_and_sgd():
    layer = bp.nn.Linear(4, 3, seed=1)
    assert layer.weight is layer.weight and layer.weight.shape == (4, 3) and layer.bias.shape == (3,)
    assert layer.parameters()[0] is layer.weight
    bound = 1 / math.sqrt(4)
    assert np.all(np.abs(layer.weight.detach().numpy()) <= bound)
    x = bp.tensor(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    y = bp.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    opt = bp.nn.SGD(layer.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = bp.nn.cross_entropy(layer(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert 0.0 <= bp.nn.accuracy(layer(x), y) <= 1.0
    with pytest.raises(bp.InvalidArgument):
        bp.nn.cross_entropy(layer(x), bp.tensor([5] * 8))  # a label outside [0, 3)


def test_sgd_and_adam_match_pytorch():
    torch = pytest.importorskip("torch")
    w0 = np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)
    for make_bp, make_torch in [
        (lambda p: bp.nn.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
         lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
        (lambda p: bp.nn.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ]:
        w = bp.tensor(w0, requires_grad=True)
        tw = torch.tensor(w0, requires_grad=True)
        opt, topt = make_bp([w]), make_torch([tw])
        for _ in range(5):
            opt.zero_grad()
            topt.zero_grad()
            ((w * w).sum() * 3).backward()
            ((tw * tw).sum() * 3).backward()
            opt.step()
            topt.step()
        close(w.detach(), tw.detach().numpy(), tol=1e-5)

# bp.save / bp.load against the safetensors format as published: files that
# bp.save writes are read back with json and NumPy alone (and with the
# safetensors package where it is installed), and a file written by hand with
# json and NumPy loads with bp.load.
import json
import os
import struct

import numpy as np
import pytest

import backplane as bp

# safetensors dtype -> NumPy dtype (little-endian); BF16 has no NumPy dtype.
NUMPY_OF = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "BOOL": "?", "F16": "<f2",
            "U8": "u1", "I8": "i1"}


def read_by_hand(path):
    """(header, buffer) of a safetensors file, parsed with struct and json only."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    return header, data[8 + n:], n


def write_by_hand(path, arrays, metadata=None):
    header, offset, chunks = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, array) in arrays.items():
        raw = np.ascontiguousarray(array).astype(NUMPY_OF[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def sample_tensors():
    rng = np.random.default_rng(3)
    return {
        "w": bp.tensor(rng.standard_normal((3, 4)).astype(np.float32)),
        "d": bp.tensor(rng.standard_normal(5)),
        "i": bp.tensor(np.arange(-3, 3, dtype=np.int32).reshape(2, 3)),
        "l": bp.tensor(np.array([2**40, -7], dtype=np.int64)),
        "mask": bp.tensor(np.array([[True, False], [False, True]])),
        "h": bp.tensor(np.array([0.5, -1.25, 1024.0], dtype=np.float16)),
        "b": bp.tensor(np.array([0, 255, 17], dtype=np.uint8)),
        "c": bp.tensor(np.array([-128, 127], dtype=np.int8)),
        "s": bp.tensor(np.float64(6.5)),
        "t": bp.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).transpose(0, 1),
    }


def test_save_reads_back_with_json_and_numpy(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "model.safetensors"
    bp.save(path, tensors, metadata={"format": "pt", "epoch": "3"})
    header, buffer, n = read_by_hand(path)
    assert (8 + n) % 8 == 0
    assert header.pop("__metadata__") == {"format": "pt", "epoch": "3"}
    assert list(header) == list(tensors)  # the dict's order
    covered = 0
    for name, t in tensors.items():
        entry = header[name]
        begin, end = entry["data_offsets"]
        assert begin == covered
        covered = end
        assert entry["shape"] == list(t.shape)
        raw = buffer[begin:end]
        array = np.frombuffer(raw, NUMPY_OF[entry["dtype"]]).reshape(entry["shape"])
        assert np.array_equal(array, t.numpy())
    assert covered == len(buffer)
    assert header["t"]["dtype"] == "F32" and header["t"]["shape"] == [3, 2]


def test_load_of_a_file_written_by_hand(tmp_path):
    arrays = {
        "a": ("F32", np.array([[1.5, -2.0], [0.25, 8.0]], dtype=np.float32)),
        "flags": ("BOOL", np.array([True, False, True])),
        "big": ("I64", np.array([-(2**62), 5], dtype=np.int64)),
        "empty": ("F64", np.zeros((0, 3))),
        "h": ("F16", np.array([65504.0, -0.0], dtype=np.float16)),
    }
    path = tmp_path / "hand.safetensors"
    write_by_hand(path, arrays, metadata={"source": "numpy"})
    loaded = bp.load(path)
    assert list(loaded) == list(arrays)
    for name, (dtype, array) in arrays.items():
        assert list(loaded[name].shape) == list(array.shape)
        assert np.array_equal(loaded[name].numpy(), array)
    tensors, metadata = bp.load_with_metadata(str(path), device="cpu")
    assert metadata == {"source": "numpy"}
    assert tensors["a"].device.id == "cpu:0"


def test_bf16_passes_through_unchanged(tmp_path):
    # NumPy has no bf16: its bytes are the high halves of f32 values, written by hand.
    bits = (np.array([1.0, -2.5, 3.0], dtype="<f4").view("<u4") >> 16).astype("<u2")
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    src = tmp_path / "bf16.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    loaded = bp.load(src)
    assert loaded["x"].dtype == bp.bf16 and list(loaded["x"].shape) == [3]
    out = tmp_path / "again.safetensors"
    bp.save(out, loaded)
    header, buffer, _ = read_by_hand(out)
    assert header == {"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}
    assert buffer == bits.tobytes()


def test_round_trip_and_save_takes_numpy_arrays(tmp_path):
    path = tmp_path / "rt.safetensors"
    bp.save(str(path), {"x": np.array([1, 2, 3], dtype=np.int32), "y": bp.tensor([True])})
    loaded = bp.load(path)
    assert loaded["x"].tolist() == [1, 2, 3] and loaded["x"].dtype == bp.int32
    assert loaded["y"].tolist() == [True]


def test_errors_name_the_file_and_the_problem(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(bp.Error) as info:
        bp.load(path)
    assert info.value.code == bp.Errc.invalid_argument
    assert str(path) in str(info.value) and "beyond the end of the file" in str(info.value)

    write_by_hand(path, {"a": ("U8", np.zeros(2, dtype=np.uint8))})
    raw = path.read_bytes().replace(b'"U8"', b'"U9"')
    path.write_bytes(raw)
    with pytest.raises(bp.Error, match='unknown dtype "U9"'):
        bp.load(path)

    with pytest.raises(bp.Error) as info:
        bp.load(tmp_path / "missing.safetensors")
    assert info.value.code == bp.Errc.io_error

    with pytest.raises(bp.Error, match="metadata is a dict of str to str"):
        bp.save(tmp_path / "m.safetensors", {"a": bp.tensor([1.0])}, metadata={"epoch": 3})
    with pytest.raises(bp.Error, match="appears twice|__metadata__"):
        bp.save(tmp_path / "m.safetensors", {"__metadata__": bp.tensor([1.0])})
    assert not os.path.exists(tmp_path / "m.safetensors")


def test_the_safetensors_package_reads_what_save_writes(tmp_path):
    numpy_api = pytest.importorskip("safetensors.numpy")
    tensors = sample_tensors()
    path = tmp_path / "pkg.safetensors"
    bp.save(path, tensors, metadata={"k": "v"})
    loaded = numpy_api.load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert np.array_equal(loaded[name], t.numpy())
    numpy_api.save_file({"z": np.arange(4, dtype=np.float32)}, str(path), metadata={"a": "b"})
    tensors, metadata = bp.load_with_metadata(path)
    assert tensors["z"].tolist() == [0.0, 1.0, 2.0, 3.0] and metadata == {"a": "b"}


def test_load_copies_so_rewriting_or_truncating_the_file_changes_nothing(tmp_path):
    path = tmp_path / "w.safetensors"
    bp.save(path, {"w": np.ones(1024, dtype=np.float32)})
    w = bp.load(path)["w"]
    # What `cp other.safetensors w.safetensors` does: the same file, truncated, rewritten.
    header, buffer, n = read_by_hand(path)
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.truncate()
        f.write(data[:8 + n] + np.full(1024, 2.0, dtype=np.float32).tobytes())
    assert w.numpy().tolist() == [1.0] * 1024
    os.truncate(path, 0)  # a view of a mapped page past the end would be SIGBUS
    assert w.numpy().tolist() == [1.0] * 1024


def test_load_with_mmap_views_the_file(tmp_path):
    path = tmp_path / "w.safetensors"
    bp.save(path, {"w": np.arange(1024, dtype=np.float32)})
    w = bp.load(path, mmap=True)["w"]
    tensors, metadata = bp.load_with_metadata(path, mmap=True)
    assert tensors["w"].numpy().tolist() == w.numpy().tolist() == list(range(1024))
    with open("/proc/self/maps") as maps:
        assert any(line.rstrip().endswith(str(path.resolve())) for line in maps)
    with pytest.raises(TypeError):
        bp.load(path, None, True)  # mmap is keyword-only

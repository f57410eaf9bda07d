# Text that is not UTF-8: bytes in a safetensors header, a config, a path or
# what a plugin reports never surface as UnicodeDecodeError. A file's bad byte
# is the documented error (InvalidArgument, ConfigError) naming the file and
# the byte's offset; messages show such bytes as \xNN; paths decode as
# os.fsdecode does, so os.fsencode gives the bytes back; a str that UTF-8
# cannot encode (a lone surrogate) is refused as InvalidArgument.
import json
import os
import struct

import pytest

import backplane as bp


def safetensors_file(path, name=b"w", meta=None):
    header = b'{"' + name + b'":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    if meta is not None:
        header += b',"__metadata__":{"k":"' + meta + b'"}'
    header += b"}"
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
    return path


def test_a_tensor_name_that_is_not_utf8_is_invalid_argument_naming_file_and_offset(tmp_path):
    path = safetensors_file(tmp_path / "name.safetensors", name=b"w\xff")
    for load in (bp.load, bp.load_with_metadata):
        with pytest.raises(bp.InvalidArgument) as info:
            load(str(path))
        message = str(info.value)
        assert info.value.code == bp.Errc.invalid_argument
        assert str(path) in message
        # 8 bytes of length, then {"w and the bad byte: offset 8 + 3.
        assert "not valid UTF-8: the byte 0xFF at offset 11 of the file (3 of the header)" in message
        assert isinstance(info.value, ValueError) and not isinstance(info.value, UnicodeError)


def test_metadata_that_is_not_utf8_is_invalid_argument(tmp_path):
    path = safetensors_file(tmp_path / "meta.safetensors", meta=b"v\xc3\x28")  # a broken 2-byte character
    with pytest.raises(bp.InvalidArgument) as info:
        bp.load_with_metadata(str(path))
    assert "the byte 0xC3 at offset" in str(info.value)
    # The good file next to it loads, name and metadata as str.
    good = safetensors_file(tmp_path / "good.safetensors", name="wé".encode(), meta="ünï".encode())
    tensors, meta = bp.load_with_metadata(str(good))
    assert list(tensors) == ["wé"] and meta == {"k": "ünï"}


def test_a_config_that_is_not_utf8_is_config_error_naming_file_line_and_column(tmp_path):
    path = tmp_path / "backends.json"
    path.write_bytes(b'{"schema_version": 1,\n "default_backend": "c\xffpu", "backends": []}')
    with pytest.raises(bp.ConfigError) as info:
        bp.Registry.from_config(str(path))
    message = str(info.value)
    assert info.value.code == bp.Errc.config_error
    assert str(path) in message
    assert "not UTF-8: the byte 0xFF at offset 44 (line 2, column 23)" in message
    # A key, through from_json's bytes.
    with pytest.raises(bp.ConfigError) as info:
        bp.Registry.from_json(b'{"schema_version": 1, "b\xe9ackends": []}', str(tmp_path), "latin1.json")
    assert "latin1.json: not UTF-8: the byte 0xE9 at offset 24 (line 1, column 25)" in str(info.value)


def test_a_path_that_is_not_utf8_shows_as_escapes_in_messages(tmp_path):
    missing = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.json")
    with pytest.raises(bp.ConfigError) as info:
        bp.Registry.from_config(missing)
    assert "caf\\xe9.json" in str(info.value)


def test_paths_round_trip_and_plugin_text_is_str(tmp_path, plugin_dir, monkeypatch):
    odd = os.fsencode(str(tmp_path)) + b"/plugins-\xff"
    os.symlink(os.path.abspath(plugin_dir), odd)
    monkeypatch.setenv("BACKPLANE_PLUGIN_PATH", os.fsdecode(odd))
    config = {"schema_version": 1, "backends": [
        {"name": "cpu", "library": "backplane_cpu", "required": True},
        {"name": "ghost", "library": "no_such_plugin", "required": False}]}
    reg = bp.Registry.from_json(json.dumps(config), str(tmp_path))
    cpu = reg.backend("cpu")
    assert cpu.loaded
    assert os.fsencode(cpu.library_path).startswith(odd + b"/")  # the bytes, back
    assert isinstance(cpu.device(0).name, str) and isinstance(repr(cpu), str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in cpu.device(0).attributes.items())
    ghost = reg.backend("ghost")
    assert not ghost.loaded and "no_such_plugin" in ghost.error
    assert "plugins-\\xff/libno_such_plugin.so" in ghost.error  # where it looked, the bad byte escaped
    assert "ghost" in repr(ghost)


def test_a_str_utf8_cannot_encode_is_invalid_argument(tmp_path):
    lone = os.fsdecode(b"w\xff")  # "w\udcff"
    with pytest.raises(bp.InvalidArgument) as info:
        bp.save(str(tmp_path / "x.safetensors"), {lone: [1.0]})
    assert "the tensor name 'w\\udcff' is not valid text: it holds a lone surrogate at index 1" in str(info.value)
    with pytest.raises(bp.InvalidArgument) as info:
        bp.save(str(tmp_path / "x.safetensors"), {"w": [1.0]}, metadata={"k": lone})
    assert "the metadata value" in str(info.value)
    assert not (tmp_path / "x.safetensors").exists()

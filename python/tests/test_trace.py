# Tracing from Python: bp.trace around a region, bp.trace_range spans, and
# BACKPLANE_TRACE for a whole process (docs/tracing.md).
import json
import os
import subprocess
import sys

import pytest

import backplane as bp


def spans(path):
    with open(path) as f:
        trace = json.load(f)
    return trace, [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_records_a_region_with_its_ranges(tmp_path):
    path = tmp_path / "region.json"
    x = bp.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert not bp.trace_active()
    with bp.trace(path):
        assert bp.trace_active()
        with bp.trace_range("forward"):
            y = bp.matmul(x, x)
        (y + 1).tolist()
    assert not bp.trace_active()
    (x * 2).tolist()  # after the block: not recorded
    trace, xs = spans(path)
    names = [e["name"] for e in xs]
    assert "forward" in names and "matmul" in names and "add" in names
    assert "mul" not in names
    forward = next(e for e in xs if e["name"] == "forward")
    matmul = next(e for e in xs if e["name"] == "matmul")
    assert forward["cat"] == "range"
    assert forward["ts"] <= matmul["ts"] and matmul["ts"] + matmul["dur"] <= forward["ts"] + forward["dur"] + 0.001
    assert matmul["args"]["shapes"] == [[2, 2], [2, 2], [2, 2]]
    assert matmul["args"]["dtype"] == "f32"
    assert trace["otherData"]["backplane_trace"]["ranks"][0]["complete"] is True


def test_one_trace_at_a_time_and_bad_paths_are_typed(tmp_path):
    with bp.trace(tmp_path / "a.json"):
        with pytest.raises(bp.InvalidArgument, match="already records into"):
            with bp.trace(tmp_path / "b.json"):
                pass
    with pytest.raises(bp.IoError, match="cannot create the trace part"):
        with bp.trace(tmp_path / "no" / "such" / "folder.json"):
            pass
    with pytest.raises(bp.InvalidArgument, match="max_events is 0"):
        with bp.trace(tmp_path / "c.json", max_events=0):
            pass


def test_backplane_trace_records_a_whole_process(tmp_path):
    path = tmp_path / "process.json"
    env = dict(os.environ, BACKPLANE_TRACE=str(path))
    code = "import backplane as bp; x = bp.tensor([1.0, 2.0]); print(bp.trace_active(), (x + x).tolist())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True [2.0, 4.0]"
    _, xs = spans(path)
    assert any(e["name"] == "add" and e["args"]["device"] == "cpu:0" for e in xs)
    # A malformed cap is an error when the first registry is made, naming the variable.
    env["BACKPLANE_TRACE_MAX_EVENTS"] = "lots"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "BACKPLANE_TRACE_MAX_EVENTS='lots'" in out.stderr

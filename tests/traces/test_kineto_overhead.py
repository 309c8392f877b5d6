"""The profiler's own cost per event, taken off a Kineto trace's charges (docs/traces.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import MappingProxyType

import pytest
from typer.testing import CliRunner

from ddlsim.cli import app
from ddlsim.errors import ConfigError
from ddlsim.traces.kineto import parse_kineto, read_kineto
from ddlsim.traces.kineto_labels import Label
from ddlsim.traces.kineto_overhead import ProfilerOverhead, category_of, load_overhead
from ddlsim.traces.replay import predict_measured

DATA = Path(__file__).parent / "data"
DP1, CONFIG = DATA / "gpt2_tiny_dp1.json.gz", DATA / "gpt2_tiny.yaml"
#: measured by benchmarks/kineto_overhead.py on the development machine (torch 2.14.1, CPU)
OVERHEAD = DATA / "kineto_overhead.json"


def _costs(cpu_op=1.0, python=0.5, c=0.25) -> ProfilerOverhead:
    """Round costs in microseconds, for closed forms."""
    return ProfilerOverhead(MappingProxyType({"cpu_op": cpu_op * 1e-6, "python_function":
                                              python * 1e-6, "c_function": c * 1e-6}))


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _tiny() -> dict:
    """Two outermost ops of a layer: an MLP GEMM (2 nested ATen ops, a built-in call) and a
    residual add 10 µs later (one Python call in the gap)."""
    return {"traceEvents": [
        _x("python_function", "nn.Module: Net_0", 0, 100),
        _x("python_function", "nn.Module: Block_0", 1, 60),
        _x("python_function", "nn.Module: MLP_0", 2, 30),
        _x("python_function", "<built-in method linear of type object>", 3, 20),
        _x("cpu_op", "aten::linear", 4, 20), _x("cpu_op", "aten::t", 5, 1),
        _x("cpu_op", "aten::addmm", 7, 15),
        _x("python_function", "model.py(12): forward", 30, 3),
        _x("cpu_op", "aten::add", 34, 2),
    ]}


def test_each_op_is_charged_less_the_events_that_started_in_it():
    m = parse_kineto(_tiny(), overhead=_costs())
    # linear: 20 µs less 3 cpu_op; add: 10 µs idle + 2 µs less 1 cpu_op and 1 Python call
    # (the step starts at its first op: the module events and the built-in call before it
    # are outside the step)
    assert m.seconds[Label("forward", "mlp", True)] == pytest.approx((20 - 3) * 1e-6)
    assert m.seconds[Label("forward", "elementwise", True)] == pytest.approx((12 - 1.5) * 1e-6)
    assert m.overhead_s == pytest.approx(4.5e-6) and m.overhead_events == 5
    assert m.step_s == pytest.approx(m.window_s - 4.5e-6) and m.window_s == pytest.approx(32e-6)
    assert m.compute_s == pytest.approx(m.step_s)


def test_a_charge_never_goes_below_zero():
    m = parse_kineto(_tiny(), overhead=_costs(cpu_op=30.0))
    assert m.seconds[Label("forward", "mlp", True)] == 0.0
    assert m.seconds[Label("forward", "elementwise", True)] == 0.0
    assert m.overhead_s == pytest.approx(m.window_s)


def test_without_costs_nothing_is_taken_off():
    m = parse_kineto(_tiny())
    assert m.overhead_s == 0.0 and m.overhead_events == 0 and m.step_s == m.window_s


def test_the_real_trace_loses_exactly_its_events_costs():
    overhead = load_overhead(OVERHEAD)
    m = read_kineto(DP1, overhead=overhead)
    events = json.loads(gzip.open(DP1, "rt").read())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"
           or str(e.get("name")).startswith("Optimizer.")]
    lo, hi = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    inside = [category_of(e) for e in events if e.get("ph") == "X" and lo <= e["ts"] <= hi]
    expected = sum(overhead.seconds_per_event[c] for c in inside if c is not None)
    assert m.overhead_s == pytest.approx(expected, rel=1e-9)
    assert m.overhead_events == sum(c is not None for c in inside)
    assert m.compute_s + m.overhead_s == pytest.approx(m.window_s, rel=1e-9)
    plain = read_kineto(DP1)
    assert all(m.seconds[k] <= v for k, v in plain.seconds.items())


def test_the_re_predicted_step_is_the_step_without_the_profiler():
    m = read_kineto(DP1, overhead=load_overhead(OVERHEAD))
    r = predict_measured(CONFIG, m, ["parallel.data_parallel_size=2", "train.global_batch_size=8"])
    assert r.profiled.iteration_time_s == pytest.approx(m.step_s, rel=1e-9)
    assert abs(r.profiled_error) < 1e-9
    plain = predict_measured(CONFIG, read_kineto(DP1))
    assert plain.profiled.iteration_time_s - r.profiled.iteration_time_s == \
        pytest.approx(m.overhead_s, rel=1e-6)


@pytest.mark.parametrize("doc, match", [
    ("{", "cannot be read as JSON"),
    ({"seconds_per_event": {"cpu_op": 1e-6}}, "expected a cost for each of"),
    ({"seconds_per_event": {"cpu_op": -1e-6, "python_function": 0, "c_function": 0}},
     "seconds_per_event.cpu_op = -1e-06"),
    ({"seconds_per_event": {"cpu_op": True, "python_function": 0, "c_function": 0}},
     "seconds_per_event.cpu_op = True"),
])
def test_bad_overhead_files_are_refused(tmp_path, doc, match):
    path = tmp_path / "o.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ConfigError, match=match):
        load_overhead(path)


def test_costs_measured_with_other_settings_are_refused():
    doc = _tiny()
    doc["traceEvents"][4]["args"] = {"Input Dims": [[4, 8], [8, 8]]}
    with pytest.raises(ConfigError, match="record_shapes=False.*record_shapes=True"):
        parse_kineto(doc, overhead=_costs())
    doc["traceEvents"].append(_x("kernel", "sgemm", 50, 5))
    with pytest.raises(ConfigError, match="CPU-only traces"):
        parse_kineto(doc, overhead=_costs())


def test_cli_option_reports_what_was_taken_off(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["traces", "kineto", str(CONFIG), str(DP1),
                            "--profiler-overhead", str(OVERHEAD)])
    assert r.exit_code == 0, r.output
    assert "profiler overhead" in r.output and "5266 events" in r.output
    r = runner.invoke(app, ["traces", "kineto", str(CONFIG), str(DP1),
                            "--profiler-overhead", str(tmp_path / "none.json")])
    assert r.exit_code == 2 and "error:" in r.output and "cannot be read" in r.output
    assert "Traceback" not in r.output

"""A result's FLOP/s per device is one name in one unit (SI) everywhere, and a result without
a memory figure (a trace read from files) still saves, loads, shows and compares."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app

WIKI = "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml"
RS = "examples/wiki-gpt2-9ranks-reduce_scatter.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def result():
    return ddlsim.predict(ddlsim.load_config(WIKI))


def test_flops_per_device_is_si_in_every_output(result):
    want = result.hardware_flops / result.iteration_time_s / result.world_size
    assert result.flops_per_device == want
    assert result.to_dict()["flops_per_device"] == want
    assert result.to_row()["flops_per_device"] == want
    assert "tflops_per_device" not in result.to_dict()
    assert "tflops_per_device" not in result.to_row()
    from ddlsim.compare import comparison_metrics
    got = {name: values for name, _, values in comparison_metrics([result])}
    assert got["flops_per_device"] == [want]


def test_a_file_saved_with_tflops_per_device_still_reads(result):
    d = result.to_dict()
    del d["flops_per_device"], d["hardware_flops"]
    d["tflops_per_device"] = result.flops_per_device / 1e12
    back = ddlsim.Result.from_dict(d)
    assert back.flops_per_device == pytest.approx(result.flops_per_device, rel=1e-12)


def test_a_result_without_memory_saves_loads_and_shows(result):
    r = replace(result, memory=None)
    d = r.to_dict()
    assert d["memory_per_device_bytes"] is None and d["fits"] is None
    back = ddlsim.Result.from_dict(json.loads(json.dumps(d)))
    assert back.memory is None and back.to_dict() == d
    assert r.to_row()["memory_total_bytes"] is None
    assert "memory unknown" in repr(r) and "unknown" in r._repr_html_()
    assert r.to_frame().shape[0] == 1


def test_compare_takes_a_saved_result_without_memory(result, tmp_path):
    path = tmp_path / "nomem.json"
    path.write_text(json.dumps(replace(result, memory=None).to_dict()))
    out = runner.invoke(app, ["compare", str(path), RS, "-f", "json"])
    assert out.exit_code == 0, out.output
    metrics = {m["metric"] for m in json.loads(out.stdout)["metrics"]}
    assert "flops_per_device" in metrics and "memory_total_bytes" not in metrics

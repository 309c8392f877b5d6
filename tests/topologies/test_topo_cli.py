"""``ddlsim topology show``: table and JSON output, YAML specs, errors as one paragraph."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ddlsim.topologies.cli import app

from topo_helpers import make_spec

runner = CliRunner()


def _show(*args: str):
    return runner.invoke(app, ["show", *args])


def test_show_preset_as_table():
    result = _show("cpu-10gbe")
    assert result.exit_code == 0, result.output
    assert "topology cpu-10gbe" in result.output
    assert "bisection" in result.output and "2.50 GB/s" in result.output


def test_show_preset_as_json_with_nodes_override():
    result = _show("dgx-a100", "--nodes", "4", "--format", "json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["devices"] == 32 and info["fabric"]["topology"] == "fat_tree"


@pytest.mark.parametrize("content", [
    make_spec(network={"topology": "torus", "torus_dims": [2, 2]}),            # topology spec
    {"system": {"preset": "cpu-10gbe", "nodes": 4}, "model": "ignored"},         # run config
    {"preset": "dgx-h100", "network": {"topology": "rail_optimized"}},         # system section
])
def test_show_yaml_file(tmp_path, content):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(content))
    result = _show(str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["devices"] > 0


def test_show_draws(tmp_path):
    out = tmp_path / "t.png"
    result = _show("cpu-10gbe", "--draw", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["nope"], "system preset 'nope' does not exist"),
    (["missing.yaml"], "topology spec file 'missing.yaml' does not exist"),
    (["cpu-10gbe", "--nodes", "0"], "system.nodes: Input should be greater than 0"),
    (["dgx-a100", "--nodes", "64", "--draw", "x.png"], "draws at most 300"),
])
def test_errors_are_one_paragraph_and_exit_2(args, message):
    result = _show(*args)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert text.startswith("error: ") and message in text
    assert "Traceback" not in result.output


def test_bad_yaml_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: [1, 2\n")
    result = _show(str(path))
    assert result.exit_code == 2 and "not valid YAML" in result.output

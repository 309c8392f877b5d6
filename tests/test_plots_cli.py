"""The CLI draws the pictures: ``predict --timeline``/``--plot`` and ``compare --plot`` write
PNG files (the options are wired in ddlsim/cli.py; the drawing is tested in test_plots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddlsim.cli import app

ROOT = Path(__file__).resolve().parents[1]
WIKI = str(ROOT / "examples" / "wiki-gpt2-9ranks-reduce_broadcast.yaml")
SCATTER = str(ROOT / "examples" / "wiki-gpt2-9ranks-reduce_scatter.yaml")
PNG = b"\x89PNG\r\n\x1a\n"


def _ok(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_predict_timeline(engine, tmp_path):
    out = tmp_path / "t.png"
    _ok("predict", WIKI, "--engine", engine, "--timeline", str(out))
    assert out.read_bytes().startswith(PNG)


def test_predict_plot(tmp_path):
    out = tmp_path / "b.png"
    _ok("predict", WIKI, "--plot", str(out))
    assert out.read_bytes().startswith(PNG)


def test_compare_plot(tmp_path):
    out = tmp_path / "c.png"
    _ok("compare", WIKI, SCATTER, "--plot", str(out))
    assert out.read_bytes().startswith(PNG)


def test_timeline_onto_an_existing_file_needs_force(tmp_path):
    out = tmp_path / "t.png"
    out.write_bytes(b"keep")
    res = CliRunner().invoke(app, ["predict", WIKI, "--timeline", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output
    assert out.read_bytes() == b"keep"
    _ok("predict", WIKI, "--timeline", str(out), "--force")
    assert out.read_bytes().startswith(PNG)

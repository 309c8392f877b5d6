"""Outputs never lose the user's data: ``-o``, ``--trace``, ``--draw``, ``--plot`` and the
calibration files all go through ``ddlsim.textio.write_output``; JSON and CSV results
describe themselves."""

from __future__ import annotations

import io
import json
import os
import stat

import pandas as pd
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app

runner = CliRunner()
WIKI = "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml"


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _ok(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def test_output_onto_a_symlink_keeps_the_link(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = runner.invoke(app, ["predict", WIKI, "-f", "json", "-o", str(link)])
    assert r.exit_code == 2 and "already exists" in " ".join(r.stderr.split()) and target.read_text() == "old"
    _ok(["predict", WIKI, "-f", "json", "-o", str(link), "--force"])
    assert link.is_symlink() and json.loads(target.read_text())["world_size"] == 9


def test_output_dash_and_devices_are_written_through(tmp_path):
    r = _ok(["predict", WIKI, "-f", "json", "-o", "-"])
    assert json.loads(r.stdout)["engine"] == "analytical"
    _ok(["predict", WIKI, "-o", "/dev/null"])                # no --force needed
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_new_files_get_the_umask(tmp_path, umask_022):
    out = tmp_path / "r.csv"
    _ok(["predict", WIKI, "-f", "csv", "-o", str(out)])
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_table_to_a_file_is_plain_text(tmp_path):
    out = tmp_path / "r.txt"
    _ok(["predict", WIKI, "-o", str(out)])
    text = out.read_text()
    ms = ddlsim.predict(ddlsim.load_config(WIKI)).iteration_time_s * 1e3
    assert "iteration time" in text and f"{ms:.0f} ms" in text and "\x1b[" not in text


def test_trace_is_written_through_a_symlink(tmp_path):
    target = tmp_path / "t.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    _ok(["predict", WIKI, "--engine", "des", "--trace", str(link)])
    assert link.is_symlink() and "traceEvents" in json.loads(target.read_text())


def test_json_describes_the_run():
    d = json.loads(_ok(["predict", WIKI, "-f", "json", "--set",
                        "train.global_batch_size=72"]).stdout)
    assert d["config"]["train"]["global_batch_size"] == 72
    assert d["config"]["system"]["name"] == "cpu-10gbe"       # the preset, resolved
    assert d["ddlsim_version"] == ddlsim.__version__ and d["fits"] is True
    assert d["parameter_count"] == 124_439_808
    assert d["settings"]["engine"] == "analytical"
    both = json.loads(_ok(["predict", WIKI, "-f", "json", "--engine", "both"]).stdout)
    assert set(both) == {"analytical", "des", "difference"}
    assert both["des"]["settings"]["des_spans"] in ("all", "representative")
    assert both["des"]["links"] and both["analytical"]["fits"] is True


def test_csv_is_one_row_per_result_with_the_json_numbers():
    r = _ok(["predict", WIKI, "-f", "csv", "--engine", "both"])
    frame = pd.read_csv(io.StringIO(r.stdout))
    both = json.loads(_ok(["predict", WIKI, "-f", "json", "--engine", "both"]).stdout)
    assert list(frame["engine"]) == ["analytical", "des"]
    for i, e in enumerate(("analytical", "des")):
        assert frame["iteration_time_s"][i] == both[e]["iteration_time_s"]     # full precision
        assert frame["exposed_comm_dp_s"][i] == both[e]["breakdown"]["exposed_comm_s"]["dp"]
        assert frame["memory_total_bytes"][i] == both[e]["memory_per_device_bytes"]["total"]


def test_topology_draw_needs_force_and_follows_links(tmp_path):
    target = tmp_path / "t.png"
    target.write_bytes(b"mine")
    link = tmp_path / "l.png"
    link.symlink_to(target)
    r = runner.invoke(app, ["topology", "show", "cpu-10gbe", "--draw", str(link)])
    assert r.exit_code == 2 and "already exists" in " ".join(r.stderr.split()) and target.read_bytes() == b"mine"
    _ok(["topology", "show", "cpu-10gbe", "--draw", str(link), "--force"])
    assert link.is_symlink() and target.read_bytes()[:4] == b"\x89PNG"
    r = runner.invoke(app, ["topology", "show", "cpu-10gbe", "--draw", str(tmp_path / "t.xyz")])
    assert r.exit_code == 2 and "cannot write 'xyz' files" in " ".join(r.stderr.split())


def test_calibration_outputs_use_the_umask_and_refuse_overwrites(tmp_path, umask_022):
    from ddlsim.calibration.outputs import write_csv, write_yaml
    from ddlsim.calibration.schema import CalibrationError

    out = tmp_path / "p.yaml"
    write_yaml(out, {"a": 1})
    assert stat.S_IMODE(out.stat().st_mode) == 0o644         # mkstemp alone gave 0600
    with pytest.raises(CalibrationError, match="already exists"):
        write_yaml(out, {"a": 2})
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "data.csv")
    write_csv(link, pd.DataFrame({"x": [1.5]}))
    assert link.is_symlink() and (tmp_path / "data.csv").read_text() == "x\n1.5\n"


def test_output_into_a_fifo_is_written_through(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    _ok(["predict", WIKI, "-f", "json", "-o", str(fifo)])       # exists, yet no --force
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)                 # still a FIFO
    assert json.loads(got[0])["engine"] == "analytical"

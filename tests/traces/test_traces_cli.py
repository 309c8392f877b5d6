"""``ddlsim traces``: reports, JSON, and one-paragraph errors with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ddlsim.cli import app

DATA = Path(__file__).parent / "data"
CONFIG, DP1 = str(DATA / "gpt2_tiny.yaml"), str(DATA / "gpt2_tiny_dp1.json.gz")
runner = CliRunner()


def test_kineto_table_and_json(tmp_path):
    r = runner.invoke(app, ["traces", "kineto", CONFIG, DP1, "--set",
                            "parallel.data_parallel_size=2", "--set", "train.global_batch_size=8"])
    assert r.exit_code == 0, r.output
    assert "+0.00 % from the measured step" in r.output and "target plan" in r.output
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["traces", "kineto", CONFIG, DP1, "-f", "json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert abs(doc["profiled_error"]) < 0.05
    assert {o["op"] for o in doc["ops"]} >= {"fwd.attn", "bwd.mlp", "optimizer"}
    r = runner.invoke(app, ["traces", "kineto", CONFIG, DP1, "-f", "json", "-o", str(out)])
    assert r.exit_code == 2 and "--force" in r.output


def test_kineto_errors_are_one_paragraph(tmp_path):
    cases = [
        (["traces", "kineto", CONFIG, str(tmp_path / "none.json")], "cannot be read"),
        (["traces", "kineto", CONFIG, DP1, "--engine", "fast"], "--engine 'fast'"),
        (["traces", "kineto", CONFIG, DP1, "--layer-module", "("], "not a regular expression"),
        (["traces", "kineto", CONFIG, DP1, "--layer-module", "nothing"], "no transformer layer"),
        (["traces", "kineto", CONFIG, DP1, "-o", CONFIG, "--force"], "never writes over"),
    ]
    for args, match in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output and match in r.output.replace("\n", " "), (args, r.output)
        assert "Traceback" not in r.output


def test_chakra_export_then_predict(tmp_path):
    import pytest
    pytest.importorskip("google.protobuf")
    sets = ["--set", "parallel.data_parallel_size=2", "--set", "train.global_batch_size=8"]
    r = runner.invoke(app, ["traces", "export-chakra", CONFIG, "--out", str(tmp_path), *sets])
    assert r.exit_code == 0, r.output
    assert "wrote 2 rank traces" in r.output
    r = runner.invoke(app, ["traces", "predict-chakra", str(tmp_path), "--system", CONFIG,
                            "-f", "json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)["iteration_time_s"]
    want = runner.invoke(app, ["predict", CONFIG, *sets, "-f", "json"])
    assert got == pytest.approx(json.loads(want.output)["iteration_time_s"], rel=1e-9)
    r = runner.invoke(app, ["traces", "export-chakra", CONFIG, "--out", str(tmp_path), *sets])
    assert r.exit_code == 2 and "force" in r.output
    r = runner.invoke(app, ["traces", "predict-chakra", str(tmp_path), "--system", "cpu-10gbe",
                            "--nodes", "0"])
    assert r.exit_code == 2 and "error:" in r.output


def test_replay_mpi(tmp_path):
    for rank in (0, 1):
        lines = [{"ddlsim_mpilog": 1, "rank": rank, "size": 2}] + [
            {"call": "barrier", "t0": t, "t1": t + 0.001} for t in (0.0, 0.1, 0.2, 0.3)]
        (tmp_path / f"m.{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = runner.invoke(app, ["traces", "replay-mpi", str(tmp_path), "--system", "cpu-10gbe",
                            "--window", "barrier:1:3", "--iterations", "2", "-f", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["measured_per_iteration_s"] == 0.1 or abs(doc["measured_per_iteration_s"] - 0.1) < 1e-9
    assert abs(doc["predicted_per_iteration_s"] - 0.1) < 1e-3
    for args, match in [(["--window", "x"], "CALL:FIRST:LAST"), (["--iterations", "0"], ">= 1"),
                        (["--window", "barrier:0:9"], "window barrier:0:9")]:
        r = runner.invoke(app, ["traces", "replay-mpi", str(tmp_path), "--system", "cpu-10gbe",
                                *args])
        assert r.exit_code == 2 and match in r.output.replace("\n", " "), (args, r.output)

"""``calibrate compute`` counts its timed calls before it runs: a huge ``--reps`` is refused
with the budget and the ``--limit`` that raises it (it asked numpy for an 8 TB array)."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from ddlsim.cli import app

runner = CliRunner()


def test_huge_reps_are_refused_before_anything_runs(tmp_path):
    out = tmp_path / "c.csv"
    t0 = time.perf_counter()
    res = runner.invoke(app, ["calibrate", "compute", "--reps", "1000000000000", "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "--limit bench_samples=2e13" in res.output and "Traceback" not in res.output
    assert time.perf_counter() - t0 < 5.0 and not out.exists()


def test_the_limit_lets_a_run_through_and_bad_counts_are_named(tmp_path):
    out = tmp_path / "c.csv"
    # 2 dtypes × 2 shapes (32, 64 and no FFN shape below 4 × 64 = 256) × (0 + 1) calls
    args = ["calibrate", "compute", "--dtypes", "fp32,fp64", "--max-dim", "64", "--warmup", "0",
            "--reps", "1", "-o", str(out)]
    res = runner.invoke(app, [*args, "--limit", "bench_samples=3"])
    assert res.exit_code == 2 and "bench_samples=4" in res.output, res.output
    res = runner.invoke(app, [*args, "--limit", "bench_samples=4"])
    assert res.exit_code == 0 and out.exists(), res.output
    res = runner.invoke(app, ["calibrate", "compute", "--reps", "0", "-o", str(tmp_path / "d")])
    assert res.exit_code == 2 and "--reps >= 1" in res.output, res.output

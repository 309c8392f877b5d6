"""The ``ddlsim calibrate`` sub-app: fit, show, compute, errors as one paragraph, help texts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.cli import app

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def _no_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return True
    return False


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def text(result) -> str:
    out = result.output + (getattr(result, "stderr", "") or "")
    return re.sub(r"\s+", " ", out)


def test_fit_several_formats_then_show_with_plot(tmp_path):
    out = tmp_path / "profile.yaml"
    res = invoke("fit", DATA / "nccl_all_reduce_perf.txt", DATA / "nccl_reduce_scatter.json",
                 "-o", out, "--bootstrap", 50)
    assert res.exit_code == 0, text(res)
    prof = CalibrationProfile.load(out)
    assert {(e.op, e.scope) for e in prof.doc.comm} == {("all_reduce", "intra"),
                                                       ("reduce_scatter", "inter")}
    inputs = prof.doc.provenance["inputs"]
    assert [i["format"] for i in inputs] == ["nccl-tests", "nccl-tests-json"]
    assert all(len(i["sha256"]) == 64 for i in inputs)
    png = tmp_path / "p.png"
    res = invoke("show", out, "--plot", png)
    assert res.exit_code == 0, text(res)
    assert "all_reduce" in text(res) and png.stat().st_size > 10_000


def test_fit_osu_needs_flags_and_errors_are_one_paragraph(tmp_path):
    res = invoke("fit", DATA / "osu_allreduce.txt", "-o", tmp_path / "p.yaml")
    assert res.exit_code == 2
    assert "--ranks" in text(res) and "Traceback" not in text(res)
    res = invoke("fit", DATA / "osu_allreduce.txt", "-o", tmp_path / "p.yaml", "--ranks", 4,
                 "--nodes", 1, "--statistic", "mean")
    assert res.exit_code == 0, text(res)


def test_existing_output_is_never_overwritten_without_force(tmp_path):
    out = tmp_path / "p.yaml"
    out.write_text("precious\n")
    res = invoke("fit", DATA / "nccl_all_reduce_perf.txt", "-o", out, "--bootstrap", 0)
    assert res.exit_code == 2 and "--force" in text(res)
    assert out.read_text() == "precious\n"
    res = invoke("fit", DATA / "nccl_all_reduce_perf.txt", "-o", out, "--bootstrap", 0,
                 "--force")
    assert res.exit_code == 0 and out.read_text().startswith("version: 1")


@pytest.mark.parametrize("args, needle", [
    (["fit", DATA / "osu_bw.txt", "-o", "x.yaml", "--format", "csv"], "nccl-tests-json"),
    (["fit", "missing.txt", "-o", "x.yaml"], "does not exist"),
    (["fit", DATA / "nccl_all_gather.txt", "-o", "x.yaml", "--scope", "rack"], "'rack'"),
    (["show", "missing.yaml"], "does not exist"),
    (["comm", "--backend", "ucx"], "'ucx'"),
    (["comm", "--ops", "all_reduce,allgather"], "'allgather'"),
    (["comm", "--max-bytes", "64 parsecs"], "64 parsecs"),
    (["compute", "--backend", "jax"], "'jax'"),
    (["comm", "--clock", "tsc"], "'tsc'"),
    (["comm", "--backend", "nccl", "--clock", "cpu"], "--clock cpu times the host's CPU"),
    (["compute", "--backend", "torch"] if _no_torch() else ["compute", "--device", "tpu"],
     "ddlsim[torch]" if _no_torch() else "'tpu'"),
])
def test_bad_input_exits_2_and_quotes_the_value(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    res = invoke(*args)
    assert res.exit_code == 2, text(res)
    assert needle in text(res) and "Traceback" not in text(res)


def test_compute_command_writes_csv_and_fit_reads_it(tmp_path):
    csv = tmp_path / "c.csv"
    res = invoke("compute", "--max-dim", 64, "--min-dim", 16, "--reps", 2, "-o", csv)
    assert res.exit_code == 0, text(res)
    # 2 repetitions of 16-64 wide GEMMs: the plumbing is tested, not the fit's quality,
    # which a loaded host spoils (the --max-rel-rmse guard has its own tests)
    res = invoke("fit", csv, "-o", tmp_path / "p.yaml", "--peak", "fp32=1 TFLOP/s",
                 "--max-rel-rmse", "inf")
    assert res.exit_code == 0, text(res)
    prof = CalibrationProfile.load(tmp_path / "p.yaml")
    assert 0 < prof.compute_efficiency(2 * 64 ** 3, "fp32") < 1
    assert prof.doc.compute[0].peak_flops_per_s == 1e12
    # the compute rows may take their own statistic: the same fit as --statistic min
    fits = {}
    for name, opts in (("min", ["--statistic", "min"]),
                       ("mixed", ["--statistic", "median", "--compute-statistic", "min"])):
        res = invoke("fit", csv, DATA / "nccl_all_reduce_perf.txt", "-o", tmp_path / f"{name}.yaml",
                     "--peak", "fp32=1 TFLOP/s", "--max-rel-rmse", "inf", "--bootstrap", 0,
                     *opts)
        assert res.exit_code == 0, text(res)
        fits[name] = CalibrationProfile.load(tmp_path / f"{name}.yaml")
    assert fits["mixed"].doc.compute == fits["min"].doc.compute
    assert fits["mixed"].doc.provenance["fit"]["compute_statistic"] == "min"


def test_help_shows_launch_command_lines():
    res = invoke("comm", "--help")
    assert res.exit_code == 0
    assert "mpirun -n 16" in text(res) and "torchrun --nnodes 2" in text(res)
    assert "srun" in text(res)

"""Calibration guard rails: a profile is used only within the message sizes it measured.

The issue's case: llm.c GPT-2 124M in fp32 (the seed wiki's 9-rank example with the
reduce-scatter strategy) moves its 124,439,808 fp32 gradients, 497,759,232 B = 474.7 MiB
("475 MiB"), through one reduce-scatter and one all-gather across nodes. A profile fitted to
nccl-tests all-gather runs of at most 1 MiB must not time those 475 MiB: the preset model
does, with one warning naming the measured range and the size asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.calibration import CalibrationProfile, read_results
from ddlsim.calibration.build import fit_profile
from ddlsim.errors import DDLSimWarning

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
WIKI = ROOT / "examples" / "wiki-gpt2-9ranks-reduce_scatter.yaml"
MIB = 2**20
GRAD_BYTES = 124_439_808 * 4  # GPT-2 124M parameters in fp32
MESSAGE = ("calibration profile 'to-1MiB' measured nccl all_gather (inter-node) from 1 KiB to "
           "1 MiB; 475 MiB is outside it, so the preset model is used for it")


def truncated(src: Path, dst: Path, max_bytes: int) -> Path:
    """``src`` (nccl-tests text) without the data rows above ``max_bytes``."""
    lines = src.read_text().splitlines(keepends=True)
    dst.write_text("".join(line for line in lines
                           if not (line.split() and line.split()[0].isdigit()
                                   and int(line.split()[0]) > max_bytes)))
    return dst


@pytest.fixture(scope="module")
def profile_1mib(tmp_path_factory) -> CalibrationProfile:
    # nccl_all_gather.txt: 16 ranks on 2 nodes, 1 KiB to 64 MiB in steps of 4; kept: 1 KiB..1 MiB
    path = truncated(DATA / "nccl_all_gather.txt",
                     tmp_path_factory.mktemp("guard") / "ag.txt", MIB)
    return fit_profile([read_results(path, op="all_gather")], name="to-1MiB", bootstrap=20)


def predict_caught(cfg, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ddlsim.predict(cfg, **kw)
    return result, [str(w.message) for w in caught if issubclass(w.category, DDLSimWarning)]


def test_measured_range_is_that_of_the_fitted_points(profile_1mib):
    assert profile_1mib.measured_range("nccl", "all_gather", 16, "inter") == (1024.0, MIB)


@pytest.mark.parametrize("segments, want", [
    ([{"min_bytes": 0, "alpha_s": 1e-5, "beta_s_per_B": 1e-10}], (0.0, float("inf"))),
    ([{"min_bytes": 8, "alpha_s": 1e-5, "beta_s_per_B": 1e-10},
      {"min_bytes": 4096, "max_bytes": 2**30, "alpha_s": 2e-5, "beta_s_per_B": 1e-11}],
     (8.0, 2.0**30)),
])
def test_without_points_the_range_is_that_of_the_segments(segments, want):
    prof = CalibrationProfile.from_dict({"version": 1, "comm": [
        {"backend": "mpi", "op": "all_reduce", "scope": "intra", "ranks": 4, "nodes": 1,
         "ranks_per_node": 4, "segments": segments}]})
    assert prof.measured_range("mpi", "all_reduce", 4, "intra") == want


def test_outside_the_range_the_preset_is_used_with_one_warning(profile_1mib):
    plain, none = predict_caught(WIKI)
    got, messages = predict_caught(WIKI, calibration=profile_1mib)
    assert none == [] and messages == [MESSAGE]
    assert got.iteration_time_s == plain.iteration_time_s
    assert got.algorithms["dp.all_gather[475 MiB]"] == "ring (preset: outside profile range)"
    [rec] = got.extra["calibration_out_of_range"]
    assert rec == {"backend": "nccl", "op": "all_gather", "scope": "inter",
                   "measured_min_bytes": 1024.0, "measured_max_bytes": MIB,
                   "sizes_bytes": [float(GRAD_BYTES)], "message": MESSAGE}


def _entry(max_bytes: float, op: str = "all_gather", backend: str = "nccl") -> dict:
    return {"backend": backend, "op": op, "scope": "inter", "ranks": 9, "nodes": 5,
            "ranks_per_node": 0, "segments": [{
                "min_bytes": 8, "max_bytes": max_bytes, "alpha_s": 50e-6, "beta_s_per_B": 1e-9,
                "alpha_se_s": 1e-6, "beta_se_s_per_B": 1e-11, "corr_alpha_beta": 0.0}]}


def _profile(*entries: dict) -> CalibrationProfile:
    return CalibrationProfile.from_dict({"version": 1, "name": "hand", "comm": list(entries)})


def test_inside_the_range_the_profile_times_the_collectives():
    # measured to 1 GiB: 475 MiB is inside, so each collective takes α + β·S (9 ranks as
    # measured, no rank scaling) and the example reduces after backward: both are exposed
    prof = _profile(_entry(2.0**30), _entry(2.0**30, "reduce_scatter"))
    got, messages = predict_caught(WIKI, calibration=prof)
    assert messages == [] and "calibration_out_of_range" not in got.extra
    assert got.algorithms == {"reduce_scatter[475 MiB]": "nccl (calibrated)",
                              "all_gather[475 MiB]": "nccl (calibrated)"}
    want = 2 * (50e-6 + 1e-9 * GRAD_BYTES)
    assert got.breakdown.exposed_comm_s["dp"] == pytest.approx(want, rel=1e-9)


def test_one_warning_per_backend_op_scope_and_interval_runs_add_none():
    prof = _profile(_entry(MIB), _entry(MIB, "reduce_scatter"))
    plain, _ = predict_caught(WIKI)
    got, messages = predict_caught(WIKI, calibration=prof)
    assert messages == [
        f"calibration profile 'hand' measured nccl {op} (inter-node) from 8 B to 1 MiB; "
        "475 MiB is outside it, so the preset model is used for it"
        for op in ("all_gather", "reduce_scatter")]
    assert got.iteration_time_s == plain.iteration_time_s


def test_a_backend_that_measured_the_size_is_used_without_warning():
    # auto: "mpi" measured to 1 MiB only, "nccl" to 1 GiB; nccl times the all-gather
    prof = _profile(_entry(MIB, backend="mpi"), _entry(2.0**30))
    got, messages = predict_caught(WIKI, calibration=prof)
    assert messages == [] and got.algorithms["all_gather[475 MiB]"] == "nccl (calibrated)"


def test_cli_prints_the_warning_and_the_preset_time(profile_1mib, tmp_path):
    path = profile_1mib.save(tmp_path / "p.yaml")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "ddlsim.cli", "predict", str(WIKI),
                               "--format", "json", *extra], capture_output=True, text=True,
                              env=env, cwd=ROOT, check=True)
    plain, got = run(), run("--calibration", str(path))
    assert "warning: " + MESSAGE in " ".join(got.stderr.split())
    assert "warning:" not in plain.stderr
    doc = json.loads(got.stdout)
    assert doc["iteration_time_s"] == json.loads(plain.stdout)["iteration_time_s"]
    assert doc["calibration_out_of_range"][0]["measured_max_bytes"] == MIB


def test_calibrate_comm_defaults_reach_training_sizes():
    import inspect

    from ddlsim.calibration.cli import comm
    from ddlsim.calibration.comm_bench import DEFAULT_MAX_BYTES, default_sizes
    from ddlsim.units import parse_bytes

    default = inspect.signature(comm).parameters["max_bytes"].default.default
    assert parse_bytes(default) == DEFAULT_MAX_BYTES >= 256 * MIB
    sizes = default_sizes(DEFAULT_MAX_BYTES)
    assert sizes[0] == 8 and sizes[-1] == 512 * MIB >= GRAD_BYTES  # the wiki's 475 MiB inside


@pytest.mark.parametrize("size, reps, want", [
    (16 * MIB, 20, 20),       # up to 16 MiB: as asked
    (32 * MIB, 20, 10),       # one doubling: halved
    (64 * MIB, 20, 5),
    (512 * MIB, 20, 5),       # never below 5
    (512 * MIB, 3, 3),        # nor above what was asked
    (128 * MIB, 100, 12),     # three halvings: 100 >> 3
])
def test_timed_batches_taper_above_16_mib(size, reps, want):
    from ddlsim.calibration.comm_bench import reps_at

    assert reps_at(size, reps) == want
    assert reps_at(size, reps, None) == reps

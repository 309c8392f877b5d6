"""Predictions with a calibration profile: interval and per-operation backend choice."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.calibration import CalibrationProfile

CFG = {"model": "gpt3-1.3b", "parallel": {"tensor_model_parallel_size": 8},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
       "system": {"preset": "dgx-a100", "nodes": 1}}


def entry(backend: str, op: str, alpha: float, busbw: float, se: float) -> dict:
    factor = {"all_reduce": 2 * 7 / 8, "all_gather": 7 / 8}[op]
    beta = factor / busbw
    return {"backend": backend, "op": op, "scope": "intra", "ranks": 8, "nodes": 1,
            "ranks_per_node": 8, "segments": [{
                "min_bytes": 0, "alpha_s": alpha, "beta_s_per_B": beta,
                "alpha_se_s": se * alpha, "beta_se_s_per_B": se * beta, "corr_alpha_beta": 0.0}]}


@pytest.fixture
def two_backends() -> CalibrationProfile:
    # "mpi": low latency, low bandwidth; "nccl": high latency, high bandwidth
    comm = [entry(b, op, a, bw, 0.05) for b, a, bw in (("mpi", 2e-6, 20e9), ("nccl", 30e-6, 230e9))
            for op in ("all_reduce", "all_gather")]
    return CalibrationProfile.from_dict({"version": 1, "comm": comm})


def test_auto_mixes_backends_by_message_size(two_backends):
    r = ddlsim.predict(CFG, calibration=two_backends, backend="auto")
    choices = {k: v for k, v in r.algorithms.items() if "calibrated" in v}
    small = [v for k, v in choices.items() if k.startswith("all_reduce[8 KiB]")]
    large = [v for k, v in choices.items() if k.startswith("all_reduce[8 MiB]")]
    assert small == ["mpi (calibrated)"] and large == ["nccl (calibrated)"]
    single = r.extra["single_backend_time_s"]
    assert set(single) == {"mpi", "nccl"}
    assert r.iteration_time_s <= min(single.values())
    assert r.extra["gain_over_best_single_backend"] >= 0


def test_interval_brackets_the_prediction(two_backends):
    r = ddlsim.predict(CFG, calibration=two_backends, backend="nccl")
    lo, hi = r.interval_s
    assert lo < r.iteration_time_s < hi
    assert "iteration_time_interval_s" in r.to_dict()


def test_profile_without_uncertainty_says_so():
    r = ddlsim.predict(CFG, calibration="ddlsim/data/calibration/dgx-a100.yaml")
    assert r.interval_s is None and "no parameter uncertainty" in r.extra["interval_note"]

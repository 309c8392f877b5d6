"""The profile document and the query API the engines use; the shipped default profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ddlsim.calibration import (CalibrationProfile, build_profile, list_default_profiles,
                                load_default_profile, read_results)
from ddlsim.calibration.schema import (CalibrationError, CalibrationLookupError, busbw_factor,
                                       comm_row, summarize, tidy_frame)
from ddlsim.errors import ConfigError

DATA = Path(__file__).parent / "data"


def synthetic(backend: str, alpha: float, beta: float, ranks: int = 8, scope: str = "intra",
              op: str = "all_reduce") -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for s in 2 ** np.arange(3, 28):
        t = (alpha + beta * s) * np.exp(rng.normal(0, 0.01, 10))
        rows.append(comm_row(backend=backend, library=backend, library_version="1", op=op,
                             ranks=ranks, nodes=1 if scope == "intra" else 2,
                             ranks_per_node=ranks if scope == "intra" else ranks // 2,
                             scope=scope, nbytes=int(s), stats=summarize(t)))
    return rows


@pytest.fixture(scope="module")
def profile() -> CalibrationProfile:
    rows = (synthetic("mpi", 20e-6, 1 / 10e9) + synthetic("nccl", 40e-6, 1 / 100e9)
            + synthetic("nccl", 60e-6, 1 / 20e9, ranks=16, scope="inter"))
    compute = pd.DataFrame({"backend": "numpy", "library_version": "numpy", "device": "cpu",
                            "kind": "gemm", "dtype": "fp32", "m": 0, "n": 0, "k": 0, "batch": 0,
                            "heads": 0, "seq": 0, "head_dim": 0,
                            "flops": 2.0 * np.array([64, 256, 1024, 4096]) ** 3})
    compute["flops_per_s"] = 1e11 * compute["flops"] / (compute["flops"] + 1e8)
    return build_profile(tidy_frame(rows), compute, peaks={"fp32": 2e11}, bootstrap=100)


def test_queries(profile):
    assert profile.backends == ("mpi", "nccl") and profile.ops("nccl") == ("all_reduce",)
    assert profile.time_s("mpi", "all_reduce", 1e6, 8) == pytest.approx(20e-6 + 1e-4, rel=0.02)
    assert profile.alpha_beta("mpi", "all_reduce", 1e6, "intra") == \
        pytest.approx((20e-6, 1e-10), rel=0.03)
    with pytest.raises(CalibrationError, match="gloo"):
        profile.ops("gloo")


def test_scope_selects_the_entry(profile):
    assert profile.time_s("nccl", "all_reduce", 1e8, 16, "inter") == \
        pytest.approx(60e-6 + 1e8 / 20e9, rel=0.02)
    assert profile.time_s("nccl", "all_reduce", 1e8, 8, "intra") == \
        pytest.approx(40e-6 + 1e8 / 100e9, rel=0.02)
    with pytest.raises(CalibrationError, match="scope='inter'"):
        profile.time_s("mpi", "all_reduce", 8, 8, "inter")
    with pytest.raises(ConfigError, match="'rack'"):
        profile.time_s("mpi", "all_reduce", 8, 8, "rack")


def test_other_rank_counts_scale_through_bus_bandwidth(profile):
    """Measured on 8 ranks; 32 ranks: t(32) = t(8) / f(8) × f(32), f = 2(n−1)/n."""
    t8 = profile.time_s("mpi", "all_reduce", 1e7, 8)
    t32 = profile.time_s("mpi", "all_reduce", 1e7, 32)
    assert t32 == pytest.approx(t8 / 1.75 * (2 * 31 / 32))
    p = profile.predict("mpi", "all_reduce", 1e7, 32)
    assert (p.measured_ranks, p.rank_scale) == (8, pytest.approx(busbw_factor("all_reduce", 32)
                                                                 / 1.75))


def test_interval_contains_the_prediction_and_widens_with_level(profile):
    t = profile.time_s("mpi", "all_reduce", 1e6, 8)
    lo95, hi95 = profile.interval_s("mpi", "all_reduce", 1e6, 8)
    lo99, hi99 = profile.interval_s("mpi", "all_reduce", 1e6, 8, level=0.99)
    lo50, hi50 = profile.interval_s("mpi", "all_reduce", 1e6, 8, level=0.5)
    assert lo99 < lo95 < lo50 < t < hi50 < hi95 < hi99
    assert (hi95 - lo95) / t < 0.05  # 1 % noise, 25 sizes × 10 reps
    with pytest.raises(ConfigError):
        profile.interval_s("mpi", "all_reduce", 1e6, 8, level=1.5)


def test_best_backend_mixes_and_matches_per_size(profile):
    assert profile.best_backend("all_reduce", 64, 8, "intra")[0] == "mpi"      # lower α
    backend, t = profile.best_backend("all_reduce", 1 << 26, 8, "intra")       # higher 1/β
    assert backend == "nccl" and t == profile.time_s("nccl", "all_reduce", 1 << 26, 8, "intra")
    with pytest.raises(CalibrationError):
        profile.best_backend("broadcast", 64, 8)


def test_compute_efficiency(profile):
    x = 2.0 * 1024 ** 3
    assert profile.compute_rate_flops_per_s(x, "fp32") == pytest.approx(1e11 * x / (x + 1e8),
                                                                        rel=1e-3)
    assert profile.compute_efficiency(x, "fp32") == pytest.approx(0.5 * x / (x + 1e8), rel=1e-3)
    with pytest.raises(CalibrationError, match="bf16"):
        profile.compute_efficiency(x, "bf16")


@pytest.mark.parametrize("nbytes, ranks", [(-1, 8), (float("nan"), 8), (8, 0), (8, 2.0)])
def test_bad_queries_quote_the_value(profile, nbytes, ranks):
    with pytest.raises(ConfigError):
        profile.time_s("mpi", "all_reduce", nbytes, ranks)


def test_save_load_round_trip_and_no_overwrite(profile, tmp_path):
    path = profile.save(tmp_path / "p.yaml")
    back = CalibrationProfile.load(path)
    assert back.time_s("nccl", "all_reduce", 1e6, 8) == \
        pytest.approx(profile.time_s("nccl", "all_reduce", 1e6, 8), rel=1e-6)
    doc = yaml.safe_load(path.read_text())
    assert doc["version"] == 1 and doc["comm"][0]["segments"][0]["alpha_ci_s"]
    with pytest.raises(CalibrationError, match="--force"):
        profile.save(path)
    profile.save(path, force=True)


@pytest.mark.parametrize("patch, msg", [
    ({"version": 2}, "version 2"),
    ({"comm": [{"backend": "mpi", "op": "allreduce"}]}, "op"),
])
def test_invalid_profiles_are_rejected(profile, tmp_path, patch, msg):
    doc = {**profile.to_dict(), **patch}
    with pytest.raises(ConfigError, match=msg):
        CalibrationProfile.from_dict(doc)


def test_fit_of_nccl_tests_sample_recovers_the_generating_model():
    """data/nccl_all_reduce_perf.txt was generated with busbw 225 GB/s and α 30 µs above
    4 MiB (make_samples.py); the fit of the file must find them."""
    profile = build_profile(read_results(DATA / "nccl_all_reduce_perf.txt").table, bootstrap=0)
    last = profile.doc.comm[0].segments[-1]
    assert last.min_bytes == 4 << 20
    assert busbw_factor("all_reduce", 8) / last.beta_s_per_B == pytest.approx(225e9, rel=0.05)
    assert last.alpha_s == pytest.approx(30e-6, rel=0.25)


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100"])
def test_shipped_profiles_cite_every_number(name):
    assert name in list_default_profiles()
    prof = load_default_profile(name)
    assert prof.doc.provenance["sources"]
    for entry in prof.doc.comm:
        for seg in entry.segments:
            assert seg.source and "nccl-tests#" in seg.source and "tuning.cc" in seg.source
    with pytest.raises(CalibrationError, match="published"):
        prof.interval_s("nccl", "all_reduce", 1e9, 8)


@pytest.mark.parametrize("name, busbw", [("dgx-a100", 230e9), ("dgx-h100", 480e9)])
def test_shipped_all_reduce_reaches_the_published_bus_bandwidth(name, busbw):
    t = load_default_profile(name).time_s("nccl", "all_reduce", 8 << 30, 8)
    assert (8 << 30) / t * 1.75 == pytest.approx(busbw, rel=0.01)  # 8 GiB: α negligible
    assert load_default_profile(name).time_s("nccl", "all_reduce", 8, 8) == \
        pytest.approx(15e-6, rel=0.01)  # NCCL ring/LL latency model, 6.6 + 14 × 0.6 µs


def test_unknown_default_profile_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="dgx-a100"):
        load_default_profile("tpu-v5")


def test_missing_calibration_is_a_lookup_error_engines_can_fall_back_on(profile):
    for query in (lambda: profile.time_s("mpi", "gather", 8, 8),          # a ddlsim op never
                  lambda: profile.time_s("mpi", "broadcast", 8, 8),       # calibrated here
                  lambda: profile.time_s("ucc", "all_reduce", 8, 8),
                  lambda: profile.compute_efficiency(1e9, "fp8")):
        with pytest.raises(KeyError) as err:
            query()
        assert isinstance(err.value, CalibrationLookupError)
        assert not str(err.value).startswith("'")  # the message, not KeyError's repr


def test_numpy_numbers_are_accepted(profile):
    t = profile.time_s("mpi", "all_reduce", np.float64(1e6), np.int64(8))
    assert t == profile.time_s("mpi", "all_reduce", 1e6, 8)
    assert profile.has_compute and not load_default_profile("dgx-a100").has_compute

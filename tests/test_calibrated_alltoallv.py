"""A calibration profile times all-to-alls with per-peer splits (``split_bytes``): an even
split at its own size, an uneven one as the even all-to-all of its largest exchange
(``max(split) × n`` on the profile's curve; :func:`ddlsim.simulator.profilesize.profile_size`).
The profiles here are test fixtures, not measurements."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.calibration import CalibrationProfile
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

MiB = 2.0 ** 20
EP = 8


def moe(imbalance: float = 2.0) -> dict:
    """Two Mixtral 8x7B layers on one DGX H100, EP 8 over NVLink (scope intra), the rank 0
    of every EP group receiving ``imbalance`` × the mean tokens (uneven ``split_bytes``)."""
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": EP,
                         "moe": {"token_dispatcher_type": "alltoall",
                                 "router_imbalance": imbalance}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": 1}}


def entry(backend: str, op: str, alpha_s: float, bandwidth_Bps: float) -> dict:
    return {"backend": backend, "op": op, "scope": "intra", "ranks": EP, "nodes": 1,
            "ranks_per_node": EP, "segments": [{"min_bytes": 0, "alpha_s": alpha_s,
                                                "beta_s_per_B": 1.0 / bandwidth_Bps}]}


def profile(*entries: dict) -> CalibrationProfile:
    return CalibrationProfile.from_dict({"version": 1, "comm": list(entries)})


def cost_model(prof: CalibrationProfile | None, backend: str | None = None) -> CostModel:
    cfg = ddlsim.load_config(moe())
    return CostModel(cfg.system, ddlsim.build_workload(cfg), cfg.parallel.collective_algorithm,
                     profile=prof, backend=backend)


def a2a(split: tuple[float, ...], by: str = "receiver") -> Collective:
    return Collective("x", "all_to_all", "ep", sum(split), split_bytes=split, split_by=by)


def test_an_even_split_is_the_measured_operation_at_its_own_size():
    cost = cost_model(profile(entry("nccl", "all_to_all", 20e-6, 100e9)))
    even = cost.choice(a2a((8 * MiB,) * EP))
    assert even.label == "nccl (calibrated)"
    assert even.time_s == pytest.approx(20e-6 + 64 * MiB / 100e9, rel=1e-12)
    assert even.time_s == cost.choice(Collective("y", "all_to_all", "ep", 64 * MiB)).time_s


@pytest.mark.parametrize("by", ["receiver", "sender"])
def test_an_uneven_split_is_timed_by_its_largest_exchange(by):
    cost = cost_model(profile(entry("nccl", "all_to_all", 20e-6, 100e9)))
    split = (16 * MiB, *([48 * MiB / 7] * 7))          # 64 MiB, member 0 twice the mean
    got = cost.choice(a2a(split, by))
    assert got.key == "all_to_all[64 MiB]"
    assert got.label == "nccl (calibrated) at 128 MiB = 8 x largest split"
    assert got.time_s == pytest.approx(20e-6 + 8 * 16 * MiB / 100e9, rel=1e-12)


def test_a_profile_without_all_to_all_keeps_the_preset_model():
    split = (16 * MiB, *([48 * MiB / 7] * 7))
    preset = cost_model(None).choice(a2a(split))
    got = cost_model(profile(entry("nccl", "all_reduce", 20e-6, 100e9))).choice(a2a(split))
    assert got == preset and "calibrated" not in got.label


def test_auto_picks_the_faster_backend_per_all_to_all():
    # mpi: 1 us + S / 10 GB/s; nccl: 100 us + S / 200 GB/s; they cross at ~1.04 MB
    cost = cost_model(profile(entry("mpi", "all_to_all", 1e-6, 10e9),
                              entry("nccl", "all_to_all", 100e-6, 200e9)), backend="auto")
    small = cost.choice(a2a((8 * 1024.0, *([1024.0] * 7))))         # 64 KiB at the max
    large = cost.choice(a2a((16 * MiB, *([48 * MiB / 7] * 7))))    # 128 MiB at the max
    assert small.label == "mpi (calibrated) at 64 KiB = 8 x largest split"
    assert small.time_s == pytest.approx(1e-6 + 64 * 1024 / 10e9, rel=1e-12)
    assert large.label == "nccl (calibrated) at 128 MiB = 8 x largest split"
    assert large.time_s == pytest.approx(100e-6 + 128 * MiB / 200e9, rel=1e-12)


def test_a_10x_slower_curve_moves_the_moe_prediction_as_hand_computed():
    """12 all-to-alls per iteration (2 layers × dispatch and combine × forward, recomputed
    forward and backward; one micro-batch), none overlapped here: each is timed at
    8 × 16 MiB (the hot member's 2 × 8 MiB share), so the EP time is 12 × (α + β · 128 MiB)
    and the 10x slower curve adds 9 × that to the iteration."""
    fast = ddlsim.predict(moe(), calibration=profile(entry("nccl", "all_to_all", 20e-6, 100e9)))
    slow = ddlsim.predict(moe(), calibration=profile(entry("nccl", "all_to_all", 200e-6, 10e9)))
    t = 20e-6 + 128 * MiB / 100e9
    assert fast.algorithms["all_to_all[64 MiB]"] == \
        "nccl (calibrated) at 128 MiB = 8 x largest split"
    # beside them the dispatcher's 4 token-count all-gathers (8 ranks x 128 longs, a few
    # microseconds each, uncalibrated: moe_dispatch.alltoall_counts), the same in both runs
    counts = fast.breakdown.exposed_comm_s["ep"] - 12 * t
    assert 0 < counts < 4 * 20e-6
    assert slow.breakdown.exposed_comm_s["ep"] == pytest.approx(120 * t + counts, rel=1e-9)
    assert slow.iteration_time_s - fast.iteration_time_s == pytest.approx(9 * 12 * t, rel=1e-9)


def test_no_profile_no_change():
    """Without a profile the uneven all-to-all is the preset's, as before profiles timed it
    (NCCL's grouped sends, `nccl_p2p`, since 2026-12-01: the cheapest MPI algorithm before)."""
    plain = ddlsim.predict(moe())
    assert plain.algorithms["ep.all_to_all[64 MiB]"] == "nccl_p2p"
    split = (16 * MiB, *([48 * MiB / 7] * 7))
    assert cost_model(None).choice(a2a(split)).label == "nccl_p2p"

"""NCCL's own choice of algorithm and protocol by size (simulator/collectives/nccl/choice.py),
derived by hand from NCCL 2.30.7's tuning.cc (constants in simulator/collectives/nccl/tuning.py) for
two named machines, one node of 8 GPUs on NVSwitch each: A100 (300 GB/s NVLink per GPU and
direction) and H100 (450 GB/s; NVIDIA datasheets)."""

from __future__ import annotations

import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.collectives.nccl import NcclEnv
from ddlsim.simulator.collectives.nccl.choice import nccl_choice
from ddlsim.simulator.collectives.nccl.model import estimate_time

AMPERE, HOPPER = NcclEnv("ampere"), NcclEnv("hopper")
A100x8 = GroupNet(8, 8, 1e-6, 300e9, nccl=AMPERE)
H100x8 = GroupNet(8, 8, 1e-6, 450e9, nccl=HOPPER)


# NCCL 2.30.7's estimates on 8 A100s (tuning.cc; simulator/collectives/nccl/tuning.py), µs and
# GB/s: busBw of the link 300 x SM80_NVLINK_BW/25 = 240, over 240 / 40 (speedArrayIntra[0])
# = 6 channels; ring (nRanks/nsteps = 8/14): LL min(llMaxBw[Ampere][1 node] 87.7, 240 / 2)
# at 6.6 + 14 x 0.6; LL128 min(240 x 0.92, 6 x 20) at 14 + 14 x 1.9; Simple 240 at 8.4 + 14
# x 3.4; tree (x 1/2 and treeCorrectionFactor): min(240 x 0.92, 6 x 24) = 144, LL / 3.8 at
# 6.8 + 2 x 7 x 0.6, LL128 x 7/9 at 14 + 2 x 7 x 1.25, Simple at 8.4 + 2 x 7 x 4.0
CANDIDATES = {
    ("ring", "LL"): (6.6 + 14 * 0.6, 87.7 * 8 / 14, None),
    ("ring", "LL128"): (14.0 + 14 * 1.9, 120.0 * 8 / 14, None),
    ("ring", "Simple"): (8.4 + 14 * 3.4, 240.0 * 8 / 14, None),
    ("tree", "LL"): (6.8 + 14 * 0.6, 144 / 3.8 / 2, "LL"),
    ("tree", "LL128"): (14.0 + 14 * 1.25, 144 * 7 / 9 / 2, "LL128"),
    ("tree", "Simple"): (8.4 + 14 * 4.0, 144 / 2, "Simple"),
}
CORRECTION = {  # tuning.cc treeCorrectionFactor at log2(n / 64) = 0, 4, 10, 14, 16, 20
    "LL": {0: 1.0, 4: .9, 10: .6, 14: .5, 16: .7, 20: 1.0},
    "LL128": {0: 1.0, 4: 1.0, 10: .6, 14: .6, 16: .8, 20: .9},
    "Simple": {0: .9, 4: .9, 10: .6, 14: .5, 16: .7, 20: .8},
}


@pytest.mark.parametrize("log_size,want", [
    (0, ("ring", "LL")), (4, ("ring", "LL")), (10, ("ring", "LL")), (14, ("ring", "LL")),
    (16, ("ring", "Simple")), (20, ("ring", "Simple"))])
def test_nccl_picks_the_least_of_its_estimates(log_size, want):
    """64 B to 64 MiB: ring LL up to 1 MiB (16.3 µs at 64 KiB against tree LL's 21.0),
    then ring Simple (86.6 µs at 4 MiB against ring LL's 98.7); the measured A100 step
    changes the time taken, not this choice."""
    n = 64.0 * 2**log_size
    times = {}
    for key, (lat, bw, table) in CANDIDATES.items():
        corr = CORRECTION[table][log_size] if table else 1.0
        times[key] = lat + n / (1e3 * bw * corr)
    assert min(times, key=times.get) == want
    assert nccl_choice("all_reduce", n, A100x8, AMPERE) == want
    got = estimate_time("all_reduce", *want, n, A100x8, AMPERE) * 1e6
    assert got == pytest.approx(times[want], rel=1e-9)


def test_h100_moves_from_ring_ll_to_nvls_near_one_mib():
    """8 H100s: ring LL at 6.6 + 14 x 0.6 = 15.0 µs and min(llMaxBw[Hopper][1 node] 141,
    (450 x SM90_NVLINK_BW/25 = 370.8) / 2) x 8/14 = 80.57 GB/s; NVLS at 25 µs (hwLat
    NVLINK NVLS Simple) and 370.8 x nvlsEfficiency 0.85 x 7/8 (NVLS channels) x 2 (all-reduce
    pipelines two operations) x 8/14 = 315.2 GB/s. They cross where 10 µs = n (1/80.57 −
    1/315.2) / 1e3: n = 1,082,400 B; ring LL128 and Simple, tree and NVLS-tree never win."""
    ll_bw = min(141.0, 370.8 / 2) * 8 / 14
    nvls_bw = 370.8 * 0.85 * 7 / 8 * 2 * 8 / 14
    cross = 10.0 * 1e3 / (1 / ll_bw - 1 / nvls_bw)
    assert cross == pytest.approx(1.0824e6, rel=1e-3)
    for n in (8.0, 2.0**16, 2.0**20, cross * 0.99):
        assert nccl_choice("all_reduce", n, H100x8, HOPPER) == ("ring", "LL"), n
    for n in (cross * 1.01, 2.0**21, 2.0**26, 2.0**32):
        assert nccl_choice("all_reduce", n, H100x8, HOPPER) == ("nvls", "Simple"), n
    n = 2.0**24
    assert estimate_time("all_reduce", "nvls", "Simple", n, H100x8, HOPPER) * 1e6 == (
        pytest.approx(25.0 + n / (1e3 * nvls_bw), rel=1e-9))

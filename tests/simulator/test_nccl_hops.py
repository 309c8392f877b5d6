"""The ring LL's NVLink step as measured (ddlsim/simulator/nccl/hops.py) and NCCL's own choice
of protocol by size, derived by hand from NCCL 2.30.7's tuning.cc for one named machine: 8 x
A100 on NVSwitch (300 GB/s NVLink per GPU and direction, A100 datasheet), one node."""

from __future__ import annotations

import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.nccl import NcclEnv, nccl_time
from ddlsim.simulator.nccl.choice import nccl_choice
from ddlsim.simulator.nccl.hops import LL_HOP_US, ring_ll_extra_us
from ddlsim.simulator.nccl.model import estimate_time, nccl_form, nccl_seconds_array

AMPERE, HOPPER = NcclEnv("ampere"), NcclEnv("hopper")
A100x8 = GroupNet(8, 8, 1e-6, 300e9, nccl=AMPERE)
H100x8 = GroupNet(8, 8, 1e-6, 450e9, nccl=HOPPER)


def test_a100_ring_ll_takes_the_measured_step_and_nccl_estimates_its_own():
    """8 B on 8 A100s, 14 steps: NCCL estimates 6.6 + 14 x 0.6 = 15.0 µs and takes
    6.6 + 14 x 1.877 = 32.88 µs (plus 8 B at the LL bandwidth on the one channel it keeps)."""
    est = estimate_time("all_reduce", "ring", "LL", 8, A100x8, AMPERE) * 1e6
    took = nccl_time("all_reduce", "ring", "LL", 8, A100x8, AMPERE) * 1e6
    assert est == pytest.approx(6.6 + 14 * 0.6, abs=1e-3)
    assert took == pytest.approx(6.6 + 14 * LL_HOP_US["ampere"], abs=2e-2)
    # all-gather: 7 steps
    took_ag = nccl_time("all_gather", "ring", "LL", 8, A100x8, AMPERE) * 1e6
    assert took_ag == pytest.approx(6.6 + 7 * LL_HOP_US["ampere"], abs=2e-2)


def test_other_protocols_and_generations_keep_nccls_step():
    for proto in ("LL128", "Simple"):
        assert (nccl_time("all_reduce", "ring", proto, 2**24, A100x8, AMPERE)
                == estimate_time("all_reduce", "ring", proto, 2**24, A100x8, AMPERE))
    assert ring_ll_extra_us("all_reduce", 8, 1, "hopper", "nvlink", "intel") == 0.0
    assert ring_ll_extra_us("all_reduce", 8, 1, "ampere", "pci", "intel") == 0.0
    est = estimate_time("all_reduce", "ring", "LL", 8, H100x8, HOPPER) * 1e6
    assert est == pytest.approx(15.0, abs=1e-3)


@pytest.mark.parametrize("cpu,per_step", [("intel", 1.877 - 1.0), ("amd", 0.0)])
def test_across_nodes_a_step_is_no_less_than_nccls_network_floor(cpu, per_step):
    """2 nodes x 8, all-reduce: 30 steps, 2 of them across the network; the 28 others take
    max(step, netOverhead) in NCCL's estimate (1 µs Intel, 2 µs AMD) and in the time taken."""
    assert ring_ll_extra_us("all_reduce", 16, 2, "ampere", "nvlink", cpu) == pytest.approx(
        28 * per_step)


def test_the_search_tiers_array_form_carries_the_measured_step():
    form = nccl_form("all_reduce", "ring", "LL", A100x8, AMPERE)
    sizes = [8.0, 4096.0, 65536.0, 2.0**20]
    got = nccl_seconds_array(sizes, form.latency_us, form.plateau_latency_us, form.plateau_div,
                             form.algbw_GBps, None, form.fill_edges, form.fill_us,
                             form.fill_slope, form.channel_bytes, form.channels)
    want = [nccl_time("all_reduce", "ring", "LL", n, A100x8, AMPERE) for n in sizes]
    assert list(got) == pytest.approx(want, rel=1e-12)


# NCCL 2.30.7's estimates on 8 A100s (tuning.cc; ddlsim/simulator/nccl/tuning.py), µs and
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

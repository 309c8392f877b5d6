"""The ring LL's NVLink step as measured (ddlsim/simulator/nccl/hops.py): in the time taken,
not in NCCL's estimate, on A100 only, and no less than NCCL's network floor across nodes."""

from __future__ import annotations

import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.nccl import NcclEnv, nccl_time
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

"""The ring LL's steps as measured (simulator/collectives/nccl/hops.py): in the time taken, not in
NCCL's estimate; the NVLink step on A100 only, no less than NCCL's network floor across nodes;
across nodes, the network steps the ring makes at the measured network step."""

from __future__ import annotations

import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.collectives.nccl import NcclEnv, nccl_time
from ddlsim.simulator.collectives.nccl.hops import (LL_HOP_US, NET_LL_HOP_US, fit_net_ll_hop_us,
                                        ring_crossings, ring_ll_extra_us)
from ddlsim.simulator.collectives.nccl.model import estimate_time, nccl_form, nccl_seconds_array

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


@pytest.mark.parametrize("cpu,floor", [("intel", 1.0), ("amd", 2.0)])
def test_across_nodes_the_ring_takes_its_own_network_steps(cpu, floor):
    """2 nodes x 8, all-reduce, 30 steps. NCCL estimates 28 at max(0.6, netOverhead) and 2 at
    its 2.7 µs network step; the ring's longest path crosses the network 4 times (30 hops on
    a 16-ring that crosses every 8), so it takes 26 steps at max(1.877, netOverhead) and 4 at
    the measured network step."""
    hop = max(LL_HOP_US["ampere"], floor)
    taken = 26 * hop + 4 * NET_LL_HOP_US
    estimate = 28 * max(0.6, floor) + 2 * 2.7
    assert ring_ll_extra_us("all_reduce", 16, 2, "ampere", "nvlink", cpu) == pytest.approx(
        taken - estimate)


def test_two_dgx_a100_by_hand():
    """nccl#812's run (2 DGX A100, AMD hosts, NCCL_ALGO=Ring, 8 B): NCCL estimates 6.6 + 28 x 2
    + 2 x 2.7 = 68.0 µs and takes 6.6 + 26 x 2 + 4 x NET_LL_HOP_US (8 B at the LL bandwidth on
    the one channel it keeps adds well under 0.1 µs)."""
    env = NcclEnv("ampere", cpu="amd")
    net = GroupNet(16, 8, 1e-6, 300e9, 5e-6, 200e9, nodes=2, nccl=env)
    est = estimate_time("all_reduce", "ring", "LL", 8, net, env) * 1e6
    took = nccl_time("all_reduce", "ring", "LL", 8, net, env) * 1e6
    assert est == pytest.approx(6.6 + 28 * 2.0 + 2 * 2.7, abs=0.05)
    assert took == pytest.approx(6.6 + 26 * 2.0 + 4 * NET_LL_HOP_US, abs=0.05)


def _crossings_by_walking(op: str, p: int, nodes: int) -> int:
    """The most network hops of any chunk's path, walked hop by hop: ranks 0..p−1 in ring
    order, the hop out of rank r crossing the network where r is the last of its node."""
    ppn = p // nodes
    steps = 2 * (p - 1) if op == "all_reduce" else p - 1
    return max(sum((start + k) % p % ppn == ppn - 1 for k in range(steps))
               for start in range(p))


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nodes,ppn", [(1, 8), (2, 1), (2, 2), (2, 3), (2, 8), (3, 4), (8, 8),
                                       (16, 1), (5, 2)])
def test_ring_crossings_are_those_of_the_walked_ring(op, nodes, ppn):
    p = nodes * ppn
    assert ring_crossings(op, p, nodes) == (0 if nodes == 1 else
                                            _crossings_by_walking(op, p, nodes))


def test_ring_crossings_by_hand():
    assert ring_crossings("all_reduce", 16, 2) == 4   # NCCL 2.30.7 counts 2, 2.16.5 counts 4
    assert ring_crossings("all_reduce", 2, 2) == 2    # one GPU a node: every step
    assert ring_crossings("all_reduce", 4, 2) == 3
    assert ring_crossings("all_gather", 16, 2) == 2
    assert ring_crossings("all_reduce", 64, 8) == 16


def test_the_network_step_fit_recovers_a_step_and_refuses_several_gpus_a_node():
    points = [(2, 2, 6.6 + 2 * 7.0), (4, 4, 6.6 + 6 * 7.0)]
    assert fit_net_ll_hop_us(points) == pytest.approx(7.0)
    with pytest.raises(ValueError, match="one GPU a node"):
        fit_net_ll_hop_us([(16, 2, 93.0)])


def test_the_search_tiers_array_form_carries_the_measured_step():
    form = nccl_form("all_reduce", "ring", "LL", A100x8, AMPERE)
    sizes = [8.0, 4096.0, 65536.0, 2.0**20]
    got = nccl_seconds_array(sizes, form.latency_us, form.plateau_latency_us, form.plateau_div,
                             form.algbw_GBps, None, form.fill_edges, form.fill_us,
                             form.fill_slope, form.channel_bytes, form.channels)
    want = [nccl_time("all_reduce", "ring", "LL", n, A100x8, AMPERE) for n in sizes]
    assert list(got) == pytest.approx(want, rel=1e-12)


def test_the_array_form_carries_the_network_steps():
    env = NcclEnv("ampere", cpu="amd")
    net = GroupNet(16, 8, 1e-6, 300e9, 5e-6, 200e9, nodes=2, nccl=env)
    form = nccl_form("all_reduce", "ring", "LL", net, env)
    sizes = [8.0, 512.0, 65536.0]
    got = nccl_seconds_array(sizes, form.latency_us, form.plateau_latency_us, form.plateau_div,
                             form.algbw_GBps, None, form.fill_edges, form.fill_us,
                             form.fill_slope, form.channel_bytes, form.channels)
    want = [nccl_time("all_reduce", "ring", "LL", n, net, env) for n in sizes]
    assert list(got) == pytest.approx(want, rel=1e-12)

"""Group nets measured on the topology graph (ddlsim/simulator/netmodel.py): the analytical
engine sees a fabric where, and only where, a group's traffic crosses it (issue 11, item 3).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlsim.config import SystemConfig, resolve_section
from ddlsim.simulator.costs import CostModel
from ddlsim.simulator.netmodel import fair_rates, family_net, topology_of
from ddlsim.workloads.trace import GroupFamily

GB = 1e9


def _system(nodes: int, network: dict, *, nics: int = 1, g: int = 1) -> SystemConfig:
    """``nodes`` × ``g`` devices, ``nics`` NICs of 10 GB/s a node, MPI collectives."""
    return SystemConfig.model_validate({
        "name": "t", "nodes": nodes, "devices_per_node": g,
        "device": {"name": "gpu", "peak_flops": {"bf16": "100 TFLOP/s"},
                   "memory_bytes": "80 GB", "memory_bandwidth_Bps": "2 TB/s"},
        "intra_node": {"kind": "nvswitch", "bandwidth_Bps": "100 GB/s", "latency_s": "2 us"},
        "nics_per_node": nics, "nic": {"bandwidth_Bps": "80 Gb/s", "latency_s": "1 us"},
        "network": network})


def _net(system: SystemConfig, members: np.ndarray):
    devices = np.arange(system.num_devices)
    return family_net(system, topology_of(system), devices, members)


#: four groups of 4 ranks strided by 4: (0, 4, 8, 12), (1, 5, 9, 13), … one rank per node
STRIDED = np.arange(16).reshape(4, 4).T.copy()


def _torus_and_tree():
    return (_system(16, {"topology": "fat_tree"}),
            _system(16, {"topology": "torus", "torus_dims": [8, 2]}))


def test_a_torus_is_not_a_fat_tree():
    """16 nodes, one NIC of 10 GB/s. On a non-blocking fat tree every ring flow of the strided
    groups gets its NIC's 10 GB/s. On an 8 × 2 torus (router links at the NIC's 10 GB/s, node
    n at row-major coordinate (n // 2, n % 2)), group (0, 4, 8, 12) sits at (0,0), (2,0),
    (4,0), (6,0): each ring flow runs 2 hops forward along dimension 0 and the four cover
    the 8 forward links of column 0 once; group (2, 6, 10, 14) covers them once more. Two
    flows per link: 5 GB/s."""
    tree, torus = (_net(s, STRIDED) for s in _torus_and_tree())
    assert tree.bw_node_Bps == pytest.approx(10 * GB)
    assert torus.bw_node_Bps == pytest.approx(5 * GB)


def test_analytical_engine_sees_the_torus():
    """The same 100 MB MPI ring all-reduce on those groups: 2(p−1) = 6 steps of n/p = 25 MB,
    at 10 GB/s on the tree and 5 GB/s on the torus, plus each net's latency per step."""
    from ddlsim.workloads.trace import Collective, Workload, WorkloadMeta
    fam = GroupFamily("dp", "dp", STRIDED)
    wl = Workload("strided", 16, {"dp": fam}, (), WorkloadMeta(samples=1, tokens=1))
    op = Collective("x", "all_reduce", "dp", 1e8, algorithm="ring")
    times = []
    for system, bw in zip(_torus_and_tree(), (10 * GB, 5 * GB)):
        cost = CostModel(system, wl)
        t = cost.collective(op)
        assert t == pytest.approx(6 * (cost.nets["dp"].alpha_inter_s + 25e6 / bw))
        times.append(t)
    assert times[1] > 1.9 * times[0]


def test_oversubscription_only_where_traffic_crosses_leaves():
    """A fat tree 2:1 oversubscribed with 4 nodes per leaf: a group under one leaf keeps its
    NIC's 10 GB/s; a group spanning two leaves, all four of each leaf's nodes sending up at
    once, gets half."""
    system = _system(8, {"topology": "fat_tree", "oversubscription": 2.0, "nodes_per_leaf": 4})
    under_one_leaf = _net(system, np.arange(8).reshape(2, 4))  # rows 0..3 and 4..7
    assert under_one_leaf.bw_node_Bps == pytest.approx(10 * GB)
    across = _net(system, np.arange(8).reshape(2, 4).T.copy())  # rows (0, 4), (1, 5), …
    assert across.bw_node_Bps == pytest.approx(5 * GB)


def test_striping_gives_a_ring_every_nic_of_its_node():
    """2 nodes × 4 devices, 4 NICs: one 8-rank ring leaves each node once, striped over the
    4 NICs: 4 × 10 GB/s."""
    system = _system(2, {"topology": "single_switch"}, nics=4, g=4)
    net = _net(system, np.arange(8)[None, :])
    assert net.bw_node_Bps == pytest.approx(40 * GB)
    assert net.nodes == 2 and net.g == 4


def test_v100_hybrid_mesh_pair_gets_one_link_in_both_engines():
    """DGX-1 V100 (nvlink_mesh: 150 GB/s a GPU over 7 peers = 21.4 GB/s a link): a two-rank
    data-parallel pair moves over its one link, in the analytical engine as in the DES
    (issue 11: 21.4 against 150 GB/s before)."""
    system = SystemConfig.model_validate(resolve_section("system", {"preset": "dgx1-v100"}))
    fam = GroupFamily("dp", "dp", np.array([[0, 1]]))
    from ddlsim.workloads.trace import Workload, WorkloadMeta
    wl = Workload("pair", 2, {"dp": fam}, (), WorkloadMeta(samples=1, tokens=1))
    cost = CostModel(system, wl)
    assert cost.nets["dp"].bw_intra_Bps == pytest.approx(150e9 / 7)


def test_fair_rates_progressive_filling():
    """Two links of 10 and 4: flows A (link 0), B (links 0, 1), C (link 1): C and B share
    link 1 at 2 each, A gets the rest of link 0: 8 (Bertsekas & Gallager §6.5.2)."""
    rates = fair_rates([(0,), (0, 1), (1,)], np.ones(3), np.array([10.0, 4.0]))
    assert rates.tolist() == pytest.approx([8.0, 2.0, 2.0])


def _fill_reference(link, lengths, mult, capacity):
    """Progressive filling written plainly, every link every round (the definition)."""
    n = len(lengths)
    rate = np.full(n, np.inf)
    flow_of = np.repeat(np.arange(n), lengths)
    cap = capacity.astype(float).copy()
    live = np.ones(n, dtype=bool)
    while True:
        on = live[flow_of]
        load = np.bincount(link[on], weights=mult[flow_of[on]], minlength=len(cap))
        if not (load > 0).any():
            return rate
        share = np.where(load > 0, cap / np.where(load > 0, load, 1.0), np.inf)
        level = share.min()
        hit = np.zeros(n, dtype=bool)
        hit[flow_of[on & (share <= level * (1 + 1e-12))[link]]] = True
        rate[hit] = level
        cap = np.maximum(cap - np.bincount(link[hit[flow_of]],
                                           weights=mult[flow_of[hit[flow_of]]] * level,
                                           minlength=len(cap)), 0.0)
        live &= ~hit


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=0, max_size=4, unique=True),
                min_size=1, max_size=30),
       st.lists(st.integers(1, 9), min_size=30, max_size=30),
       st.lists(st.sampled_from([1.0, 2.5, 4.0, 10.0]), min_size=12, max_size=12))
def test_fair_rates_match_the_plain_definition(routes, mult, capacity):
    """fair_rates (the first round over every flow, a stop once every flow is frozen) gives
    bit for bit the rates of progressive filling written plainly."""
    m = np.array(mult[:len(routes)], dtype=float)
    cap = np.array(capacity)
    link = np.array([e for r in routes for e in r], dtype=np.int64)
    lengths = np.array([len(r) for r in routes], dtype=np.int64)
    got = fair_rates([tuple(r) for r in routes], m, cap)
    assert np.array_equal(got, _fill_reference(link, lengths, m, cap))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), min_size=0,
                max_size=60),
       st.integers(0, 5))
def test_unique_pairs_is_a_lexicographic_unique(pairs, shift):
    """_unique_pairs (a bincount or a 1-D unique of one code per pair) is numpy's unique
    over rows, with the counts, and the first index of the smallest pair."""
    from ddlsim.simulator.netmodel import _unique_pairs

    a = np.array([p[0] for p in pairs], dtype=np.int64) // (1 + shift * 300)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    got, counts, first = _unique_pairs(a, b)
    if not pairs:
        assert got.shape == (0, 2) and counts.size == 0
        return
    want, index, want_counts = np.unique(np.stack([a, b], axis=1), axis=0, return_index=True,
                                         return_counts=True)
    assert np.array_equal(got, want) and np.array_equal(counts, want_counts)
    assert first == index[0]

"""Collective cost formulas against the textbook closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from ddlsim.simulator.collectives import (GroupNet, algorithms_for, best_algorithm,
                                          collective_time, get_algorithm, split_matrix,
                                          uneven_time)
from ddlsim.config import ALGORITHMS


@pytest.mark.parametrize("p", [2, 3, 8, 64])
@pytest.mark.parametrize("n", [1e3, 1e6, 1e9])
def test_ring_all_reduce_textbook(p, n):
    # Patarasuk & Yuan 2009: 2(p-1)/p · n/B + 2(p-1)α
    alpha, B = 5e-6, 25e9
    net = GroupNet(p, p, alpha, B)
    assert collective_time("all_reduce", "ring", n, net) == pytest.approx(
        2 * (p - 1) / p * n / B + 2 * (p - 1) * alpha, rel=1e-12)


def test_ring_across_nodes_is_limited_by_the_nic():
    net = GroupNet(16, 8, 1e-6, 300e9, 10e-6, 25e9, nodes=2)
    n = 1e9
    assert collective_time("all_reduce", "ring", n, net) == pytest.approx(
        2 * 15 / 16 * n / 25e9 + 2 * 15 * 10e-6)


def test_binomial_reduce_and_chain():
    net = GroupNet(8, 8, 2e-6, 100e9)
    n = 1e8
    assert collective_time("reduce", "binomial", n, net) == pytest.approx(3 * (2e-6 + n / 100e9))
    assert collective_time("reduce", "ring", n, net) == pytest.approx(7 * 2e-6 + n / 100e9)


def test_every_configurable_algorithm_is_registered():
    for op, names in ALGORITHMS.items():
        assert set(names) == set(algorithms_for(op)), op


def test_every_algorithm_has_phases_moving_the_right_volume():
    """Each rank's bytes sent over all phases equal the algorithm's bandwidth term."""
    p, g, n = 8, 8, 8e6
    from ddlsim.simulator.collectives.nccl import NcclEnv
    net = GroupNet(p, g, 1e-6, 100e9, nccl=NcclEnv("hopper", sharp=True))
    for op, names in ALGORITHMS.items():
        for name in names:
            if name in ("nccl_collnet", "nccl_nvls_tree"):  # several nodes only
                continue
            phases = get_algorithm(op, name).phases_for(n, net)
            for ph in phases:
                assert ph.pairs.shape[1] == 2 and ph.pairs.min() >= 0 and ph.pairs.max() < p
                assert (ph.pairs[:, 0] != ph.pairs[:, 1]).all()
    ring = get_algorithm("all_reduce", "ring").phases(n, p, g)
    assert sum(ph.bytes * ph.repeat for ph in ring) == pytest.approx(2 * (p - 1) / p * n)


@given(n=st.floats(1, 1e10), p=st.integers(2, 512), alpha=st.floats(1e-7, 1e-4),
       bw=st.floats(1e8, 1e12))
def test_auto_is_the_cheapest(n, p, alpha, bw):
    net = GroupNet(p, p, alpha, bw)
    name, t = best_algorithm("all_reduce", n, net)
    assert all(t <= collective_time("all_reduce", a, n, net)
               for a in algorithms_for("all_reduce", "mpi"))
    assert math.isfinite(t) and t > 0


def test_hierarchical_needs_even_placement():
    net = GroupNet(9, 2, 1e-6, 20e9, 25e-6, 1.25e9, nodes=5)
    assert collective_time("all_reduce", "hierarchical", 1e6, net) == math.inf
    assert best_algorithm("all_reduce", 1e6, net)[0] != "hierarchical"


@given(scale=st.floats(1.0, 100.0), n=st.floats(1e3, 1e9))
def test_more_bandwidth_is_never_slower(scale, n):
    slow = GroupNet(32, 8, 3e-6, 300e9, 10e-6, 25e9, nodes=4)
    fast = GroupNet(32, 8, 3e-6, 300e9 * scale, 10e-6, 25e9 * scale, nodes=4)
    for op in ALGORITHMS:
        assert best_algorithm(op, n, fast)[1] <= best_algorithm(op, n, slow)[1] * (1 + 1e-12)


@given(n=st.floats(1e3, 1e10), nodes=st.integers(1, 8), g=st.integers(1, 8),
       alpha=st.floats(1e-7, 1e-4), bw_node=st.floats(1e9, 1e12))
def test_uneven_forms_of_an_equal_split_are_the_even_forms(n, nodes, g, alpha, bw_node):
    """``split_bytes`` with every entry n/p is the even all-to-all of n bytes, for each
    algorithm's uneven form (docs/trace.md), on one node or several."""
    p = nodes * g
    if p < 2:
        return
    net = GroupNet(p, g, 1e-6, 1e11, alpha, bw_node, nodes)
    matrix = split_matrix([n / p] * p)
    for algo in ("pairwise", "direct"):
        assert uneven_time("all_to_all", algo, matrix, net) == pytest.approx(
            collective_time("all_to_all", algo, n, net), rel=1e-12)


def test_uneven_direct_is_the_busiest_link_over_its_bandwidth():
    """4 members on 2 nodes of 2; member 3 receives 10 B from each, others 1 B. Device links:
    member 3 takes in 3·10 = 30 B (the most). Node 1 (members 2, 3) takes in from members 0
    and 1: 2·(1 + 10) = 22 B; node 0 sends those 22 B out. α = 5 µs, 1 B/s device links,
    2 B/s per node: max(30 / 1, 22 / 2) = 30 s."""
    net = GroupNet(4, 2, 1e-6, 1.0, 5e-6, 2.0, 2)
    assert uneven_time("all_to_all", "direct", split_matrix([1, 1, 1, 10]), net) \
        == pytest.approx(5e-6 + 30.0, rel=1e-12)


def test_mpich_selection_follows_its_generic_rules():
    """pmodels/mpich maint/tuning/coll/mpir/generic.json @6a79bf65: all-reduce by recursive
    doubling up to 8 B or fewer 4-byte elements than the largest power of two <= p, else
    Rabenseifner; all-gather (p = 8, a power of two) by recursive doubling below 512 KiB, ring
    above; broadcast binomial up to 12,288 B."""
    from ddlsim.simulator.collectives.selection import mpich_algorithm
    assert mpich_algorithm("all_reduce", 8, 64) == "recursive_doubling"
    assert mpich_algorithm("all_reduce", 4 * 63, 64) == "recursive_doubling"  # 63 < 64
    assert mpich_algorithm("all_reduce", 4 * 64, 64) == "rabenseifner"
    assert mpich_algorithm("all_gather", 512 * 1024 - 1, 8) == "recursive_doubling"
    assert mpich_algorithm("all_gather", 512 * 1024, 8) == "ring"
    assert mpich_algorithm("all_gather", 80 * 1024, 6) == "ring"
    assert mpich_algorithm("broadcast", 12288, 16) == "binomial"
    assert mpich_algorithm("broadcast", 12289, 16) == "scatter_allgather"
    assert mpich_algorithm("reduce", 1e9, 16) is None

"""The group networks' speed paths (issue 27): :func:`family_net` sets NCCL's view of the
machine itself (the cost model copied every net with ``dataclasses.replace`` to add it), and
the tree fabric's stripes are the routes one rail at a time gives, and node pairs counted
with a bound the caller knows are the pairs counted without it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlsim.config import SystemConfig
from ddlsim.simulator.collectives.nccl.model import NcclEnv
from ddlsim.simulator.costs import CostModel
from ddlsim.simulator.netmodel import (_fill, _slowest_rate, _unique_pairs, family_net,
                                       topology_of)
from ddlsim.workloads.trace import GroupFamily


def _system(nodes: int = 4, g: int = 4, nics: int = 2) -> SystemConfig:
    """``nodes`` × ``g`` GPUs on NVSwitch, ``nics`` NICs a node, a fat tree."""
    return SystemConfig.model_validate({
        "name": "t", "nodes": nodes, "devices_per_node": g,
        "device": {"name": "gpu", "peak_flops": {"bf16": "100 TFLOP/s"},
                   "memory_bytes": "80 GB", "memory_bandwidth_Bps": "2 TB/s"},
        "intra_node": {"kind": "nvswitch", "bandwidth_Bps": "100 GB/s", "latency_s": "2 us"},
        "nics_per_node": nics, "nic": {"bandwidth_Bps": "200 Gb/s", "latency_s": "1 us"},
        "network": {"topology": "fat_tree"}})


def test_family_net_carries_the_nccl_env_it_is_given():
    system = _system()
    devices = np.arange(system.num_devices)
    members = np.arange(16).reshape(4, 4).T.copy()   # one rank per node
    env = NcclEnv("hopper")
    plain = family_net(system, topology_of(system), devices, members)
    net = family_net(system, topology_of(system), devices, members, env)
    assert net.nccl is env and plain.nccl is None
    assert net == type(plain)(**{**{f: getattr(plain, f) for f in plain.__slots__},
                                 "nccl": env})


def test_the_cost_models_nets_carry_its_nccl_env():
    system = _system()
    groups = {"dp": GroupFamily("dp", "dp", np.arange(16).reshape(4, 4).T.copy()),
              "tp": GroupFamily("tp", "tp", np.arange(16).reshape(4, 4))}
    workload = type("W", (), {"world_size": 16, "groups": groups})()
    cost = CostModel(system, workload)
    assert all(net.nccl is cost._nccl for net in cost.nets.values())


def test_tree_stripes_are_the_routes_rail_by_rail():
    """:meth:`TreeRoutes.stripes` (rails from one ``arange % k``, the pair's slowest route by
    ``maximum.reduce``) gives each pair's rail routes and latencies as routing one rail at a
    time does."""
    system = _system(nodes=8, nics=4)
    topo = topology_of(system)
    trees = topo._trees
    src, dst = np.array([0, 1, 5, 7]), np.array([3, 6, 2, 0])
    flat, lengths, per_pair, latency = trees.stripes(src, dst)
    assert per_pair.tolist() == [4] * 4
    routes = np.split(flat, np.cumsum(lengths)[:-1])
    for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
        want = [topo.rail_fabric_route(a, b, c) for c in range(4)]
        assert [tuple(r.tolist()) for r in routes[4 * i:4 * i + 4]] == [tuple(w) for w in want]
        assert latency[i] == max(topo.path_latency_s(w) for w in want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=0, max_size=4, unique=True),
                min_size=1, max_size=30),
       st.lists(st.integers(1, 9), min_size=30, max_size=30),
       st.lists(st.one_of(st.sampled_from([1.0, 2.5, 4.0, 10.0]),
                          st.floats(0.1, 100.0, allow_nan=False)), min_size=12, max_size=12))
def test_the_slowest_rate_is_the_fills_smallest_bit_for_bit(routes, mult, capacity):
    """_slowest_rate (progressive filling's first level alone) is the smallest rate of the
    whole fill, bit for bit, ties and near-ties included; inf where no flow crosses a link."""
    m = np.array(mult[:len(routes)], dtype=float)
    cap = np.array(capacity)
    link = np.array([e for r in routes for e in r], dtype=np.int64)
    lengths = np.array([len(r) for r in routes], dtype=np.int64)
    want = float(_fill(link, lengths, m, cap).min())
    got = _slowest_rate(link, lengths, m, cap)
    assert got == want or (math.isinf(got) and math.isinf(want))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 256), st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)),
                                     min_size=1, max_size=60))
def test_pairs_counted_under_a_known_bound_are_the_pairs_counted_without(span, pairs):
    """_unique_pairs with ``span`` (every value below it, as node ids below the node count)
    gives the pairs, counts and first index it gives taking the bounds itself."""
    a = np.array([x % span for x, _ in pairs], dtype=np.int64)
    b = np.array([y % span for _, y in pairs], dtype=np.int64)
    want, got = _unique_pairs(a, b), _unique_pairs(a, b, span)
    assert np.array_equal(got[0], want[0]) and got[0].dtype == want[0].dtype
    assert np.array_equal(got[1], want[1]) and got[1].dtype == want[1].dtype
    assert got[2] == want[2]

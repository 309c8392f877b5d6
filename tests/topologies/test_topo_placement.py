"""Rank placement: consecutive, round robin and explicit lists, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddlsim.errors import ConfigError
from ddlsim.topologies import build_topology, place_ranks

from topo_helpers import make_spec

WIKI = build_topology("cpu-10gbe")   # 5 nodes × 2 ranks


def test_wiki_nine_ranks_fill_nodes_in_order():
    """The seed wiki runs 9 ranks on 5 two-rank nodes: ranks 0, 1 on node 0 … rank 8 on node 4."""
    devices = place_ranks(WIKI, 9)
    assert devices.tolist() == list(range(9))
    assert WIKI.node_of_device[devices].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4]


def test_round_robin_deals_ranks_to_nodes_in_turn():
    devices = place_ranks(WIKI, 7, "round_robin")
    assert WIKI.node_of_device[devices].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert devices.tolist() == [0, 2, 4, 6, 8, 1, 3]


def test_explicit_list_is_taken_as_is():
    devices = place_ranks(WIKI, 3, [9, 0, 4])
    assert devices.dtype == np.int64 and devices.tolist() == [9, 0, 4]


def test_placement_is_read_only():
    with pytest.raises(ValueError):
        place_ranks(WIKI, 2)[0] = 5


@given(nodes=st.integers(1, 6), per_node=st.integers(1, 4), data=st.data())
def test_policies_give_distinct_devices_in_range(nodes, per_node, data):
    topo = build_topology(make_spec(nodes=nodes, devices_per_node=per_node,
                                    network={"topology": "single_switch"}))
    ranks = data.draw(st.integers(1, nodes * per_node))
    for policy in ("consecutive", "round_robin"):
        devices = place_ranks(topo, ranks, policy)
        assert len(devices) == ranks == len(set(devices.tolist()))
        assert devices.min() >= 0 and devices.max() < nodes * per_node
    spread = topo.node_of_device[place_ranks(topo, ranks, "round_robin")]
    counts = np.bincount(spread, minlength=nodes)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("ranks, policy, message", [
    (11, "consecutive",
     r"num_ranks = 11 does not fit: .* 'cpu-10gbe' has 10 devices; allowed: 1..10"),
    (0, "consecutive", r"num_ranks = 0 does not fit"),
    (2.0, "consecutive", r"num_ranks = 2.0 must be an integer"),
    (2, "packed", r"placement = 'packed' is not a policy; allowed: consecutive, round_robin"),
    (3, [0, 1], r"placement lists 2 devices but there are 3 ranks"),
    (2, [0, 10], r"placement names device 10, but the topology has devices 0..9"),
    (2, [0, -1], r"placement names device -1"),
    (3, [4, 1, 4], r"placement puts ranks 0 and 2 both on device 4"),
    (2, [0, "1"], r"placement entry '1' is not a device id"),
])
def test_bad_placements_name_the_value_and_what_is_allowed(ranks, policy, message):
    with pytest.raises(ConfigError, match=message):
        place_ranks(WIKI, ranks, policy)

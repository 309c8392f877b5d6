"""Clusters as networkx graphs: builders, routes with deterministic ECMP, rank placement.

What a discrete-event engine uses::

    topo = build_topology("dgx-a100")               # or a mapping / SystemConfig
    ranks = place_ranks(topo, 16, "consecutive")    # device id per rank
    path = topo.route(ranks[0], ranks[9], flow_key=3)  # tuple of edge ids
    topo.edge_bandwidth_Bps[list(path)], topo.path_latency_s(path)
"""

from . import direct, fabrics, intra  # noqa: F401  (register the builders)
from .build import build_topology, from_spec, from_system
from .graph import Topology
from .placement import PLACEMENT_POLICIES, place_ranks
from .registry import (LINK_KINDS, NODE_FABRICS, NODE_KINDS, TOPOLOGIES, GraphBuilder,
                       register_node_fabric, register_topology)
from .spec import FabricSpec, NodeFabricSpec, TopologySpec, parse_spec
from .report import bisection_bandwidth, draw, summary

__all__ = ["Topology", "build_topology", "from_system", "from_spec", "place_ranks",
           "PLACEMENT_POLICIES", "summary", "bisection_bandwidth", "draw", "register_topology",
           "register_node_fabric", "TOPOLOGIES", "NODE_FABRICS", "NODE_KINDS", "LINK_KINDS",
           "GraphBuilder", "TopologySpec", "FabricSpec", "NodeFabricSpec", "parse_spec"]

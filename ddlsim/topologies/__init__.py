"""Clusters as networkx graphs: builders, routes with deterministic ECMP, rank placement.

What a discrete-event engine uses::

    topo = build_topology("dgx-a100")               # or a mapping / SystemConfig
    ranks = place_ranks(topo, 16, "consecutive")    # device id per rank
    path = topo.route(ranks[0], ranks[9], flow_key=3)  # tuple of edge ids
    topo.edge_bandwidth_Bps[list(path)], topo.path_latency_s(path)
"""

from .._lazy import lazy_exports

__all__ = ["Topology", "build_topology", "from_system", "from_spec", "place_ranks",
           "PLACEMENT_POLICIES", "summary", "bisection_bandwidth", "draw", "register_topology",
           "register_node_fabric", "TOPOLOGIES", "NODE_FABRICS", "NODE_KINDS", "LINK_KINDS",
           "GraphBuilder", "TopologySpec", "FabricSpec", "NodeFabricSpec", "parse_spec"]

_EXPORTS = {
    "build_topology": ".build",
    "from_spec": ".build",
    "from_system": ".build",
    "Topology": ".graph",
    "PLACEMENT_POLICIES": ".placement",
    "place_ranks": ".placement",
    "LINK_KINDS": ".registry",
    "NODE_FABRICS": ".registry",
    "NODE_KINDS": ".registry",
    "TOPOLOGIES": ".registry",
    "GraphBuilder": ".registry",
    "register_node_fabric": ".registry",
    "register_topology": ".registry",
    "FabricSpec": ".spec",
    "NodeFabricSpec": ".spec",
    "TopologySpec": ".spec",
    "parse_spec": ".spec",
    "bisection_bandwidth": ".report",
    "draw": ".report",
    "summary": ".report",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

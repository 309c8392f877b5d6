"""What a topology holds, its bisection bandwidth, and a picture of small ones."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx

from .graph import Topology
from .registry import FABRIC_KINDS, LINK_KINDS, NODE_KINDS

__all__ = ["summary", "bisection_bandwidth", "draw", "MAX_DRAW_VERTICES", "FULL_CUT_VERTICES"]

#: ``draw`` refuses graphs with more vertices than this (the picture would be unreadable).
MAX_DRAW_VERTICES = 300
#: Above this many vertices the bisection min cut runs on the graph with nodes contracted.
FULL_CUT_VERTICES = 5000
_INSIDE_KINDS = ("device", "nvswitch", "pcie_switch", "host")
_LEVEL_NAMES = {1: "leaf switch", 2: "spine switch", 3: "core switch"}


def summary(topology: Topology) -> dict[str, Any]:
    """Counts of vertices and links by kind, the fabric's sizing and the bisection bandwidth.

    Returns a JSON-serialisable dict; bandwidths in bytes/s, latencies in seconds.
    """
    g = topology.graph
    spec = g.graph.get("spec")
    bisection, method = bisection_bandwidth(topology)
    return {
        "name": topology.name,
        "nodes": topology.num_nodes,
        "devices_per_node": topology.devices_per_node,
        "devices": topology.num_devices,
        "intra_node": spec.intra_node.kind if spec is not None else None,
        "nics_per_node": spec.nics_per_node if spec is not None else None,
        "vertices": _vertex_counts(g),
        "links": _link_table(topology),
        "fabric": dict(g.graph.get("fabric", {})),
        "bisection_bandwidth_Bps": bisection,
        "bisection_method": method,
    }


def _vertex_counts(g: nx.DiGraph) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for _, attrs in g.nodes(data=True):
        kind = attrs["kind"]
        counts[_LEVEL_NAMES[attrs["level"]] if kind == "switch" else kind] += 1
    order = [*NODE_KINDS, *_LEVEL_NAMES.values()]
    return {k: counts[k] for k in order if counts[k]}


def _link_table(topology: Topology) -> dict[str, dict[str, Any]]:
    """Full-duplex links by kind: count, distinct bandwidths and latencies per direction."""
    table: dict[str, dict[str, Any]] = {}
    for kind in LINK_KINDS:
        ids = [i for i, k in enumerate(topology.edge_kind) if k == kind]
        if ids:
            table[kind] = {
                "count": len(ids) // 2,
                "bandwidth_Bps": sorted({float(topology.edge_bandwidth_Bps[i]) for i in ids}),
                "latency_s": sorted({float(topology.edge_latency_s[i]) for i in ids}),
            }
    return table


def bisection_bandwidth(topology: Topology) -> tuple[float | None, str]:
    """Bandwidth (bytes/s, one direction) across the cut between the two halves of the cluster.

    The halves are the first ⌊N/2⌋ compute nodes and the rest (on one node: its first half of
    devices and the rest). The value is the max-flow/min-cut between them with each link's
    capacity its bandwidth (``nx.minimum_cut_value``). Graphs above
    :data:`FULL_CUT_VERTICES` vertices are cut with each compute node contracted to one vertex
    linked to its switches by the sum of its NIC bandwidths — the same value whenever a node's
    internal links outrun its NICs. Returns the value (``None`` for one device) and a sentence
    naming the method.
    """
    if topology.num_devices < 2:
        return None, "one device: no bisection"
    if topology.num_nodes == 1:
        half = topology.num_devices // 2
        side = {v: topology.device_index[v] < half for v in topology.devices}
        inside = [v for v, k in topology.graph.nodes(data="kind") if k in _INSIDE_KINDS]
        value = _min_cut(_capacity_graph(topology.graph.subgraph(inside)), side)
        return value, (f"min cut between devices 0..{half - 1} and the rest of the node "
                       "(intra-node links only)")
    half = topology.num_nodes // 2
    where = f"min cut between nodes 0..{half - 1} and nodes {half}..{topology.num_nodes - 1}"
    if topology.graph.number_of_nodes() <= FULL_CUT_VERTICES:
        side = {v: topology.node_of_device[topology.device_index[v]] < half
                for v in topology.devices}
        return _min_cut(_capacity_graph(topology.graph), side), where + " (whole graph)"
    side = {("node", n): n < half for n in range(topology.num_nodes)}
    return (_min_cut(_contracted_graph(topology.graph), side),
            where + " (each node contracted to one vertex, capacity = its NIC bandwidth)")


def _capacity_graph(g: nx.DiGraph) -> nx.Graph:
    cap = nx.Graph()
    for u, v, bw in g.edges(data="bandwidth_Bps"):
        bw = min(bw, g.edges[v, u]["bandwidth_Bps"])
        cap.add_edge(u, v, capacity=bw)
    return cap


def _contracted_graph(g: nx.DiGraph) -> nx.Graph:
    """Fabric links as they are; each node's links to a switch summed into one edge."""
    cap = nx.Graph()
    for u, v, bw in g.edges(data="bandwidth_Bps"):
        if g.nodes[v]["kind"] not in FABRIC_KINDS:
            continue
        if g.nodes[u]["kind"] in FABRIC_KINDS:
            cap.add_edge(u, v, capacity=bw)
        else:  # a NIC's uplink, seen once (its downlink points the other way)
            a = ("node", g.nodes[u]["node"])
            old = cap.edges[a, v]["capacity"] if cap.has_edge(a, v) else 0.0
            cap.add_edge(a, v, capacity=old + bw)
    return cap


def _min_cut(cap: nx.Graph, side: dict[Any, bool]) -> float:
    """Max flow from the vertices with ``side`` True to those with False (infinite taps)."""
    source, sink = ("__half_a__",), ("__half_b__",)
    for v, first in side.items():
        cap.add_edge(source if first else sink, v)  # no capacity attribute: infinite
    return float(nx.minimum_cut_value(cap, source, sink, capacity="capacity"))


def draw(topology: Topology, path: str | Path, *, max_vertices: int = MAX_DRAW_VERTICES,
         force: bool = False) -> Path:
    """Draw the graph, layered (devices at the bottom, core switches on top), to ``path``.

    Uses matplotlib's Agg canvas (no display needed); the file is written with
    :func:`ddlsim.textio.write_output` (an existing file is replaced only with ``force``).
    Refuses graphs with more than ``max_vertices`` vertices with a
    :class:`~ddlsim.errors.ConfigError`.
    """
    from ..errors import ConfigError

    n = topology.graph.number_of_nodes()
    if n > max_vertices:
        raise ConfigError(f"this topology has {n} vertices ({topology.num_devices} devices); "
                          f"draw() draws at most {max_vertices} — draw fewer nodes "
                          "(e.g. --nodes 4) or read summary() instead")
    from matplotlib.figure import Figure

    g = topology.graph.to_undirected(as_view=True)
    pos = _layered_positions(topology.graph)
    fig = Figure(figsize=(max(6.0, min(24.0, 0.25 * n)), 6.0))
    ax = fig.add_subplot()
    for i, kind in enumerate(LINK_KINDS):
        edges = [(u, v) for u, v, k in g.edges(data="link_kind") if k == kind]
        nx.draw_networkx_edges(g, pos, edgelist=edges, ax=ax, edge_color=f"C{i}", label=kind)
    for i, kind in enumerate(NODE_KINDS):
        nodes = [v for v, k in g.nodes(data="kind") if k == kind]
        if nodes:
            nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_size=60,
                                   node_color=f"C{i}", node_shape="s" if kind == "device" else "o")
    if n <= 60:
        nx.draw_networkx_labels(g, pos, ax=ax, font_size=6)
    ax.set_title(f"{topology.name}: {topology.num_nodes} nodes × "
                 f"{topology.devices_per_node} devices")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_axis_off()
    from ..figio import save_figure
    return save_figure(fig, path, force=force, what="--draw file", dpi=150, bbox_inches="tight")


def _layered_positions(g: nx.DiGraph) -> dict[Any, tuple[float, float]]:
    """x spread evenly per layer in vertex order; y by layer (device 0 … core switch 5)."""
    layer_of = {"device": 0, "nvswitch": 1, "pcie_switch": 1, "host": 1, "nic": 2, "router": 3}
    layers: dict[int, list[Any]] = {}
    for v, attrs in g.nodes(data=True):
        layer = 2 + attrs["level"] if attrs["kind"] == "switch" else layer_of[attrs["kind"]]
        layers.setdefault(layer, []).append(v)
    return {v: ((i + 0.5) / len(vs), float(y))
            for y, vs in layers.items() for i, v in enumerate(vs)}

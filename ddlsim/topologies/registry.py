"""Registries of topology builders and the small graph builder they share.

Two open extension points, each one decorator keyed by the string users type:

* ``@register_node_fabric("nvswitch")`` — how the devices *inside* one compute node connect
  (``system.intra_node.kind``);
* ``@register_topology("fat_tree")`` — the fabric *between* nodes (``system.network.topology``).

Adding a topology is one new function plus its decorator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

__all__ = ["register_node_fabric", "register_topology", "NODE_FABRICS", "TOPOLOGIES",
           "GraphBuilder", "GraphRecord", "NODE_KINDS", "LINK_KINDS", "NODE_LOCAL_KINDS", "FABRIC_KINDS",
           "lookup"]

#: Kinds of graph vertices. ``switch`` carries ``level`` (leaf 1, spine/aggregation 2, core 3).
NODE_KINDS = ("device", "nvswitch", "pcie_switch", "host", "nic", "switch", "router")
#: Vertices that live inside one compute node (they carry the ``node`` attribute).
NODE_LOCAL_KINDS = ("device", "nvswitch", "pcie_switch", "host", "nic")
#: Vertices of the inter-node fabric.
FABRIC_KINDS = ("switch", "router")
#: Kinds of links (every link is two directed edges, one per direction).
LINK_KINDS = ("nvlink", "pcie", "shm", "nic", "fabric")

#: name → ``fn(builder, node, devices, intra_spec) -> hub or None`` (see :mod:`.intra`).
NODE_FABRICS: dict[str, Callable[..., str | None]] = {}
#: name → ``fn(builder, spec, nics_by_node) -> router`` (see :mod:`.fabrics`, :mod:`.direct`).
TOPOLOGIES: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable], what: str, name: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"{what} {name!r} is already registered (by {table[name].__name__})")
        table[name] = fn
        return fn
    return decorate


def register_node_fabric(name: str) -> Callable[[Callable], Callable]:
    """Register a builder of the fabric inside one compute node under ``name``."""
    return _register(NODE_FABRICS, "node fabric", name)


def register_topology(name: str) -> Callable[[Callable], Callable]:
    """Register a builder of the inter-node fabric under ``name``."""
    return _register(TOPOLOGIES, "topology", name)


def lookup(table: dict[str, Callable], field: str, name: str) -> Callable:
    """The builder registered as ``name``; a :class:`ConfigError` listing the names otherwise."""
    if name not in table:
        raise ConfigError(f"{field} = {name!r} is not a known builder; allowed: "
                          f"{', '.join(sorted(table))}")
    return table[name]


class GraphRecord:
    """A directed graph held as plain dicts in networkx's own layout, so that building and
    routing a cluster needs no networkx (whose import costs more than a prediction);
    :meth:`to_networkx` gives the ``nx.DiGraph``.

    Attributes
    ----------
    graph : dict
        Graph attributes (``fabric``, ``spec``), as ``nx.DiGraph.graph``.
    nodes : dict
        Vertex → its attribute dict, in insertion order.
    succ : dict
        Vertex → {successor: edge attribute dict}, in insertion order (every vertex has one).
    """

    def __init__(self) -> None:
        self.graph: dict[str, Any] = {}
        self.nodes: dict[Any, dict[str, Any]] = {}
        self.succ: dict[Any, dict[Any, dict[str, Any]]] = {}

    def to_networkx(self):
        """The same vertices, edges and attributes (same dicts) as an ``nx.DiGraph``."""
        import networkx as nx

        g = nx.DiGraph()
        g.graph.update(self.graph)
        g.add_nodes_from(self.nodes.items())
        g.add_edges_from((u, v, a) for u, out in self.succ.items() for v, a in out.items())
        return g


class GraphBuilder:
    """Accumulates vertices and full-duplex links into a :class:`GraphRecord` (``graph``).

    Every edge that leaves a ``switch`` or ``router`` gets ``switch_latency_s`` added, so a
    route through *k* switches pays *k* switch traversals.

    Parameters
    ----------
    switch_latency_s : float
        Port-to-port latency of one fabric switch or router, seconds.
    """

    def __init__(self, switch_latency_s: float = 0.0):
        self.graph = GraphRecord()
        self.switch_latency_s = float(switch_latency_s)

    def add_node(self, name: str, kind: str, **attrs: Any) -> str:
        """Add a vertex of ``kind`` (one of :data:`NODE_KINDS`) and return its name."""
        self.graph.nodes.setdefault(name, {}).update(kind=kind, **attrs)
        self.graph.succ.setdefault(name, {})
        return name

    def add_link(self, u: str, v: str, *, bandwidth_Bps: float, link_kind: str,
                 latency_s: float = 0.0, reverse_latency_s: float | None = None) -> None:
        """Add the full-duplex link u ↔ v: two directed edges with the same bandwidth.

        ``latency_s`` is u → v's latency, ``reverse_latency_s`` v → u's (default the same),
        each before the switch latency is added.
        """
        back = latency_s if reverse_latency_s is None else reverse_latency_s
        for a, b, lat in ((u, v, latency_s), (v, u, back)):
            if self.graph.nodes[a]["kind"] in FABRIC_KINDS:
                lat += self.switch_latency_s
            self.graph.succ[a].setdefault(b, {}).update(
                bandwidth_Bps=float(bandwidth_Bps), latency_s=float(lat), link_kind=link_kind)

"""The :class:`Topology`: a cluster as a directed graph, with arrays and routes for the engines.

Graph model
-----------
Vertices carry ``kind`` (:data:`~.registry.NODE_KINDS`). Vertices inside compute node *n*
(devices, NVSwitch, PCIe switch, host, NICs) carry ``node = n``; devices also carry ``local``
(their index in the node) and ``nics`` (the NICs their inter-node traffic uses). Switches
carry ``level`` (leaf 1, spine/aggregation 2, core 3). Every full-duplex link is two directed
edges, each with ``bandwidth_Bps`` (> 0), ``latency_s`` (≥ 0) and ``link_kind``
(:data:`~.registry.LINK_KINDS`).

Routes
------
A route between devices of one node stays inside the node (NVSwitch, NVLink, PCIe, shared
memory, never a NIC). Between nodes it runs device → its NIC → fabric → the destination
device's NIC → device, each piece a shortest path with ECMP (see :mod:`.routing`). Routes
through a chosen NIC of each node (a rail, as NCCL stripes its channels) are in
:mod:`.rail_routes`, whose :class:`~.rail_routes.RailRoutes` the topology inherits.

Inside, vertices are integer ids (the builder's order) and edges numpy arrays sorted by source
vertex, so a cluster of 10^5 devices is built and routed without a Python object per link; the
name-keyed views (:attr:`Topology.edges`, :attr:`Topology.edge_id`, :attr:`Topology.graph`,
…) are built on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .builder import FABRIC_CODES, LINK_KINDS, NODE_KINDS, GraphRecord, source_offsets
from .checks import builder_of
from .layout import LocalLinks, NicSet, check_nics, nics_by_node, nics_of_devices, node_counts
from .rail_routes import RailRoutes
from .routing import GraphRouter, Router, ShortestPaths, choose, flow_hash
from .tree_routes import NodeCopies, TreeRoutes

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Topology"]

_DEVICE, _NIC = NODE_KINDS.index("device"), NODE_KINDS.index("nic")


class Topology(RailRoutes):
    """A validated, frozen cluster graph with edge arrays and cached ECMP routes.

    Parameters
    ----------
    graph : nx.DiGraph or GraphRecord
        Vertices and edges as described in the module docstring: an ``nx.DiGraph`` (frozen,
        not copied), a :class:`~.registry.GraphRecord`, or a
        :class:`~.registry.GraphBuilder`'s ``graph`` (its arrays are used as they are; no
        networkx needed: :attr:`graph` builds the ``nx.DiGraph`` on first use).
    name : str
        Shown in summaries.
    router : Router, optional
        Switch-level routing for the fabric; default :class:`~.routing.GraphRouter`.

    Attributes
    ----------
    edges : list of (u, v)
        Directed edges; index = edge id.
    edge_id : dict
        ``(u, v)`` → edge id.
    edge_bandwidth_Bps, edge_latency_s : np.ndarray
        Per edge id, bytes/s and seconds (float64, read-only).
    edge_kind : tuple of str
        Per edge id, the ``link_kind``.
    devices : list
        Device vertices; index = device id, node-major (node 0's devices first).
    node_of_device : np.ndarray
        Device id → compute-node index (int64, read-only).
    devices_per_node, num_nodes, num_devices : int
    """

    def __init__(self, graph: nx.DiGraph | GraphRecord, name: str = "custom",
                 router: Router | None = None):
        builder, given = builder_of(graph)
        self._graph = None if given is None else _freeze(given)
        self._builder = builder
        self.name = name
        self._names = builder.names
        self._u, self._v, bw, lat, self._kind_code = builder.arrays()
        self._offsets = source_offsets(self._u, len(self._names))
        self.edge_bandwidth_Bps = _frozen(bw)
        self.edge_latency_s = _frozen(lat)
        self._vkind, vnode, vlocal = builder.columns()
        dev = np.flatnonzero(self._vkind == _DEVICE)
        self._dev = dev[np.lexsort((vlocal[dev], vnode[dev]))]
        self.devices = [self._names[i] for i in self._dev.tolist()]
        self.node_of_device = _frozen(vnode[self._dev], np.int64)
        self.num_devices = len(self.devices)
        self.num_nodes, self.devices_per_node = node_counts(self.node_of_device)
        self._node_nics = nics_by_node(self._vkind, vnode, self.num_nodes)
        self._dev_nics = nics_of_devices(builder, self._dev, vnode, self._node_nics)
        self._fabric = np.isin(self._vkind, FABRIC_CODES)
        self._attached: dict[int, tuple[int, ...]] = {}
        self._out: dict[int, dict[int, int]] = {}
        check_nics(self)
        self._local = ShortestPaths(LocalLinks(self, vnode), no_transit=NicSet(self._vkind),
                                    cache_size=1 << 16, pred="symmetric")
        self.router = router or GraphRouter(self._fabric_adjacency())
        self._trees = TreeRoutes.of(self)
        self._copies: NodeCopies | None | bool = False   # built on first use
        self._route = lru_cache(maxsize=1 << 18)(self._compute_route)

    # ------------------------------------------------------------------- arrays
    @property
    def attrs(self) -> dict[str, Any]:
        """The graph's attributes (``spec``, ``fabric``), without building :attr:`graph`."""
        return self._graph.graph if self._graph is not None else self._builder.attrs

    def vertex_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per vertex id: kind code (into ``NODE_KINDS``), compute node (negative where the
        vertex has none) and switch level (0 for other vertices), as int64 arrays."""
        kind, node, _ = self._builder.columns()
        level = np.zeros(len(kind), dtype=np.int64)
        for i in np.flatnonzero(kind == NODE_KINDS.index("switch")).tolist():
            level[i] = self._builder.attr("level", i)
        return kind, node, level

    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per edge id: source and target vertex ids, bytes/s and link-kind code (into
        ``LINK_KINDS``)."""
        return self._u, self._v, self.edge_bandwidth_Bps, self._kind_code

    # ------------------------------------------------------------------- name-keyed views
    @cached_property
    def graph(self) -> nx.DiGraph:
        """The cluster as a frozen ``nx.DiGraph`` (built on first use from the builder's
        arrays: routing and the network model never need it)."""
        return self._graph if self._graph is not None else _freeze(
            self._builder.graph.to_networkx())

    @cached_property
    def edges(self) -> list[tuple[Any, Any]]:
        """Directed edges as ``(u, v)`` vertex names; index = edge id."""
        names = self._names
        return [(names[a], names[b]) for a, b in zip(self._u.tolist(), self._v.tolist())]

    @cached_property
    def edge_id(self) -> dict[tuple[Any, Any], int]:
        """``(u, v)`` → edge id."""
        return {e: i for i, e in enumerate(self.edges)}

    @cached_property
    def edge_kind(self) -> tuple[str, ...]:
        """Per edge id, the ``link_kind``."""
        return tuple(LINK_KINDS[k] for k in self._kind_code.tolist())

    @cached_property
    def device_index(self) -> dict[Any, int]:
        """Device vertex → device id."""
        return {v: i for i, v in enumerate(self.devices)}

    @cached_property
    def nics_of_device(self) -> list[list[Any]]:
        """Per device id, the NIC vertices its inter-node traffic uses."""
        return [[self._names[n] for n in nics] for nics in self._dev_nics]

    @cached_property
    def nics_of_node(self) -> list[list[Any]]:
        """Per compute node, its NIC vertices in vertex order."""
        return [[self._names[n] for n in nics] for nics in self._node_nics]

    @cached_property
    def attach_of_nic(self) -> dict[Any, list[Any]]:
        """NIC vertex → the switches or routers it links to."""
        nics = np.flatnonzero(self._vkind == _NIC).tolist()
        return {self._names[n]: [self._names[w] for w in self._attach(n)] for n in nics}

    def edge_name(self, edge: int) -> tuple[Any, Any]:
        """``(u, v)`` vertex names of edge id ``edge`` (without building :attr:`edges`)."""
        return self._names[self._u[edge]], self._names[self._v[edge]]

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}: {self.num_nodes} nodes × {self.devices_per_node} "
                f"devices, {len(self._names)} vertices, {len(self._u)} edges)")

    # ------------------------------------------------------------------------------ routing
    def route(self, src_device: int, dst_device: int, flow_key: int = 0) -> tuple[int, ...]:
        """Edge ids along the route from ``src_device`` to ``dst_device`` (device ids).

        Fewest hops, ties broken by least latency, remaining ties by a stable hash of
        ``(src_device, dst_device, flow_key)``: flows with different keys spread over
        equal-cost paths like ECMP; the same arguments always give the same path. A device
        routes to itself over no edge: ``()``.
        """
        self._check_device(src_device, "src_device")
        self._check_device(dst_device, "dst_device")
        return self._route(int(src_device), int(dst_device), int(flow_key))

    def _compute_route(self, src: int, dst: int, flow_key: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        h = flow_hash(src, dst, flow_key)
        a, b = int(self._dev[src]), int(self._dev[dst])
        if self.node_of_device[src] == self.node_of_device[dst]:
            return self._edge_ids(self._local.path(a, b, h))
        nic_a = choose(self._dev_nics[src], h, 1001)
        nic_b = choose(self._dev_nics[dst], h, 1002)
        sw_a = choose(self._attach(nic_a), h, 1003)
        sw_b = choose(self._attach(nic_b), h, 1004)
        vertices = (self._local.path(a, nic_a, h) + self._fabric_path(sw_a, sw_b, h)
                    + self._local.path(nic_b, b, h))
        return self._edge_ids(vertices)

    # ---------------------------------------------------------------------- vertex ids
    def _attach(self, nic: int) -> tuple[int, ...]:
        """The switches or routers NIC vertex ``nic`` links to, in edge order."""
        got = self._attached.get(nic)
        if got is None:
            out = self._v[self._offsets[nic]:self._offsets[nic + 1]]
            got = self._attached[nic] = tuple(out[self._fabric[out]].tolist())
        return got

    def _fabric_path(self, sw_a: int, sw_b: int, h: int, dest: int | None = None) -> list[int]:
        """Switch vertex ids from ``sw_a`` to ``sw_b``: by destination where the router
        routes so (trees, for rails) and ``dest`` is given, else by the flow hash ``h``."""
        names, index = self._names, self._builder.index
        by_dest = getattr(self.router, "path_to", None) if dest is not None else None
        path = (by_dest(names[sw_a], names[sw_b], dest) if by_dest
                else self.router.path(names[sw_a], names[sw_b], h))
        return [index[s] for s in path]

    def _fabric_adjacency(self) -> dict[Any, list[tuple[Any, float]]]:
        """Successor lists (names, latencies) of the fabric's switches and routers."""
        names, fabric = self._names, np.isin(self._vkind, FABRIC_CODES)
        lat = self.edge_latency_s
        out = {}
        for s in np.flatnonzero(fabric).tolist():
            lo, hi = self._offsets[s], self._offsets[s + 1]
            out[names[s]] = [(names[w], float(lat[e])) for e, w in
                             zip(range(lo, hi), self._v[lo:hi].tolist()) if fabric[w]]
        return out

    def _edge_ids(self, vertices: Sequence[int]) -> tuple[int, ...]:
        out = []
        for a, b in zip(vertices[:-1], vertices[1:]):
            succ = self._out.get(a)
            if succ is None:
                lo, hi = int(self._offsets[a]), int(self._offsets[a + 1])
                succ = self._out[a] = {w: lo + j for j, w in enumerate(self._v[lo:hi].tolist())}
            out.append(succ[b])
        return tuple(out)

    def _check_device(self, device: int, field: str) -> None:
        if not isinstance(device, (int, np.integer)) or not 0 <= device < self.num_devices:
            raise ConfigError(f"{field} = {device!r} is not a device id; this topology has "
                              f"devices 0..{self.num_devices - 1}")

    def path_latency_s(self, edge_ids: Sequence[int]) -> float:
        """Sum of the latencies of ``edge_ids``, seconds (0 for an empty path)."""
        lat = self.edge_latency_s
        return float(sum(float(lat[e]) for e in edge_ids))

    def path_bandwidth_Bps(self, edge_ids: Sequence[int]) -> float:
        """Bottleneck bandwidth of ``edge_ids``, bytes/s (``inf`` for an empty path)."""
        if len(edge_ids) == 0:
            return math.inf
        return float(self.edge_bandwidth_Bps[list(edge_ids)].min())

    def path_vertices(self, edge_ids: Sequence[int]) -> list[Any]:
        """The vertices a path of edge ids visits, in order."""
        if len(edge_ids) == 0:
            return []
        names = self._names
        return [names[self._u[edge_ids[0]]], *(names[self._v[e]] for e in edge_ids)]


# ---------------------------------------------------------------------------------- helpers
def _frozen(values, dtype: type = np.float64) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


def _freeze(graph: nx.DiGraph) -> nx.DiGraph:
    import networkx as nx

    return nx.freeze(graph)

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
device's NIC → device, each piece a shortest path with ECMP (see :mod:`.routing`).

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
from .routing import GraphRouter, Router, ShortestPaths, flow_hash, pick
from .tree_routes import NodeCopies, TreeRoutes

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Topology"]

_DEVICE, _NIC = NODE_KINDS.index("device"), NODE_KINDS.index("nic")


class Topology:
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
        nic_a = _choose(self._dev_nics[src], h, 1001)
        nic_b = _choose(self._dev_nics[dst], h, 1002)
        sw_a = _choose(self._attach(nic_a), h, 1003)
        sw_b = _choose(self._attach(nic_b), h, 1004)
        vertices = (self._local.path(a, nic_a, h) + self._fabric_path(sw_a, sw_b, h)
                    + self._local.path(nic_b, b, h))
        return self._edge_ids(vertices)

    def route_rail(self, src_device: int, dst_device: int, rail: int) -> tuple[int, ...]:
        """Edge ids of the route from ``src_device`` to ``dst_device`` through NIC number
        ``rail`` (mod the NICs of a node) of both nodes: one channel of a collective striped
        over a node's NICs, as NCCL lays its channels over rails (each channel leaves a node
        through a different NIC, reached over the node's own fabric). Between devices of one
        node, or on a node with one NIC, this is :meth:`route`."""
        src, dst = int(src_device), int(dst_device)
        na, nb = int(self.node_of_device[src]), int(self.node_of_device[dst])
        nics_a, nics_b = self._node_nics[na], self._node_nics[nb]
        if na == nb or (len(nics_a) <= 1 and len(nics_b) <= 1):
            return self.route(src, dst, rail)
        return self._rail(src, dst, int(rail))

    def route_rail_many(self, src_devices: np.ndarray, dst_devices: np.ndarray,
                        rails: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`route_rail` of each ``(src_devices[i], dst_devices[i], rails[i])`` at
        once, as padded edge-id rows (−1 after a route's end) and route latencies (seconds),
        where the nodes are copies of node 0 under a tree fabric
        (:class:`~.tree_routes.NodeCopies`); None elsewhere (route them one by one)."""
        if self._copies is False:
            self._copies = NodeCopies.of(self)
        if self._copies is None:
            return None
        return self._copies.routes(np.asarray(src_devices, dtype=np.int64),
                                   np.asarray(dst_devices, dtype=np.int64),
                                   np.asarray(rails, dtype=np.int64))

    @lru_cache(maxsize=1 << 18)  # noqa: B019  (one topology lives as long as its routes)
    def _rail(self, src: int, dst: int, rail: int) -> tuple[int, ...]:
        h = flow_hash(src, dst, rail)
        na, nb = int(self.node_of_device[src]), int(self.node_of_device[dst])
        nics_a, nics_b = self._node_nics[na], self._node_nics[nb]
        nic_a, nic_b = nics_a[rail % len(nics_a)], nics_b[rail % len(nics_b)]
        sw_a = _choose(self._attach(nic_a), h, 1003)
        sw_b = _choose(self._attach(nic_b), h, 1004)
        dest = nb * len(nics_b) + rail % len(nics_b)
        vertices = (self._local.path(int(self._dev[src]), nic_a, h)
                    + self._fabric_path(sw_a, sw_b, h, dest)
                    + self._local.path(nic_b, int(self._dev[dst]), h))
        return self._edge_ids(vertices)

    @cached_property
    def p2p_rail_table(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`p2p_rails` of every device as arrays: (devices × most rails) rail ids,
        padded with −1, and the count per device (:func:`.p2p.rail_table`)."""
        from .p2p import rail_table
        return rail_table(self)

    def p2p_rails(self, dst_device: int) -> tuple[int, ...]:
        """The rails (NIC positions in :attr:`nics_of_node`) a point-to-point transfer to
        ``dst_device`` from another node crosses, as NCCL picks them for send/recv
        (:func:`.p2p.rails_of`, which gives NCCL's rule and its sources)."""
        from .p2p import rails_of
        return rails_of(self, dst_device)

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def rail_fabric_route(self, src_node: int, dst_node: int, rail: int) -> tuple[int, ...]:
        """Edge ids from NIC ``rail`` of compute node ``src_node`` to NIC ``rail`` of
        ``dst_node`` (NIC → fabric → NIC, the part of :meth:`route_rail` outside the nodes)."""
        nics_a, nics_b = self._node_nics[src_node], self._node_nics[dst_node]
        nic_a, nic_b = nics_a[rail % len(nics_a)], nics_b[rail % len(nics_b)]
        up_a, up_b = self._attach(nic_a), self._attach(nic_b)
        by_dest = getattr(self.router, "path_to", None)
        # the flow hash only breaks ties: none when each NIC has one switch and trees route
        # by destination (most clusters), so skip computing it then
        h = (flow_hash(src_node, dst_node, rail)
             if len(up_a) > 1 or len(up_b) > 1 or not by_dest else 0)
        sw_a, sw_b = _choose(up_a, h, 1003), _choose(up_b, h, 1004)
        dest = dst_node * len(nics_b) + rail % len(nics_b)
        return self._edge_ids([nic_a, *self._fabric_path(sw_a, sw_b, h, dest), nic_b])

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def rail_stripes(self, src_node: int, dst_node: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The :meth:`rail_fabric_route` of every rail of ``src_node`` (one when it has no
        NIC), flat: (edge ids of rail 0's route, then rail 1's, …; edges per route; the
        largest route latency, seconds). Arrays read-only."""
        rails = max(1, len(self._node_nics[src_node]))
        routes = [self.rail_fabric_route(src_node, dst_node, c) for c in range(rails)]
        edges = _frozen([e for r in routes for e in r], np.int64)
        lengths = _frozen([len(r) for r in routes], np.int64)
        return edges, lengths, max(self.path_latency_s(r) for r in routes)

    def rail_stripes_flat(self, src_nodes: np.ndarray, dst_nodes: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`rail_stripes` of each pair ``(src_nodes[i], dst_nodes[i])`` (compute node
        ids) flat: edge ids, edges per route, routes per pair and each pair's largest route
        latency (seconds); all pairs at once where the fabric is a tree
        (:class:`~.tree_routes.TreeRoutes`)."""
        if self._trees is not None:
            return self._trees.stripes(src_nodes, dst_nodes)
        got = [self.rail_stripes(a, b) for a, b in zip(np.asarray(src_nodes).tolist(),
                                                        np.asarray(dst_nodes).tolist())]
        return _flat_routes([g[0] for g in got], [g[1] for g in got],
                            [g[2] for g in got])

    def rail_routes_flat(self, src_nodes: np.ndarray, dst_nodes: np.ndarray,
                         rails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`rail_fabric_route` of each ``(src_nodes[i], dst_nodes[i], rails[i])``
        flat: edge ids, route after route, and edges per route."""
        if self._trees is not None:
            return self._trees.routes(np.asarray(src_nodes, dtype=np.int64),
                                      np.asarray(dst_nodes, dtype=np.int64),
                                      np.asarray(rails, dtype=np.int64))[:2]
        routes = [self.rail_fabric_route(a, b, c) for a, b, c in
                  zip(*(np.asarray(x).tolist() for x in (src_nodes, dst_nodes, rails)))]
        return (np.fromiter((e for r in routes for e in r), dtype=np.int64),
                np.fromiter((len(r) for r in routes), dtype=np.int64, count=len(routes)))

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
def _flat_routes(edges: list, lengths: list, latency: list) -> tuple[np.ndarray, ...]:
    return (np.concatenate(edges), np.concatenate(lengths),
            np.array([len(n) for n in lengths], dtype=np.int64), np.array(latency))


def _frozen(values, dtype: type = np.float64) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


def _choose(options: Sequence, h: int, salt: int) -> Any:
    return options[pick(h, salt, len(options))]


def _freeze(graph: nx.DiGraph) -> nx.DiGraph:
    import networkx as nx

    return nx.freeze(graph)

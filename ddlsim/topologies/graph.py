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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .registry import FABRIC_KINDS, LINK_KINDS, NODE_KINDS, NODE_LOCAL_KINDS, GraphRecord
from .routing import GraphRouter, Router, ShortestPaths, flow_hash, pick

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Topology"]


class Topology:
    """A validated, frozen cluster graph with edge arrays and cached ECMP routes.

    Parameters
    ----------
    graph : nx.DiGraph or GraphRecord
        Vertices and edges as described in the module docstring: an ``nx.DiGraph`` (frozen,
        not copied) or the builders' :class:`~.registry.GraphRecord` (no networkx needed;
        :attr:`graph` builds the ``nx.DiGraph`` on first use).
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
        record = _record_of(graph)
        _validate_graph(record)
        self._graph = None if graph is record else _freeze(graph)
        self._record = record
        self.name = name
        data = [(u, v, a) for u, out in record.succ.items() for v, a in out.items()]
        self.edges: list[tuple[Any, Any]] = [(u, v) for u, v, _ in data]
        self.edge_id = {e: i for i, e in enumerate(self.edges)}
        self.edge_bandwidth_Bps = _frozen([a["bandwidth_Bps"] for _, _, a in data])
        self.edge_latency_s = _frozen([a["latency_s"] for _, _, a in data])
        self.edge_kind = tuple(a["link_kind"] for _, _, a in data)
        self._latency_list = self.edge_latency_s.tolist()
        nodes = record.nodes
        self.devices = sorted((v for v, a in nodes.items() if a["kind"] == "device"),
                              key=lambda v: (nodes[v]["node"], nodes[v]["local"]))
        self.device_index = {v: i for i, v in enumerate(self.devices)}
        self.node_of_device = _frozen([nodes[v]["node"] for v in self.devices], np.int64)
        self.num_devices = len(self.devices)
        self.num_nodes, self.devices_per_node = _node_counts(self.node_of_device)
        self.nics_of_device = _nics_of_devices(record, self.devices)
        self.attach_of_nic = _attachments(record)
        self.nics_of_node = _nics_by_node(record, self.num_nodes)
        _check_nics(self)
        self._local = ShortestPaths(_adjacency(record, local=True),
                                    no_transit=self.attach_of_nic, cache_size=1 << 16)
        self.router = router or GraphRouter(_adjacency(record, local=False))
        self._route = lru_cache(maxsize=1 << 18)(self._compute_route)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The cluster as a frozen ``nx.DiGraph`` (built on first use from the builders'
        record: routing and the network model never need it)."""
        return self._graph if self._graph is not None else _freeze(self._record.to_networkx())

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}: {self.num_nodes} nodes × {self.devices_per_node} "
                f"devices, {len(self._record.nodes)} vertices, {len(self.edges)} edges)")

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
        a, b = self.devices[src], self.devices[dst]
        if self.node_of_device[src] == self.node_of_device[dst]:
            return self._edge_ids(self._local.path(a, b, h))
        nic_a = _choose(self.nics_of_device[src], h, 1001)
        nic_b = _choose(self.nics_of_device[dst], h, 1002)
        sw_a = _choose(self.attach_of_nic[nic_a], h, 1003)
        sw_b = _choose(self.attach_of_nic[nic_b], h, 1004)
        vertices = (self._local.path(a, nic_a, h) + self.router.path(sw_a, sw_b, h)
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
        nics_a, nics_b = self.nics_of_node[na], self.nics_of_node[nb]
        if na == nb or (len(nics_a) <= 1 and len(nics_b) <= 1):
            return self.route(src, dst, rail)
        return self._rail(src, dst, int(rail))

    @lru_cache(maxsize=1 << 18)  # noqa: B019  (one topology lives as long as its routes)
    def _rail(self, src: int, dst: int, rail: int) -> tuple[int, ...]:
        h = flow_hash(src, dst, rail)
        na, nb = int(self.node_of_device[src]), int(self.node_of_device[dst])
        nic_a = self.nics_of_node[na][rail % len(self.nics_of_node[na])]
        nic_b = self.nics_of_node[nb][rail % len(self.nics_of_node[nb])]
        sw_a = _choose(self.attach_of_nic[nic_a], h, 1003)
        sw_b = _choose(self.attach_of_nic[nic_b], h, 1004)
        by_dest = getattr(self.router, "path_to", None)  # trees route rails by destination
        dest = nb * len(self.nics_of_node[nb]) + rail % len(self.nics_of_node[nb])
        fabric = by_dest(sw_a, sw_b, dest) if by_dest else self.router.path(sw_a, sw_b, h)
        vertices = (self._local.path(self.devices[src], nic_a, h) + fabric
                    + self._local.path(nic_b, self.devices[dst], h))
        return self._edge_ids(vertices)

    @cached_property
    def p2p_rail_table(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`p2p_rails` of every device as arrays: (devices × most rails) rail ids,
        padded with −1, and the count per device."""
        rails = [self.p2p_rails(d) for d in range(self.num_devices)]
        width = max((len(r) for r in rails), default=1)
        table = np.full((self.num_devices, width), -1, dtype=np.int64)
        for d, r in enumerate(rails):
            table[d, :len(r)] = r
        return table, np.array([len(r) for r in rails], dtype=np.int64)

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def p2p_rails(self, dst_device: int) -> tuple[int, ...]:
        """The rails (NIC positions in :attr:`nics_of_node`) a point-to-point transfer to
        ``dst_device`` from another node crosses, as NCCL picks them for send/recv.

        NCCL runs a send/recv between nodes on the NIC local to a GPU (``ncclTopoGetNetDev``
        with no collective graph → ``ncclTopoGetLocalNet``, NCCL ``src/graph/search.cc`` and
        ``topo.cc``), not striped over every NIC of the node as a collective's channels
        are. With PXN (on by default since NCCL 2.12) the sender goes over NVLink to the GPU
        with the receiver's local index and out through that GPU's NIC, so both ends use the
        receiver's rail. The NICs local to a GPU are shared among the GPUs local to them,
        each using ``⌈NICs / GPUs⌉`` of them (``NCCL_NETDEVS_POLICY=AUTO``). NCCL 2.9 (2021,
        no PXN) did the same from the sender's side: one of the NICs closest to the sender,
        picked round-robin by the receiver's device index (``src/transport/net.cc``,
        ``ncclTopoGetLocalNet`` in ``src/graph/topo.cc``), the same rail whenever sender and
        receiver have the same local index, as in Megatron's pipelines. A node with no NIC
        gives ``(0,)``."""
        node = int(self.node_of_device[dst_device])
        nics = self.nics_of_node[node]
        local = list(self.nics_of_device[dst_device])
        if not nics or not local:
            return (0,)
        sharers = [d for d in np.flatnonzero(self.node_of_device == node).tolist()
                   if list(self.nics_of_device[d]) == local]
        each = -(-len(local) // len(sharers))
        first = sharers.index(dst_device) * each
        chosen = [local[(first + i) % len(local)] for i in range(each)]
        return tuple(sorted({nics.index(n) for n in chosen}))

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def rail_fabric_route(self, src_node: int, dst_node: int, rail: int) -> tuple[int, ...]:
        """Edge ids from NIC ``rail`` of compute node ``src_node`` to NIC ``rail`` of
        ``dst_node`` (NIC → fabric → NIC, the part of :meth:`route_rail` outside the nodes)."""
        nics_a, nics_b = self.nics_of_node[src_node], self.nics_of_node[dst_node]
        nic_a, nic_b = nics_a[rail % len(nics_a)], nics_b[rail % len(nics_b)]
        up_a, up_b = self.attach_of_nic[nic_a], self.attach_of_nic[nic_b]
        by_dest = getattr(self.router, "path_to", None)
        # the flow hash only breaks ties: none when each NIC has one switch and trees route
        # by destination (most clusters), so skip computing it then
        h = (flow_hash(src_node, dst_node, rail)
             if len(up_a) > 1 or len(up_b) > 1 or not by_dest else 0)
        sw_a, sw_b = _choose(up_a, h, 1003), _choose(up_b, h, 1004)
        dest = dst_node * len(nics_b) + rail % len(nics_b)
        fabric = by_dest(sw_a, sw_b, dest) if by_dest else self.router.path(sw_a, sw_b, h)
        return self._edge_ids([nic_a, *fabric, nic_b])

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def rail_stripes(self, src_node: int, dst_node: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The :meth:`rail_fabric_route` of every rail of ``src_node`` (one when it has no
        NIC), flat: (edge ids of rail 0's route, then rail 1's, …; edges per route; the
        largest route latency, seconds). Arrays read-only."""
        rails = max(1, len(self.nics_of_node[src_node]))
        routes = [self.rail_fabric_route(src_node, dst_node, c) for c in range(rails)]
        edges = _frozen([e for r in routes for e in r], np.int64)
        lengths = _frozen([len(r) for r in routes], np.int64)
        return edges, lengths, max(self.path_latency_s(r) for r in routes)

    def _edge_ids(self, vertices: Sequence[Any]) -> tuple[int, ...]:
        edge_id = self.edge_id
        return tuple(edge_id[e] for e in zip(vertices[:-1], vertices[1:]))

    def _check_device(self, device: int, field: str) -> None:
        if not isinstance(device, (int, np.integer)) or not 0 <= device < self.num_devices:
            raise ConfigError(f"{field} = {device!r} is not a device id; this topology has "
                              f"devices 0..{self.num_devices - 1}")

    def path_latency_s(self, edge_ids: Sequence[int]) -> float:
        """Sum of the latencies of ``edge_ids``, seconds (0 for an empty path)."""
        lat = self._latency_list
        return float(sum(lat[e] for e in edge_ids))

    def path_bandwidth_Bps(self, edge_ids: Sequence[int]) -> float:
        """Bottleneck bandwidth of ``edge_ids``, bytes/s (``inf`` for an empty path)."""
        if len(edge_ids) == 0:
            return math.inf
        return float(self.edge_bandwidth_Bps[list(edge_ids)].min())

    def path_vertices(self, edge_ids: Sequence[int]) -> list[Any]:
        """The vertices a path of edge ids visits, in order."""
        if len(edge_ids) == 0:
            return []
        return [self.edges[edge_ids[0]][0], *(self.edges[e][1] for e in edge_ids)]


# ---------------------------------------------------------------------------------- helpers
def _frozen(values: list, dtype: type = np.float64) -> np.ndarray:
    array = np.asarray(values, dtype=dtype)
    array.flags.writeable = False
    return array


def _choose(options: list, h: int, salt: int) -> Any:
    return options[pick(h, salt, len(options))]


def _node_counts(node_of_device: np.ndarray) -> tuple[int, int]:
    nodes, counts = np.unique(node_of_device, return_counts=True)
    if not np.array_equal(nodes, np.arange(len(nodes))):
        raise ConfigError(f"device 'node' attributes must number the compute nodes 0..N-1; "
                          f"got {nodes.tolist()}")
    if len(set(counts.tolist())) != 1:
        raise ConfigError(f"every compute node must hold the same number of devices; got "
                          f"{dict(zip(nodes.tolist(), counts.tolist()))}")
    return len(nodes), int(counts[0])


def _freeze(graph: nx.DiGraph) -> nx.DiGraph:
    import networkx as nx

    return nx.freeze(graph)


def _record_of(graph: Any) -> GraphRecord:
    """``graph`` itself, or an ``nx.DiGraph``'s vertices and edges as a :class:`GraphRecord`
    (its own attribute dicts, in its order)."""
    if isinstance(graph, GraphRecord):
        return graph
    import networkx as nx

    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise ConfigError(f"a topology graph must be an nx.DiGraph; got {type(graph).__name__}")
    record = GraphRecord()
    record.graph = graph.graph
    record.nodes = dict(graph.nodes(data=True))
    record.succ = {v: dict(out) for v, out in graph.succ.items()}
    return record


def _nics_of_devices(graph: GraphRecord, devices: list[Any]) -> list[list[Any]]:
    """Each device's ``nics`` attribute, else every NIC of its node (in vertex order)."""
    by_node: dict[int, list[Any]] = {}
    for v, attrs in graph.nodes.items():
        if attrs["kind"] == "nic":
            by_node.setdefault(attrs["node"], []).append(v)
    nodes = graph.nodes
    return [list(nodes[d]["nics"]) if "nics" in nodes[d] else by_node.get(nodes[d]["node"], [])
            for d in devices]


def _nics_by_node(graph: GraphRecord, num_nodes: int) -> list[list[Any]]:
    """NIC vertices of every compute node, in vertex order."""
    out: list[list[Any]] = [[] for _ in range(num_nodes)]
    for v, attrs in graph.nodes.items():
        if attrs["kind"] == "nic":
            out[attrs["node"]].append(v)
    return out


def _attachments(graph: GraphRecord) -> dict[Any, list[Any]]:
    """NIC → the switches or routers it links to."""
    nodes = graph.nodes
    return {v: [w for w in graph.succ[v] if nodes[w]["kind"] in FABRIC_KINDS]
            for v, attrs in nodes.items() if attrs["kind"] == "nic"}


def _check_nics(topo: Topology) -> None:
    if topo.num_nodes == 1:
        return
    for d, nics in enumerate(topo.nics_of_device):
        if not nics:
            raise ConfigError(f"device {topo.devices[d]!r} has no NIC; with "
                              f"{topo.num_nodes} nodes every device needs one to leave its node")
        for nic in nics:
            if not topo.attach_of_nic.get(nic):
                raise ConfigError(f"NIC {nic!r} is not linked to any switch or router")


def _adjacency(graph: GraphRecord, *, local: bool) -> dict[Any, list[tuple[Any, float]]]:
    """Successor lists of the node-internal edges (``local``) or of the fabric edges."""
    kinds = NODE_LOCAL_KINDS if local else FABRIC_KINDS
    nodes = graph.nodes
    succ: dict[Any, list[tuple[Any, float]]] = {}
    for v, attrs in nodes.items():
        if attrs["kind"] not in kinds:
            continue
        succ[v] = [(w, a["latency_s"]) for w, a in graph.succ[v].items()
                   if nodes[w]["kind"] in kinds
                   and (not local or nodes[w].get("node") == attrs.get("node"))]
    return succ


def _validate_graph(graph: GraphRecord) -> None:
    """Raise :class:`ConfigError` naming the first vertex or edge that breaks the model."""
    for v, attrs in graph.nodes.items():
        _validate_vertex(v, attrs)
    succ = graph.succ
    for u, out in succ.items():
        for v, attrs in out.items():
            _validate_edge(u, v, attrs)
            if u not in succ.get(v, ()):
                raise ConfigError(f"edge ({u!r}, {v!r}) has no reverse edge; every link is "
                                  "full duplex: add both directions")
    if not any(a["kind"] == "device" for a in graph.nodes.values()):
        raise ConfigError("the topology has no vertex of kind 'device'")
    if len(_reachable(succ, next(iter(succ)))) < len(graph.nodes):
        # every link is two edges, so reaching every vertex from one is strong connectivity
        import networkx as nx

        parts = sorted(nx.strongly_connected_components(graph.to_networkx()), key=len)
        raise ConfigError(f"the topology is not connected: {len(parts)} parts, e.g. "
                          f"{sorted(map(str, parts[0]))[:5]} cannot reach the rest")


def _reachable(succ: dict[Any, dict], start: Any) -> set:
    """Vertices reachable from ``start`` (breadth first)."""
    seen, queue = {start}, deque([start])
    while queue:
        for w in succ[queue.popleft()]:
            if w not in seen:
                seen.add(w)
                queue.append(w)
    return seen


def _validate_vertex(v: Any, attrs: dict) -> None:
    kind = attrs.get("kind")
    if kind not in NODE_KINDS:
        raise ConfigError(f"vertex {v!r} has kind = {kind!r}; allowed: {', '.join(NODE_KINDS)}")
    if kind in NODE_LOCAL_KINDS and not isinstance(attrs.get("node"), int):
        raise ConfigError(f"vertex {v!r} (kind {kind!r}) needs an integer 'node' attribute "
                          f"(its compute node); got {attrs.get('node')!r}")
    if kind == "device" and not isinstance(attrs.get("local"), int):
        raise ConfigError(f"device {v!r} needs an integer 'local' attribute (its index in the "
                          f"node); got {attrs.get('local')!r}")
    if kind == "switch" and attrs.get("level") not in (1, 2, 3):
        raise ConfigError(f"switch {v!r} has level = {attrs.get('level')!r}; allowed: "
                          "1 (leaf), 2 (spine/aggregation), 3 (core)")


def _validate_edge(u: Any, v: Any, attrs: dict) -> None:
    bw, lat, kind = attrs.get("bandwidth_Bps"), attrs.get("latency_s"), attrs.get("link_kind")
    if not isinstance(bw, (int, float)) or not 0 < bw < math.inf:
        raise ConfigError(f"edge ({u!r}, {v!r}) has bandwidth_Bps = {bw!r}; it must be a finite "
                          "number > 0 (bytes/s)")
    if not isinstance(lat, (int, float)) or not 0 <= lat < math.inf:
        raise ConfigError(f"edge ({u!r}, {v!r}) has latency_s = {lat!r}; it must be a finite "
                          "number >= 0 (seconds)")
    if kind not in LINK_KINDS:
        raise ConfigError(f"edge ({u!r}, {v!r}) has link_kind = {kind!r}; allowed: "
                          f"{', '.join(LINK_KINDS)}")

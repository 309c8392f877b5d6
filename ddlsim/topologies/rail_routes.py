"""Routes striped over a node's NICs (rails), as NCCL lays a collective's channels and a
point-to-point transfer's connections over them: one rail's route between devices
(:meth:`RailRoutes.route_rail`), NIC-to-NIC routes through the fabric
(:meth:`RailRoutes.rail_fabric_route`), every rail of a pair of nodes at once
(:meth:`RailRoutes.rail_stripes`), and their flat arrays for many pairs, all at once where the
fabric is a tree (:mod:`.tree_routes`)."""

from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from .routing import Router, choose, flow_hash
from .tree_routes import NodeCopies, TreeRoutes

__all__ = ["RailRoutes"]


class RailRoutes:
    """The rail routes of :class:`~.graph.Topology`, which sets what they read (declared
    below) and finds the pieces of a route (its ``_attach``, ``_fabric_path``, ``_edge_ids``,
    ``route`` and ``path_latency_s``)."""

    #: device id → its vertex id
    _dev: np.ndarray
    #: device id → compute-node index
    node_of_device: np.ndarray
    #: per compute node, its NIC vertex ids
    _node_nics: list[tuple[int, ...]]
    #: node-local shortest paths (vertex ids)
    _local: Any
    #: switch-level routing of the fabric
    router: Router
    #: every route at once where the fabric is a tree, else None
    _trees: TreeRoutes | None
    #: node copies of node 0 under a tree fabric; False until first asked for
    _copies: NodeCopies | None | bool

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
        sw_a = choose(self._attach(nic_a), h, 1003)
        sw_b = choose(self._attach(nic_b), h, 1004)
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
        sw_a, sw_b = choose(up_a, h, 1003), choose(up_b, h, 1004)
        dest = dst_node * len(nics_b) + rail % len(nics_b)
        return self._edge_ids([nic_a, *self._fabric_path(sw_a, sw_b, h, dest), nic_b])

    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def rail_stripes(self, src_node: int, dst_node: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The :meth:`rail_fabric_route` of every rail of ``src_node`` (one when it has no
        NIC), flat: (edge ids of rail 0's route, then rail 1's, …; edges per route; the
        largest route latency, seconds). Arrays read-only."""
        rails = max(1, len(self._node_nics[src_node]))
        routes = [self.rail_fabric_route(src_node, dst_node, c) for c in range(rails)]
        edges = _read_only([e for r in routes for e in r], np.int64)
        lengths = _read_only([len(r) for r in routes], np.int64)
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


def _flat_routes(edges: list, lengths: list, latency: list) -> tuple[np.ndarray, ...]:
    return (np.concatenate(edges), np.concatenate(lengths),
            np.array([len(n) for n in lengths], dtype=np.int64), np.array(latency))


def _read_only(values, dtype: type) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array

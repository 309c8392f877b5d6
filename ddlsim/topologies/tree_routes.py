"""Rail routes through a tree fabric for many node pairs at once, as numpy arrays.

:meth:`.graph.Topology.rail_fabric_route` routes one NIC-to-NIC rail at a time through the
fabric's router; a cluster of 16,384 nodes asks for ~10^5 of them per group family. Where the
fabric is one of :mod:`.fabrics`' trees (a :class:`~.routing.TreeRouter`, which routes rails by
destination: D-mod-k) and every NIC hangs off one switch, the route is a closed form of the
pair and the rail, evaluated here for all of them together: the same edges and the same
latency sums (added hop by hop in route order) as the one-at-a-time method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .routing import TreeRouter

if TYPE_CHECKING:
    from .graph import Topology

__all__ = ["TreeRoutes"]


class TreeRoutes:
    """The tree fabric of a :class:`~.graph.Topology` as id arrays (build with :meth:`of`)."""

    def __init__(self, topo: Topology, nic: np.ndarray, leaf: np.ndarray, router: TreeRouter):
        self._topo = topo
        self.nic, self.leaf = nic, leaf          # (nodes × rails) vertex ids
        index = topo._builder.index
        self.spines = np.array([index[s] for s in router.spines], dtype=np.int64)
        pods = np.full(len(topo._names), -1, dtype=np.int64)
        for name, pod in router.pod_of_leaf.items():
            pods[index[name]] = pod
        self.pod = pods
        self.aggs = np.array([[index[s] for s in row] for row in router.aggs], dtype=np.int64)
        self.cores = np.array([[index[s] for s in row] for row in router.cores], dtype=np.int64)
        self._keys: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(cls, topo: Topology) -> TreeRoutes | None:
        """The arrays of ``topo``'s fabric, or None where it is not such a tree (another
        router, nodes with different NIC counts, a NIC on several switches or none, pods of
        different sizes)."""
        router = topo.router
        if type(router) is not TreeRouter or topo.num_nodes < 2:
            return None
        rails = {len(n) for n in topo._node_nics}
        if len(rails) != 1 or 0 in rails:
            return None
        nic = np.array(topo._node_nics, dtype=np.int64)
        up = topo._fabric[topo._v] & (topo._vkind[topo._u] == topo._vkind[nic[0, 0]])
        switches = np.bincount(topo._u[up], minlength=len(topo._names))
        if (switches[nic] != 1).any():
            return None
        if len({len(r) for r in router.aggs}) > 1 or len({len(r) for r in router.cores}) > 1:
            return None
        leaf_of = np.full(len(topo._names), -1, dtype=np.int64)
        leaf_of[topo._u[up]] = topo._v[up]
        return cls(topo, nic, leaf_of[nic], router)

    def routes(self, src: np.ndarray, dst: np.ndarray, rail: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Edge ids (flat, route after route), edges per route and latency per route
        (seconds) of :meth:`~.graph.Topology.rail_fabric_route` ``(src[i], dst[i],
        rail[i])``."""
        k = self.nic.shape[1]
        c = rail % k
        nic_a, nic_b = self.nic[src, c], self.nic[dst, c]
        sw_a, sw_b = self.leaf[src, c], self.leaf[dst, c]
        dest = dst * k + c
        hops = self._switch_paths(sw_a, sw_b, dest)          # rows × up to 5 switches
        vertices = np.concatenate([nic_a[:, None], hops, np.full((len(c), 1), -1)], axis=1)
        width = (hops >= 0).sum(axis=1)
        vertices[np.arange(len(c)), width + 1] = nic_b        # NIC, switches…, NIC
        edges = self._edge_ids(vertices[:, :-1], vertices[:, 1:])
        lat_of = self._topo.edge_latency_s
        latency = np.zeros(len(c))
        for col in range(edges.shape[1]):                     # in route order, as sum() adds
            e = edges[:, col]
            latency = latency + np.where(e >= 0, lat_of[np.maximum(e, 0)], 0.0)
        flat = edges[edges >= 0]                              # row-major: route by route
        return flat, width + 1, latency

    def stripes(self, src_nodes: np.ndarray, dst_nodes: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`~.graph.Topology.rail_stripes` of each pair, flat: edge ids, edges per
        route, routes per pair (the rails) and each pair's largest route latency."""
        k = self.nic.shape[1]
        src = np.repeat(np.asarray(src_nodes, dtype=np.int64), k)
        dst = np.repeat(np.asarray(dst_nodes, dtype=np.int64), k)
        rail = np.tile(np.arange(k, dtype=np.int64), len(src_nodes))
        flat, lengths, latency = self.routes(src, dst, rail)
        return (flat, lengths, np.full(len(src_nodes), k, dtype=np.int64),
                latency.reshape(-1, k).max(axis=1))

    def _switch_paths(self, sw_a: np.ndarray, sw_b: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """:meth:`~.routing.TreeRouter.path_to` of each row as switch ids, padded with −1."""
        out = np.full((len(sw_a), 5), -1, dtype=np.int64)
        out[:, 0] = sw_a
        same = sw_a == sw_b
        if not len(self.aggs):            # one switch, or leaves under spines
            if len(self.spines):
                out[~same, 1] = self.spines[dest[~same] % len(self.spines)]
                out[~same, 2] = sw_b[~same]
            return out
        pod_a, pod_b = self.pod[sw_a], self.pod[sw_b]
        u = self.aggs.shape[1]
        j = dest % u
        near = ~same & (pod_a == pod_b)
        out[near, 1] = self.aggs[pod_a[near], j[near]]
        out[near, 2] = sw_b[near]
        far = ~same & (pod_a != pod_b)
        core = self.cores[j[far], (dest[far] // u) % self.cores.shape[1]]
        out[far, 1] = self.aggs[pod_a[far], j[far]]
        out[far, 2] = core
        out[far, 3] = self.aggs[pod_b[far], j[far]]
        out[far, 4] = sw_b[far]
        return out

    def _edge_ids(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Edge id of each ``a → b`` (−1 where ``b`` is −1)."""
        topo = self._topo
        if self._keys is None:
            key = topo._u * len(topo._names) + topo._v
            order = np.argsort(key, kind="stable")
            self._keys = (key[order], order)
        keys, order = self._keys
        want = a * len(topo._names) + b
        at = np.searchsorted(keys, want)
        return np.where(b >= 0, order[np.minimum(at, len(keys) - 1)], -1)

"""Rail routes through a tree fabric for many node pairs at once, as numpy arrays.

:meth:`.graph.Topology.rail_fabric_route` routes one NIC-to-NIC rail at a time through the
fabric's router; a cluster of 16,384 nodes asks for ~10^5 of them per group family. Where the
fabric is one of :mod:`.fabrics`' trees (a :class:`~.routing.TreeRouter`, which routes rails by
destination: D-mod-k) and every NIC hangs off one switch, the route is a closed form of the
pair and the rail, evaluated here for all of them together: the same edges and the same
latency sums (added hop by hop in route order) as the one-at-a-time method.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from .builder import NODE_KINDS
from .routing import TreeRouter

if TYPE_CHECKING:
    from .graph import Topology

__all__ = ["TreeRoutes", "cache_clear"]

_NIC = NODE_KINDS.index("nic")
#: the route tables :meth:`TreeRoutes.routes` remembers per topology: a search grid's pipeline
#: family routes its ring step's node pairs twice, for its fair shares and for its
#: point-to-point rails, with other families' routes in between (20 of a speed grid's 79
#: calls, 30 % of their rows, on 2026-11-30)
_ROUTES_MAX = 64
#: every :class:`TreeRoutes`, for :func:`cache_clear`
_LIVE: weakref.WeakSet = weakref.WeakSet()


def cache_clear() -> None:
    """Forget the routes every :class:`TreeRoutes` remembers (for timing a cold run)."""
    for trees in list(_LIVE):
        trees._memo.clear()


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
        self._hops: dict[str, np.ndarray] | None = None
        #: (the arguments' bytes) -> the arrays of :meth:`routes`, oldest out first
        self._memo: dict[tuple[bytes, ...], tuple] = {}
        _LIVE.add(self)

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
        rail[i])``: NIC → leaf (→ spine, or → aggregation (→ core → aggregation)) → leaf →
        NIC, the up-ports chosen by the destination as :meth:`~.routing.TreeRouter.path_to`
        chooses them. The arrays of the last :data:`_ROUTES_MAX` distinct calls are kept
        (read-only) and returned again for the same arguments: a family's stripes and its
        point-to-point rails often route the same pairs."""
        key = tuple(np.ascontiguousarray(x, dtype=np.int64).tobytes() for x in (src, dst, rail))
        got = self._memo.get(key)
        if got is None:
            got = self._routes(src, dst, rail)
            for a in got:
                a.setflags(write=False)
            if len(self._memo) >= _ROUTES_MAX:
                del self._memo[next(iter(self._memo))]
            self._memo[key] = got
        return got

    def _routes(self, src: np.ndarray, dst: np.ndarray, rail: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = self._tables()
        k = self.nic.shape[1]
        c = rail % k
        at_a, dest = src * k + c, dst * k + c     # (node, rail) positions, flat
        ix_a, ix_b = t["leaf_at"][at_a], t["leaf_at"][dest]
        n = len(c)
        # the widest route: NIC, leaf, (aggregation, core, aggregation,) leaf, NIC; the
        # columns no route reaches would add edge −1's 0 to every latency below
        edges = np.empty((n, 6 if "up2" in t else 4), dtype=np.int64)
        edges.fill(-1)
        edges[:, 0] = t["nic_up"].ravel()[at_a]
        same = ix_a == ix_b
        last = np.where(same, 1, 3)                           # the column of leaf → NIC
        ports = t["up1"].shape[1]
        if ports:
            # the routes that leave their leaf, by position (taken once, used for each hop);
            # up-port j of leaf i is row i, column j of the tables, flat at i·ports + j
            up = (~same).nonzero()[0]
            j = dest[up] % ports
            a, b = ix_a[up] * ports + j, ix_b[up] * ports + j
            edges[up, 1] = t["up1"].ravel()[a]
            down = t["down1"].ravel()[b]
            if "up2" in t:   # a route between pods (never one under one leaf) crosses a core
                sw_a, sw_b = self.leaf.ravel()[at_a[up]], self.leaf.ravel()[dest[up]]
                cross = (self.pod[sw_a] != self.pod[sw_b]).nonzero()[0]
                far, jf = up[cross], j[cross]
                ci = (dest[far] // ports) % t["up2"].shape[1]
                edges[far, 2] = t["up2"][t["agg_ix"][self.aggs[self.pod[sw_a[cross]], jf]], ci]
                edges[far, 3] = t["down2"][t["agg_ix"][self.aggs[self.pod[sw_b[cross]], jf]], ci]
                last[far] = 5
                edges[up, last[up] - 1] = down
            else:
                edges[up, 2] = down
        width = edges.shape[1]
        edges.ravel()[np.arange(0, n * width, width) + last] = t["nic_down"].ravel()[dest]
        lat = t["latency"][edges]                             # edge −1: none, adds 0
        latency = np.zeros(n)
        for col in range(width):                              # in route order, as sum() adds
            latency += lat[:, col]
        return edges[edges >= 0], last + 1, latency

    def _tables(self) -> dict[str, np.ndarray]:
        """Edge ids of every hop a route can take, by position: NIC ↔ its leaf (nodes ×
        rails), leaf ↔ its up-port j (leaves × ports), aggregation ↔ core c of its plane
        (aggregation switches × cores), and each edge's latency (seconds; edge −1's 0 last);
        built once (the topology's arrays are frozen). Tables by (node, rail) are also
        read flat, at ``node · rails + rail`` (``leaf_at``: the index of the NIC's leaf)."""
        if self._hops is not None:
            return self._hops
        keys = _sorted_keys(self._topo)
        t: dict[str, np.ndarray] = {"nic_up": self._edge_ids(self.nic, self.leaf, keys),
                                    "nic_down": self._edge_ids(self.leaf, self.nic, keys)}
        leaves = np.unique(self.leaf)
        t["leaf_ix"] = np.full(len(self.pod), -1, dtype=np.int64)
        t["leaf_ix"][leaves] = np.arange(len(leaves))
        t["leaf_at"] = t["leaf_ix"][self.leaf].ravel()       # per (node, rail), flat
        ups = (self.aggs[self.pod[leaves]] if len(self.aggs)
               else np.broadcast_to(self.spines, (len(leaves), len(self.spines))))
        t["up1"] = self._edge_ids(np.broadcast_to(leaves[:, None], ups.shape), ups, keys)
        t["down1"] = self._edge_ids(ups, np.broadcast_to(leaves[:, None], ups.shape), keys)
        if len(self.aggs):
            aggs = self.aggs.ravel()
            t["agg_ix"] = np.full(len(self.pod), -1, dtype=np.int64)
            t["agg_ix"][aggs] = np.arange(len(aggs))
            cores = self.cores[np.tile(np.arange(self.aggs.shape[1]), self.aggs.shape[0])]
            below = np.broadcast_to(aggs[:, None], cores.shape)
            t["up2"] = self._edge_ids(below, cores, keys)
            t["down2"] = self._edge_ids(cores, below, keys)
        t["latency"] = np.append(self._topo.edge_latency_s, 0.0)   # per edge id, then −1's 0
        self._hops = t
        return t

    def stripes(self, src_nodes: np.ndarray, dst_nodes: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`~.graph.Topology.rail_stripes` of each pair, flat: edge ids, edges per
        route, routes per pair (the rails) and each pair's largest route latency."""
        k = self.nic.shape[1]
        src = np.asarray(src_nodes, dtype=np.int64).repeat(k)
        dst = np.asarray(dst_nodes, dtype=np.int64).repeat(k)
        rail = np.arange(len(src), dtype=np.int64) % k   # 0..k-1 per pair (np.tile's, cheaper)
        flat, lengths, latency = self.routes(src, dst, rail)
        routes = np.empty(len(src_nodes), dtype=np.int64)
        routes.fill(k)
        return flat, lengths, routes, np.maximum.reduce(latency.reshape(-1, k), axis=1)

    def _edge_ids(self, a: np.ndarray, b: np.ndarray, keys: tuple) -> np.ndarray:
        """Edge id of each ``a → b`` (arrays of vertex ids of one shape); ``keys``:
        :func:`_sorted_keys`."""
        n = len(self._topo._names)
        sel, key, order, ordered = keys
        want = (np.asarray(a) * n + np.asarray(b)).ravel()
        at = np.minimum(np.searchsorted(ordered, want), len(key) - 1)
        found = order[at]
        if (key[found] != want).any():
            raise ValueError("a tree route takes a hop that is not an edge")
        return sel[found].reshape(np.shape(a))


def _sorted_keys(topo: Topology) -> tuple[np.ndarray, ...]:
    """The edges leaving a NIC or a fabric switch (every hop of a tree route does): their
    ids, their keys ``u·V + v``, the positions in key order and the sorted keys, sorted once
    for all of :meth:`TreeRoutes._tables`' look-ups."""
    sel = np.flatnonzero(topo._fabric[topo._u] | (topo._vkind[topo._u] == _NIC))
    key = topo._u[sel] * len(topo._names) + topo._v[sel]
    order = np.argsort(key, kind="stable")
    return sel, key, order, key[order]


class NodeCopies:
    """Device-to-device routes of many pairs at once, where every compute node is a copy of
    node 0 (same vertices and links, ids shifted by a constant per node, as
    :meth:`~.builder.GraphBuilder.add_copies` lays them out) and the routes inside a node
    have no tie (so no flow hash changes them): a route is node 0's segment inside the
    source node, shifted, then the fabric's rail route (:class:`TreeRoutes`), then node 0's
    segment inside the destination node, shifted. Build with :meth:`of`."""

    def __init__(self, topo: Topology, trees: TreeRoutes, edge_step: int,
                 out_seg: np.ndarray, in_seg: np.ndarray, inside: np.ndarray):
        self._topo, self._trees, self._step = topo, trees, edge_step
        self._out, self._in, self._inside = out_seg, in_seg, inside

    @classmethod
    def of(cls, topo: Topology) -> NodeCopies | None:
        """The segments of ``topo``, or None where its nodes are not such copies."""
        trees, b = topo._trees, topo._builder
        if trees is None or len(b._copies) != 1 or trees.nic.shape[1] < 2:
            return None
        start, k, copies = b._copies[0][:3]
        if copies != topo.num_nodes or not _shifted(topo, start, k):
            return None
        step = int(topo._offsets[start + k] - topo._offsets[start])
        dpn, rails = topo.devices_per_node, trees.nic.shape[1]
        dev, nic = topo._dev[:dpn].tolist(), trees.nic[0].tolist()
        paths = [[_segment(topo, a, c) for c in nic] for a in dev]          # device → NIC
        back = [[_segment(topo, c, a) for a in dev] for c in nic]           # NIC → device
        inside = [[_segment(topo, a, z) for z in dev] for a in dev]         # device → device
        if any(p is None for rows in (paths, back, inside) for row in rows for p in row):
            return None
        return cls(topo, trees, step, _padded(paths, (dpn, rails)), _padded(back, (rails, dpn)),
                   _padded(inside, (dpn, dpn)))

    def routes(self, src: np.ndarray, dst: np.ndarray, rail: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Padded edge-id rows (−1 after the route's end) and latencies (seconds, added hop
        by hop in route order) of :meth:`~.graph.Topology.route_rail` ``(src[i], dst[i],
        rail[i])`` (device ids)."""
        topo, dpn = self._topo, self._topo.devices_per_node
        na, nb = topo.node_of_device[src], topo.node_of_device[dst]
        i, j = src - na * dpn, dst - nb * dpn
        c = rail % self._trees.nic.shape[1]
        flat, lengths, _ = self._trees.routes(na, nb, c)
        fabric = np.full((len(src), int(lengths.max(initial=0))), -1, dtype=np.int64)
        fabric[np.repeat(np.arange(len(src)), lengths),
               np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
        out, back = self._out[i, c], self._in[c, j]
        rows = np.concatenate([_shift(out, na * self._step), fabric,
                               _shift(back, nb * self._step)], axis=1)
        same = na == nb
        if same.any():
            inner = _shift(self._inside[i[same], j[same]], na[same] * self._step)
            rows[same] = -1
            rows[same, :inner.shape[1]] = inner
        rows = np.take_along_axis(rows, np.argsort(rows < 0, axis=1, kind="stable"), axis=1)
        width = int((rows >= 0).sum(axis=1).max(initial=1))
        rows = rows[:, :max(width, 1)]
        lat_of, latency = topo.edge_latency_s, np.zeros(len(src))
        for col in range(rows.shape[1]):
            e = rows[:, col]
            latency = latency + np.where(e >= 0, lat_of[np.maximum(e, 0)], 0.0)
        return rows, latency


def _segment(topo: Topology, a: int, b: int) -> tuple[int, ...] | None:
    """Edge ids of the tie-free node-local path between vertex ids ``a`` and ``b`` (None
    where the path has ties; ``()`` from a vertex to itself)."""
    if a == b:
        return ()
    path = topo._local.untied_path(a, b)
    return None if path is None else topo._edge_ids(list(path))


def _padded(rows: list[list[tuple[int, ...]]], shape: tuple[int, int]) -> np.ndarray:
    width = max(1, max(len(p) for row in rows for p in row))
    out = np.full((*shape, width), -1, dtype=np.int64)
    for x, row in enumerate(rows):
        for y, p in enumerate(row):
            out[x, y, :len(p)] = p
    return out


def _shift(rows: np.ndarray, by: np.ndarray) -> np.ndarray:
    return np.where(rows >= 0, rows + by[:, None], -1)


def _shifted(topo: Topology, start: int, k: int) -> bool:
    """Whether node n's vertices are ``start + n·k …`` and its edges node 0's, shifted by n
    vertex blocks (sources and node-local targets) and n edge blocks."""
    n = topo.num_nodes
    first = topo._offsets[start + k * np.arange(n + 1)] - topo._offsets[start]
    step = int(first[1])
    if not np.array_equal(first, step * np.arange(n + 1)):
        return False
    span = np.arange(int(topo._offsets[start]), int(topo._offsets[start]) + n * step)
    u = topo._u[span].reshape(n, step) - (k * np.arange(n))[:, None]
    v = topo._v[span].reshape(n, step)
    local = ~topo._fabric[v]
    shift = (k * np.arange(n))[:, None]
    return bool((u == u[0]).all() and (local == local[0]).all()
                and (np.where(local, v - shift, 0) == np.where(local[0], v[0], 0)).all())

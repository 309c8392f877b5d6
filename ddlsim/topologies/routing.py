"""Shortest-path routing with deterministic ECMP.

A route has the fewest hops; among equally short paths the least total latency wins; the
remaining ties are *equal-cost multi-paths* and one is picked per flow by a stable hash of
``(src, dst, flow_key)`` (CRC-32, never Python's salted ``hash()``), re-hashed at each hop with
the hop's index, as ECMP switches hash a flow's header. The same input gives the same path on
every run and every machine.

Fabric routers turn a pair of attachment switches into the switch-level path between them:
:class:`TreeRouter` (single switch, 2- and 3-level fat trees, rail-optimised) and
:class:`TorusRouter` compute it from the structure in O(levels); :class:`GraphRouter` handles
any other graph (dragonfly, custom) with per-destination hop tables.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Protocol

__all__ = ["flow_hash", "pick", "choose", "Router", "ShortestPaths", "TreeRouter",
           "TorusRouter", "GraphRouter"]

#: relative tolerance when comparing path latencies for ties
_REL_TOL = 1e-9


_MASK32 = 0xFFFFFFFF
#: most tie-free paths one :class:`ShortestPaths` remembers (a few tens of MB at most)
_UNTIED_MAX = 1 << 18


def _mix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with p ≈ 1/2.

    CRC-32 alone is linear, so flows whose keys differ in a few low bits can agree modulo a
    power of two; the finaliser breaks that (Appleby, MurmurHash3, ``fmix32``).
    """
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def flow_hash(src: int, dst: int, flow_key: int) -> int:
    """Stable 32-bit hash of a flow: CRC-32 of ``b"src>dst#flow_key"``, finalised."""
    return _mix32(zlib.crc32(f"{src}>{dst}#{flow_key}".encode()))


def pick(h: int, salt: int, n: int) -> int:
    """Index in ``range(n)`` chosen by the flow hash ``h`` at decision point ``salt``."""
    if n == 1:
        return 0
    return _mix32(h ^ ((salt * 0x9E3779B9) & _MASK32)) % n


def choose(options: Sequence, h: int, salt: int):
    """The item of ``options`` chosen by the flow hash ``h`` at decision point ``salt``."""
    return options[pick(h, salt, len(options))]


class Router(Protocol):
    """Switch-level routing between the fabric switches two NICs hang off."""

    def path(self, src: str, dst: str, h: int) -> list[str]:
        """Vertices from ``src`` to ``dst`` inclusive, for a flow with hash ``h``."""


class ShortestPaths:
    """Fewest-hop, then least-latency paths on a directed graph, per destination (cached).

    Parameters
    ----------
    succ : dict
        vertex → list of ``(successor, latency_s)`` in a fixed (insertion) order.
    no_transit : set
        Vertices a path may start or end at but never pass through (e.g. NICs for
        intra-node paths).
    cache_size : int
        Destinations whose hop tables are kept.
    pred : "symmetric", optional
        Every edge's reverse is an edge too, so a vertex's predecessors are its successors:
        ``succ`` may then be a lazy mapping (read per vertex, never iterated), and
        ``no_transit`` any container.
    """

    def __init__(self, succ: Mapping[Hashable, list[tuple[Hashable, float]]],
                 no_transit: Iterable[Hashable] = (), cache_size: int = 65536,
                 pred: str | None = None):
        self._succ = succ
        if pred == "symmetric":
            self._pred = _Successors(succ)
            self._no_transit = no_transit
        else:
            self._pred = {v: [] for v in succ}
            for u, outs in succ.items():
                for v, _ in outs:
                    self._pred.setdefault(v, []).append(u)
            self._no_transit = frozenset(no_transit)
        self._tables = lru_cache(maxsize=cache_size)(self._table)
        #: paths with no tie on the way: the same for every flow hash, so built once
        self._untied: dict[tuple[Hashable, Hashable], tuple[Hashable, ...]] = {}

    def _table(self, dst: Hashable) -> tuple[dict[Hashable, int], dict[Hashable, float]]:
        """Hop count of every vertex to ``dst`` (reverse BFS) and an empty latency memo."""
        hops = {dst: 0}
        queue = deque([dst])
        while queue:
            v = queue.popleft()
            if v in self._no_transit and v != dst:
                continue
            for u in self._pred.get(v, ()):
                if u not in hops:
                    hops[u] = hops[v] + 1
                    queue.append(u)
        return hops, {dst: 0.0}

    def _latency(self, v: Hashable, hops: dict, memo: dict) -> float:
        """Least latency from ``v`` to the destination over fewest-hop paths (memoised)."""
        if v not in memo:
            memo[v] = min(lat + self._latency(w, hops, memo)
                          for w, lat in self._next(v, hops))
        return memo[v]

    def _next(self, v: Hashable, hops: dict) -> list[tuple[Hashable, float]]:
        want = hops[v] - 1
        return [(w, lat) for w, lat in self._succ.get(v, ())
                if hops.get(w) == want and (want == 0 or w not in self._no_transit)]

    def untied_path(self, src: Hashable, dst: Hashable) -> tuple[Hashable, ...] | None:
        """The path from ``src`` to ``dst`` when it has no tie on the way (the same for every
        flow hash), else None."""
        self.path(src, dst, 0)
        return self._untied.get((src, dst))

    def path(self, src: Hashable, dst: Hashable, h: int) -> list[Hashable]:
        """Vertices of the ECMP-chosen shortest path from ``src`` to ``dst`` (inclusive).

        Raises ``KeyError`` when ``dst`` cannot be reached from ``src``.
        """
        known = self._untied.get((src, dst))
        if known is not None:
            return list(known)
        hops, memo = self._tables(dst)
        if src not in hops:
            raise KeyError(f"no path from {src!r} to {dst!r}")
        path, untied = [src], True
        while path[-1] != dst:
            v = path[-1]
            options = [(lat + self._latency(w, hops, memo), w) for w, lat in self._next(v, hops)]
            best = min(t for t, _ in options)
            tied = [w for t, w in options if t <= best * (1 + _REL_TOL) + 1e-15]
            untied = untied and len(tied) == 1
            path.append(tied[pick(h, len(path), len(tied))])
        if untied and len(self._untied) < _UNTIED_MAX:
            self._untied[(src, dst)] = tuple(path)
        return path


class _Successors:
    """The successor vertices of a ``succ`` mapping, read as predecessors (``get``)."""

    def __init__(self, succ: Mapping[Hashable, list[tuple[Hashable, float]]]):
        self._succ = succ

    def get(self, v: Hashable, default=()) -> list[Hashable]:
        try:
            return [w for w, _ in self._succ[v]]
        except KeyError:
            return default


class TreeRouter:
    """Up/down routing in the trees that :mod:`.fabrics` builds.

    Two levels: every leaf links to every spine, so leaf → spine (hashed) → leaf.
    Three levels: leaves form pods; leaf *l* links to all aggregation switches of its pod;
    aggregation switch *j* of every pod links to all core switches of plane *j*. Within a pod:
    leaf → agg (hashed) → leaf; across pods: leaf → agg *j* → core (plane *j*, hashed) →
    agg *j* of the destination pod → leaf. A single switch is a tree with one leaf.
    """

    def __init__(self, spines: Sequence[str] = (), pod_of_leaf: dict[str, int] | None = None,
                 aggs: Sequence[Sequence[str]] = (), cores: Sequence[Sequence[str]] = ()):
        self.spines = list(spines)
        self.pod_of_leaf = dict(pod_of_leaf or {})
        self.aggs = [list(a) for a in aggs]
        self.cores = [list(c) for c in cores]

    def path(self, src: str, dst: str, h: int) -> list[str]:
        """Switch path from leaf ``src`` to leaf ``dst`` for a flow hashed ``h``."""
        if src == dst:
            return [src]
        if not self.aggs:
            return [src, self.spines[pick(h, 0, len(self.spines))], dst]
        pod_a, pod_b = self.pod_of_leaf[src], self.pod_of_leaf[dst]
        j = pick(h, 0, len(self.aggs[pod_a]))
        if pod_a == pod_b:
            return [src, self.aggs[pod_a][j], dst]
        core = self.cores[j][pick(h, 1, len(self.cores[j]))]
        return [src, self.aggs[pod_a][j], core, self.aggs[pod_b][j], dst]

    def path_to(self, src: str, dst: str, dest_index: int) -> list[str]:
        """Switch path chosen by the destination (D-mod-k, the deterministic routing of
        InfiniBand's fat-tree routing engine: the up-port is the destination's index mod the
        up-ports; Zahavi, "Fat-tree routing and node ordering providing contention free
        traffic for MPI global collectives", JPDC 72(11), 2012): a shift permutation, as
        a striped ring step is, meets no contention on a non-blocking tree."""
        if src == dst:
            return [src]
        if not self.aggs:
            return [src, self.spines[dest_index % len(self.spines)], dst]
        pod_a, pod_b = self.pod_of_leaf[src], self.pod_of_leaf[dst]
        j = dest_index % len(self.aggs[pod_a])
        if pod_a == pod_b:
            return [src, self.aggs[pod_a][j], dst]
        core = self.cores[j][(dest_index // len(self.aggs[pod_a])) % len(self.cores[j])]
        return [src, self.aggs[pod_a][j], core, self.aggs[pod_b][j], dst]


class TorusRouter:
    """Minimal routing on a k-ary n-dimensional torus with wrap-around links.

    Each hop moves one step along one dimension whose offset is not yet zero, the short way
    round; when both ways are equally short (offset = size/2) either is minimal. All minimal
    moves at a hop are equal-cost paths, chosen by the flow hash (fully adaptive minimal
    routing, made deterministic).
    """

    def __init__(self, dims: Sequence[int], router_of_coord: dict[tuple[int, ...], str]):
        self.dims = tuple(dims)
        self.router_of_coord = dict(router_of_coord)
        self.coord_of_router = {r: c for c, r in self.router_of_coord.items()}

    def _moves(self, here: tuple[int, ...], there: tuple[int, ...]) -> list[tuple[int, int]]:
        moves = []
        for axis, size in enumerate(self.dims):
            fwd = (there[axis] - here[axis]) % size
            if fwd == 0:
                continue
            if fwd <= size - fwd:
                moves.append((axis, 1))
            if fwd >= size - fwd and size > 2:
                moves.append((axis, -1))
        return moves

    def path(self, src: str, dst: str, h: int) -> list[str]:
        """Router path from ``src`` to ``dst`` for a flow hashed ``h``."""
        here, there = self.coord_of_router[src], self.coord_of_router[dst]
        path = [src]
        while here != there:
            moves = self._moves(here, there)
            axis, step = moves[pick(h, len(path), len(moves))]
            here = tuple((c + step) % self.dims[axis] if i == axis else c
                         for i, c in enumerate(here))
            path.append(self.router_of_coord[here])
        return path


class GraphRouter:
    """Shortest paths with ECMP on any fabric graph (dragonfly, custom): the fallback."""

    def __init__(self, succ: dict[str, list[tuple[str, float]]]):
        self._paths = ShortestPaths(succ, cache_size=4096)

    def path(self, src: str, dst: str, h: int) -> list[str]:
        """Switch/router path from ``src`` to ``dst`` for a flow hashed ``h``."""
        return self._paths.path(src, dst, h)

"""The graph builder the topology builders share, and the plain-dict record it can give.

A cluster of 16,384 DGX nodes is ~280,000 vertices and ~1.3 million directed links, so the
builder keeps vertices in columns (name, kind, compute node, local index, other attributes
by name) and links in numpy arrays, appended one at a time (:meth:`GraphBuilder.add_link`)
or many at once (:meth:`GraphBuilder.add_links`, :meth:`GraphBuilder.add_copies`); the
networkx-layout :class:`GraphRecord` (dicts of dicts) is built only when asked for
(:attr:`GraphBuilder.graph`'s ``nodes`` and ``succ``).

Edge order is what a dict of successor dicts would give: grouped by source vertex in vertex
order, each source's edges in the order they were first added; adding an edge again keeps its
place and takes the new attributes (:meth:`GraphBuilder.arrays`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["GraphBuilder", "GraphRecord", "NODE_KINDS", "LINK_KINDS", "NODE_LOCAL_KINDS",
           "FABRIC_KINDS", "ABSENT", "source_offsets"]

#: Kinds of graph vertices. ``switch`` carries ``level`` (leaf 1, spine/aggregation 2, core 3).
NODE_KINDS = ("device", "nvswitch", "pcie_switch", "host", "nic", "switch", "router")
#: Vertices that live inside one compute node (they carry the ``node`` attribute).
NODE_LOCAL_KINDS = ("device", "nvswitch", "pcie_switch", "host", "nic")
#: Vertices of the inter-node fabric.
FABRIC_KINDS = ("switch", "router")
#: Kinds of links (every link is two directed edges, one per direction).
LINK_KINDS = ("nvlink", "pcie", "shm", "nic", "fabric")

_MISSING = object()
#: the ``node``/``local`` column's value for a vertex without that attribute
ABSENT = -(1 << 62)
_KIND_CODE = {k: i for i, k in enumerate(NODE_KINDS)}
_LINK_CODE = {k: i for i, k in enumerate(LINK_KINDS)}
#: vertex kind codes of the fabric (switch, router)
FABRIC_CODES = np.array([_KIND_CODE[k] for k in FABRIC_KINDS])


class GraphRecord:
    """A directed graph held as plain dicts in networkx's own layout, so that a hand-made
    cluster needs no networkx (whose import costs more than a prediction);
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


class BuilderRecord(GraphRecord):
    """The :class:`GraphRecord` of a :class:`GraphBuilder` as it is now: ``graph`` is the
    builder's own attribute dict; ``nodes`` and ``succ`` are built on first use (a
    :class:`~.graph.Topology` made from an untouched record reads the builder's arrays)."""

    def __init__(self, builder: GraphBuilder) -> None:  # noqa: D107  (no super(): lazy dicts)
        self.graph = builder.attrs
        self.builder = builder

    @property
    def materialised(self) -> bool:
        """Whether ``nodes`` or ``succ`` were built (and so may have been changed)."""
        return "nodes" in self.__dict__ or "succ" in self.__dict__

    @cached_property
    def nodes(self) -> dict[Any, dict[str, Any]]:  # noqa: D102
        b = self.builder
        return {name: b.vertex_attrs(i) for i, name in enumerate(b.names)}

    @cached_property
    def succ(self) -> dict[Any, dict[Any, dict[str, Any]]]:  # noqa: D102
        b = self.builder
        u, v, bw, lat, kind = b.arrays()
        out: dict[Any, dict[Any, dict[str, Any]]] = {name: {} for name in b.names}
        names = b.names
        for a, c, w, t, k in zip(u.tolist(), v.tolist(), bw.tolist(), lat.tolist(), kind.tolist()):
            out[names[a]][names[c]] = {"bandwidth_Bps": w, "latency_s": t,
                                       "link_kind": LINK_KINDS[k]}
        return out


class GraphBuilder:
    """Accumulates vertices and full-duplex links of a cluster graph.

    Every edge that leaves a ``switch`` or ``router`` gets ``switch_latency_s`` added, so a
    route through *k* switches pays *k* switch traversals.

    Parameters
    ----------
    switch_latency_s : float
        Port-to-port latency of one fabric switch or router, seconds.

    Attributes
    ----------
    names : list of str
        Vertex id → name, in the order added.
    attrs : dict
        Graph attributes (``fabric``, ``spec``); also ``graph.graph``.
    """

    def __init__(self, switch_latency_s: float = 0.0):
        self.switch_latency_s = float(switch_latency_s)
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.attrs: dict[str, Any] = {}
        self._kind = array("q")    # per vertex id; C arrays, so copies extend them in bulk
        self._node = array("q")
        self._local = array("q")
        #: attribute name → {vertex id: value}, for the attributes without a column
        self.extra: dict[str, dict[int, Any]] = {}
        #: device vertex id → the vertex ids of its ``nics`` attribute
        self.nics: dict[int, tuple[int, ...]] = {}
        #: blocks of :meth:`add_copies`: (first id, vertices a copy, copies, template,
        #: template name → tail, prefix)
        self._copies: list[tuple] = []
        self._chunks: list[tuple[np.ndarray, ...]] = []   # (u, v, bandwidth, latency, kind)
        self._pending: list[tuple[int, int, float, float, int]] = []
        self._arrays: tuple[np.ndarray, ...] | None = None

    @property
    def graph(self) -> BuilderRecord:
        """The vertices and edges added so far as a :class:`GraphRecord`."""
        return BuilderRecord(self)

    # ---------------------------------------------------------------------------- vertices
    def add_node(self, name: str, kind: str, **attrs: Any) -> str:
        """Add a vertex of ``kind`` (one of :data:`NODE_KINDS`) and return its name; adding
        a name again updates its attributes."""
        if kind not in _KIND_CODE:
            raise ConfigError(f"vertex {name!r} has kind = {kind!r}; allowed: "
                              f"{', '.join(NODE_KINDS)}")
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
            self._kind.append(0)
            self._node.append(ABSENT)
            self._local.append(ABSENT)
        self._kind[i] = _KIND_CODE[kind]
        for key, value in attrs.items():
            if key == "nics":
                self.nics[i] = self._nic_ids(name, value)
                continue
            column = {"node": self._node, "local": self._local}.get(key)
            if column is not None and type(value) is int and value > ABSENT:
                column[i] = value
                self.extra.get(key, {}).pop(i, None)
            else:
                if column is not None:
                    column[i] = ABSENT
                self.extra.setdefault(key, {})[i] = value
        return name

    def _nic_ids(self, name: str, nics: Any) -> tuple[int, ...]:
        missing = [x for x in nics if x not in self.index]
        if missing:
            raise ConfigError(f"vertex {name!r} has nics = {tuple(nics)!r}, but {missing[0]!r} "
                              "is not a vertex of the graph; list NIC vertices by name")
        return tuple(self.index[x] for x in nics)

    def vertex_attrs(self, i: int) -> dict[str, Any]:
        """The attribute dict of vertex id ``i`` (``kind``, ``node``, ``local``, …)."""
        out: dict[str, Any] = {"kind": NODE_KINDS[self._kind[i]]}
        if self._node[i] != ABSENT:
            out["node"] = self._node[i]
        if self._local[i] != ABSENT:
            out["local"] = self._local[i]
        nics = self.nics_of(i)
        if nics is not None:
            out["nics"] = tuple(self.names[j] for j in nics)
        block = self._block_of(i)
        keys = dict.fromkeys([*(block[0].extra if block else ()), *self.extra])
        for key in keys:
            value = self.attr(key, i)
            if value is not _MISSING:
                out[key] = value
        return out

    def attr(self, key: str, i: int) -> Any:
        """Attribute ``key`` of vertex id ``i`` outside the columns (``_MISSING`` if none)."""
        values = self.extra.get(key)
        if values is not None and i in values:
            return values[i]
        block = self._block_of(i)
        if block is None:
            return _MISSING
        template, copy, j, own, prefix = block
        value = template.extra.get(key, {}).get(j, _MISSING)
        return value if value is _MISSING else renamed_value(value, prefix(copy), own)

    def nics_of(self, i: int) -> tuple[int, ...] | None:
        """The ``nics`` of vertex id ``i`` as vertex ids (None where it has none)."""
        if i in self.nics:
            return self.nics[i]
        block = self._block_of(i)
        if block is None or block[2] not in block[0].nics:
            return None
        template, copy, j = block[:3]
        first = i - j
        return tuple(first + x for x in template.nics[j])

    def nic_groups(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every vertex with ``nics``, in groups of one NIC count: (vertex ids, their NIC ids
        as a vertices × count array), the copies' computed together. A vertex in several
        groups takes its last (a vertex set by hand after it was copied: its own entry)."""
        out = []
        for start, k, copies, template, _, _ in self._copies:
            first = start + k * np.arange(copies, dtype=np.int64)
            for j, t in template.nics.items():
                out.append((first + j, first[:, None] + np.array(t, dtype=np.int64)
                            .reshape(1, len(t))))
        by_count: dict[int, list[int]] = {}
        for i, nics in self.nics.items():
            by_count.setdefault(len(nics), []).append(i)
        for ids in by_count.values():
            out.append((np.array(ids, dtype=np.int64),
                        np.array([self.nics[i] for i in ids], dtype=np.int64)
                        .reshape(len(ids), -1)))
        return out

    def _block_of(self, i: int):
        """(template, copy number, template vertex id, template names → tails, prefix) of a
        vertex added by :meth:`add_copies`, else None."""
        for start, k, copies, template, own, prefix in self._copies:
            if start <= i < start + k * copies:
                return template, (i - start) // k, (i - start) % k, own, prefix
        return None

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per vertex id: kind code (into :data:`NODE_KINDS`), compute node and local index
        (:data:`ABSENT` where the vertex has no integer one), as int64 arrays."""
        return (np.array(self._kind, dtype=np.int64), np.array(self._node, dtype=np.int64),
                np.array(self._local, dtype=np.int64))

    # ------------------------------------------------------------------------------- links
    def add_link(self, u: str, v: str, *, bandwidth_Bps: float, link_kind: str,
                 latency_s: float = 0.0, reverse_latency_s: float | None = None) -> None:
        """Add the full-duplex link u ↔ v: two directed edges with the same bandwidth.

        ``latency_s`` is u → v's latency, ``reverse_latency_s`` v → u's (default the same),
        each before the switch latency is added.
        """
        a, b = self.index[u], self.index[v]
        code = _link_code(u, v, link_kind)
        back = latency_s if reverse_latency_s is None else reverse_latency_s
        for x, y, lat in ((a, b, latency_s), (b, a, back)):
            if NODE_KINDS[self._kind[x]] in FABRIC_KINDS:
                lat += self.switch_latency_s
            self._pending.append((x, y, float(bandwidth_Bps), float(lat), code))
        self._arrays = None

    def add_links(self, u: Sequence[str] | np.ndarray, v: Sequence[str] | np.ndarray, *,
                  bandwidth_Bps: float, link_kind: str, latency_s: float = 0.0) -> None:
        """Add the links ``u[i] ↔ v[i]`` (names, or vertex ids as an integer array), in
        order, as :meth:`add_link` adds each."""
        a, b = self._ids(u), self._ids(v)
        code = _link_code(u[0] if len(u) else "", v[0] if len(v) else "", link_kind)
        kind = np.array(self._kind, dtype=np.int64)
        switch = self.switch_latency_s
        lat_ab = float(latency_s) + np.where(np.isin(kind[a], FABRIC_CODES), switch, 0.0)
        lat_ba = float(latency_s) + np.where(np.isin(kind[b], FABRIC_CODES), switch, 0.0)
        # u → v then v → u for each link, as add_link appends them
        src = np.stack([a, b], axis=1).ravel()
        dst = np.stack([b, a], axis=1).ravel()
        lat = np.stack([lat_ab, lat_ba], axis=1).ravel()
        self._add_chunk(src, dst, np.full(len(src), float(bandwidth_Bps)), lat,
                        np.full(len(src), code, dtype=np.int8))

    def add_copies(self, template: GraphBuilder, copies: int, prefix) -> np.ndarray:
        """Add ``copies`` copies of ``template``'s vertices and links. Every template name
        starts with ``prefix(0)``; copy *n* of it starts with ``prefix(n)`` instead, its
        ``node`` attribute is *n*, its ``nics`` the copies of the template's, and every other
        attribute value that names a template vertex (alone or in a tuple) is renamed alike.
        Returns the first vertex id of each copy."""
        k, start, cut = len(template.names), len(self.names), len(prefix(0))
        base = start + k * np.arange(copies, dtype=np.int64)
        tails = [name[cut:] for name in template.names]
        names = [p + t for p in map(prefix, range(copies)) for t in tails]
        self.index.update(zip(names, range(start, start + len(names))))
        self.names.extend(names)
        kind, node, local = template.columns()
        self._kind.frombytes(np.tile(kind, copies).tobytes())
        copy_of = np.repeat(np.arange(copies, dtype=np.int64), k)
        self._node.frombytes(np.where(np.tile(node, copies) == ABSENT, ABSENT, copy_of).tobytes())
        self._local.frombytes(np.tile(local, copies).tobytes())
        # the copies' other attributes and nics are read from the template when asked
        own = {name: tail for name, tail in zip(template.names, tails)}
        self._copies.append((start, k, copies, template, own, prefix))
        u, v, bw, lat, code = template.arrays()
        off = np.repeat(base, len(u))
        self._add_chunk(np.tile(u, copies) + off, np.tile(v, copies) + off,
                        np.tile(bw, copies), np.tile(lat, copies), np.tile(code, copies))
        return base

    def _ids(self, names: Sequence[str] | np.ndarray) -> np.ndarray:
        if isinstance(names, np.ndarray):
            return names.astype(np.int64)
        return np.fromiter(map(self.index.__getitem__, names), dtype=np.int64, count=len(names))

    def _flush(self) -> None:
        if self._pending:
            u, v, bw, lat, code = zip(*self._pending)
            self._pending = []
            self._chunks.append((np.array(u, dtype=np.int64), np.array(v, dtype=np.int64),
                                 np.array(bw), np.array(lat), np.array(code, dtype=np.int8)))

    def _add_chunk(self, *chunk: np.ndarray) -> None:
        self._flush()
        self._chunks.append(chunk)
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The directed edges in successor-dict order: source and target vertex ids, bytes/s,
        seconds and link-kind codes (into :data:`LINK_KINDS`)."""
        if self._arrays is None:
            self._flush()
            if not self._chunks:
                empty = np.empty(0, dtype=np.int64)
                return empty, empty, np.empty(0), np.empty(0), np.empty(0, dtype=np.int8)
            u, v, bw, lat, code = (np.concatenate(c) for c in zip(*self._chunks))
            self._chunks = [(u, v, bw, lat, code)]
            self._arrays = _successor_order(u, v, bw, lat, code, len(self.names))
        return self._arrays


def source_offsets(u: np.ndarray, vertices: int) -> np.ndarray:
    """Where each vertex's out-edges start among edges sorted by source ``u`` (``vertices +
    1`` entries, the last ``len(u)``): ``np.searchsorted(u, np.arange(vertices + 1))``,
    counted in one pass instead of a binary search per vertex."""
    out = np.zeros(vertices + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=vertices)[:vertices], out=out[1:])
    return out


def _link_code(u: Any, v: Any, link_kind: str) -> int:
    if link_kind not in _LINK_CODE:
        raise ConfigError(f"edge ({u!r}, {v!r}) has link_kind = {link_kind!r}; allowed: "
                          f"{', '.join(LINK_KINDS)}")
    return _LINK_CODE[link_kind]


def renamed_value(value: Any, prefix: str, own: dict[str, str]) -> Any:
    """``value`` with the template vertex names in it (alone or in a tuple) renamed to
    ``prefix`` + their tail (``own``: template name → tail)."""
    if isinstance(value, str) and value in own:
        return prefix + own[value]
    if isinstance(value, tuple) and any(isinstance(x, str) and x in own for x in value):
        return tuple(prefix + own[x] if isinstance(x, str) and x in own else x for x in value)
    return value


def _successor_order(u, v, bw, lat, code, vertices: int) -> tuple[np.ndarray, ...]:
    """Edges as a dict of successor dicts holds them: an edge added twice keeps its first
    place and its last attributes; sources in vertex order, each source's edges in order."""
    key = u * vertices + v
    order = np.argsort(u, kind="stable")   # in the order added within each source
    ordered = key[order]
    # no repeated edge where each source's targets increase (so the builders add them);
    # else look for one among the sorted keys
    if not (ordered[1:] > ordered[:-1]).all() and (np.diff(np.sort(key)) == 0).any():
        # repeated edges: the last attributes at the first place
        first = np.unique(key, return_index=True)[1]
        last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]
        u, v, bw, lat, code = u[first], v[first], bw[last], lat[last], code[last]
        order = np.lexsort((first, u))
    return u[order], v[order], bw[order], lat[order], code[order]

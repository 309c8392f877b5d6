"""What a cluster graph must be (the rules of :mod:`.graph`'s model), checked on a hand-made
graph vertex by vertex and on a builder's arrays all at once, with the same messages."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ConfigError
from .builder import (ABSENT, LINK_KINDS, NODE_KINDS, NODE_LOCAL_KINDS,
                      BuilderRecord, GraphBuilder, GraphRecord, source_offsets)

__all__ = ["builder_of", "validate_record", "validate_builder", "reachable_count"]

_LINK_CODE = {k: i for i, k in enumerate(LINK_KINDS)}


def builder_of(graph: Any) -> tuple[GraphBuilder, Any]:
    """The validated :class:`GraphBuilder` of ``graph`` (a builder's untouched record: the
    builder itself) and the ``nx.DiGraph`` given, if one was (else None)."""
    if isinstance(graph, BuilderRecord) and not graph.materialised:
        validate_builder(graph.builder)
        return graph.builder, None
    given = None
    if not isinstance(graph, GraphRecord):
        given, graph = graph, _record_of(graph)
    validate_record(graph)
    return _builder_from_record(graph), given


def _record_of(graph: Any) -> GraphRecord:
    """An ``nx.DiGraph``'s vertices and edges as a :class:`GraphRecord` (its own attribute
    dicts, in its order)."""
    import networkx as nx

    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise ConfigError(f"a topology graph must be an nx.DiGraph; got {type(graph).__name__}")
    record = GraphRecord()
    record.graph = graph.graph
    record.nodes = dict(graph.nodes(data=True))
    record.succ = {v: dict(out) for v, out in graph.succ.items()}
    return record


def _builder_from_record(record: GraphRecord) -> GraphBuilder:
    """A builder holding ``record``'s vertices and its directed edges as they are."""
    b = GraphBuilder()
    b.attrs = record.graph
    for v, attrs in record.nodes.items():
        b.add_node(v, attrs["kind"], **{k: a for k, a in attrs.items()
                                        if k not in ("kind", "nics")})
    for v, attrs in record.nodes.items():   # once every vertex has an id
        if "nics" in attrs:
            b.add_node(v, attrs["kind"], nics=attrs["nics"])
    index = b.index
    rows = [(index[u], index[v], float(a["bandwidth_Bps"]), float(a["latency_s"]),
             _LINK_CODE[a["link_kind"]]) for u, out in record.succ.items() for v, a in out.items()]
    if rows:
        u, v, bw, lat, code = zip(*rows)
        b._add_chunk(np.array(u, dtype=np.int64), np.array(v, dtype=np.int64), np.array(bw),
                     np.array(lat), np.array(code, dtype=np.int8))
    return b


def validate_record(graph: GraphRecord) -> None:
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
    if _reachable(succ, next(iter(succ))) < len(graph.nodes):
        _not_connected(graph)


def validate_builder(b: GraphBuilder) -> None:
    """:func:`validate_record` on a builder's columns and arrays (every link a builder adds is
    full duplex and of a known kind, so those two rules hold by construction)."""
    kind, node, local = b.columns()
    local_kind = np.isin(kind, [NODE_KINDS.index(k) for k in NODE_LOCAL_KINDS])
    device = kind == NODE_KINDS.index("device")
    bad = (local_kind & (node == ABSENT)) | (device & (local == ABSENT))
    switch = np.flatnonzero(kind == NODE_KINDS.index("switch"))
    bad[[i for i in switch.tolist() if b.attr("level", i) not in (1, 2, 3)]] = True
    if bad.any():
        i = int(np.argmax(bad))
        _validate_vertex(b.names[i], b.vertex_attrs(i))
    u, v, bw, lat, code = b.arrays()
    wrong = ~((bw > 0) & (bw < math.inf)) | ~((lat >= 0) & (lat < math.inf))
    if wrong.any():
        e = int(np.argmax(wrong))
        _validate_edge(b.names[u[e]], b.names[v[e]], {"bandwidth_Bps": float(bw[e]),
                       "latency_s": float(lat[e]), "link_kind": LINK_KINDS[code[e]]})
    if not device.any():
        raise ConfigError("the topology has no vertex of kind 'device'")
    if reachable_count(u, v, len(b.names)) < len(b.names):
        _not_connected(b.graph)


def reachable_count(u: np.ndarray, v: np.ndarray, vertices: int) -> int:
    """Vertices reachable from vertex 0 over the edges ``u[i] → v[i]`` (``u`` sorted),
    breadth first, one numpy pass per level."""
    offsets = source_offsets(u, vertices)
    seen = np.zeros(vertices, dtype=bool)
    seen[0] = True
    frontier = np.array([0])
    while len(frontier):
        start, count = offsets[frontier], offsets[frontier + 1] - offsets[frontier]
        at = np.repeat(start - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        new = np.zeros(vertices, dtype=bool)
        new[v[at]] = True
        new &= ~seen
        seen |= new
        frontier = np.flatnonzero(new)
    return int(seen.sum())


def _not_connected(graph: GraphRecord) -> None:
    # every link is two edges, so reaching every vertex from one is strong connectivity
    import networkx as nx

    parts = sorted(nx.strongly_connected_components(graph.to_networkx()), key=len)
    raise ConfigError(f"the topology is not connected: {len(parts)} parts, e.g. "
                      f"{sorted(map(str, parts[0]))[:5]} cannot reach the rest")


def _reachable(succ: dict[Any, dict], start: Any) -> int:
    """How many vertices are reachable from ``start`` (breadth first)."""
    seen, queue = {start}, [start]
    while queue:
        nxt = []
        for v in queue:
            for w in succ[v]:
                if w not in seen:
                    seen.add(w)
                    nxt.append(w)
        queue = nxt
    return len(seen)


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

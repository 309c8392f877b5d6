"""Flow templates: a collective (or a class-to-class send) as phases of routed flows.

A template is built once per (group family, rank-class component, op, algorithm, root) and
reused for every issue of that op: each phase of the algorithm (:mod:`..collectives`) is
mapped from member indices to the devices of *every* group instance the classes touch, each
flow routed over the topology. Only the byte count changes between issues, and every phase's
bytes are linear in the collective's size, so a template stores bytes per collective byte
(an algorithm whose layout depends on the size, as NCCL's protocols do, gets one template
per size).

A collective's transfer between two nodes is striped over the nodes' NICs: one flow per
rail, each with its share of the bytes, routed through that NIC
(:meth:`Topology.route_rail`), as NCCL lays its channels over rails; a point-to-point
transfer goes through the receiver's rail only (:meth:`Topology.p2p_rails`, NCCL's
send/recv). The analytical engine measures its group nets on the same flows
(:mod:`..netmodel`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError
from ...topologies import Topology
from ..collectives import Phase, get_algorithm
from .network import FlowNetwork
from .uniq import unique_rows

__all__ = ["PhaseFlows", "FlowTemplate", "RouteTable", "collective_template", "p2p_template"]

#: From this many flows a lookup routes them all at once where the topology can
#: (:meth:`Topology.route_rail_many`: the same routes and latencies as one by one).
_BULK = 64


@dataclass(frozen=True, slots=True)
class PhaseFlows:
    """One phase: flows of every instance, grouped by instance.

    ``edges[starts[i]:starts[i+1]]`` are instance i's flows (padded link-id rows); ``mult``
    counts identical flows merged into one row; ``bytes_per_byte`` × the collective's bytes is
    what each flow carries per repetition; ``latency_s[i]`` is the latency instance i pays
    per repetition: ``latency_steps`` × its slowest path, or, for a pipelined chain (as many
    latency steps as transfers: a ring reduce or broadcast), the sum of its paths' latencies.
    """

    edges: np.ndarray
    mult: np.ndarray
    starts: np.ndarray
    latency_s: np.ndarray
    bytes_per_byte: float
    repeat: int
    weight: np.ndarray | None = None  # per flow row: × bytes_per_byte (uneven phases)

    def rows_of(self, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flow rows of ``instances`` and, for each row, its position in ``instances``."""
        lo, hi = self.starts[instances], self.starts[instances + 1]
        counts = hi - lo
        if len(instances) == len(self.starts) - 1:
            return np.arange(len(self.edges)), np.repeat(np.arange(len(instances)), counts)
        which = np.repeat(np.arange(len(instances)), counts)
        rows = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + lo[which]
        return rows, which


@dataclass(frozen=True, slots=True)
class FlowTemplate:
    """``phases`` over ``members[i]`` (ranks of instance i, member 0 first)."""

    name: str
    members: np.ndarray
    phases: tuple[PhaseFlows, ...]
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def instances(self) -> int:
        return len(self.members)


class RouteTable:
    """Routes between devices, cached as padded link-id rows, joined into network domains."""

    def __init__(self, topology: Topology, network: FlowNetwork):
        self.topology = topology
        self.network = network
        self._cache: dict[tuple[int, int], tuple[tuple[int, ...], float]] = {}

    def lookup(self, src: np.ndarray, dst: np.ndarray, rail: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Padded link-id rows (k, w) and path latencies (k,) of flows ``src[i] → dst[i]``
        (through NIC ``rail[i]`` of both nodes when given, :meth:`Topology.route_rail`)."""
        if rail is not None and len(src) >= _BULK:
            got = self.topology.route_rail_many(src, dst, rail)
            if got is not None:
                return self._bulk(*got)
        topo, cache = self.topology, self._cache
        routes, latency, fresh = [], np.empty(len(src)), []
        rails = [0] * len(src) if rail is None else rail.tolist()
        for i, (a, b, c) in enumerate(zip(src.tolist(), dst.tolist(), rails)):
            hit = cache.get((a, b, c))
            if hit is None:
                path = topo.route(a, b, 0) if rail is None else topo.route_rail(a, b, c)
                hit = (path, topo.path_latency_s(path))
                cache[(a, b, c)] = hit
                fresh.append(path)
            routes.append(hit[0])
            latency[i] = hit[1]
        lengths = np.fromiter(map(len, routes), dtype=np.int64, count=len(routes))
        edges = np.full((len(routes), max(1, int(lengths.max(initial=1)))), self.network.pad,
                        dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(routes), dtype=np.int64,
                           count=int(lengths.sum()))
        edges[np.repeat(np.arange(len(routes)), lengths),
              np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
        if fresh:
            self.network.join([np.asarray(r, dtype=np.int64) for r in fresh])
        return edges, latency

    def _bulk(self, rows: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Routes from :meth:`Topology.route_rail_many` (−1 after a route's end) as padded
        link-id rows, their domains joined; nothing is cached per route (at 131,072 GPUs a
        template has up to 10^6 rail flows, and a dict entry per route cost gigabytes)."""
        edges = np.where(rows >= 0, rows, self.network.pad)
        self.network.join_rows(edges)
        return edges, latency


def _rails(topo: Topology) -> int:
    """Rails a transfer between nodes is laid over: the most NICs of a node, 1 on a single
    node or with one NIC."""
    r = max(1, max((len(n) for n in topo.nics_of_node), default=1))
    return r if topo.num_nodes > 1 else 1


def _stripe(routes: RouteTable, src: np.ndarray, dst: np.ndarray,
            weights: np.ndarray | None, own_rail: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray | None]:
    """Every pair as ``r`` stripes (one per NIC of a node, rail 0…r−1), each to carry 1/r of
    its bytes: a pair inside a node is r copies of one flow (merged later), a pair between
    nodes one flow per rail. Returns (src, dst, rail) of shape (instances, k·r), r and the
    per-pair weights repeated to match. ``own_rail``: a pair between nodes keeps its r
    stripes (its share of a link against other flows, as before), all on the rail of its
    sender's index in its node (:attr:`~ddlsim.simulator.collectives.base.Phase.own_rail`)."""
    topo = routes.topology
    r = _rails(topo)
    if r == 1:
        return src, dst, np.zeros_like(src), 1, weights
    same = topo.node_of_device[src] == topo.node_of_device[dst]
    rail = np.broadcast_to((src % topo.devices_per_node)[..., None] if own_rail
                           else np.arange(r), (*src.shape, r))
    rail = np.where(same[..., None], 0, rail)
    rep = lambda a: np.repeat(a[..., None], r, axis=-1).reshape(a.shape[0], -1)  # noqa: E731
    w = None if weights is None else np.repeat(np.asarray(weights, dtype=np.float64), r)
    return rep(src), rep(dst), rail.reshape(src.shape[0], -1), r, w


def _phase_flows(routes: RouteTable, src: np.ndarray, dst: np.ndarray, bytes_per_byte: float,
                 repeat: int, latency_steps: int, weights: np.ndarray | None = None,
                 latency_s: float | None = None, own_rail: bool = False) -> PhaseFlows:
    """Flows ``src[i, k] → dst[i, k]`` of instances i, striped over rails (:func:`_stripe`;
    ``own_rail``: each on its sender's), duplicates merged; with ``weights`` (per pair k),
    flow k carries ``weights[k]`` × the phase's bytes and none are merged. ``latency_s``: a
    given latency per repetition."""
    n_inst, k = src.shape
    src, dst, rail, r, weights = _stripe(routes, src, dst, weights, own_rail)
    bytes_per_byte /= r
    inst = np.repeat(np.arange(n_inst), src.shape[1])
    keys = np.stack([inst, src.ravel(), dst.ravel(), rail.ravel()], axis=1)
    if weights is None:
        keys, mult = unique_rows(keys)
        weight = None
    else:  # rows are instance-major already; every message is its own flow
        mult = np.ones(len(keys), dtype=np.int64)
        weight = np.tile(np.asarray(weights, dtype=np.float64), n_inst)
    edges, lat = routes.lookup(keys[:, 1], keys[:, 2], keys[:, 3] if r > 1 else None)
    starts = np.searchsorted(keys[:, 0], np.arange(n_inst + 1))
    latency = np.zeros(n_inst)
    if latency_s is not None:
        latency[:] = latency_s
    elif len(keys):
        if latency_steps > 1 and latency_steps == k:  # a pipelined chain: hop after hop
            pairs, which = np.unique(keys[:, :3], axis=0, return_inverse=True)
            which = which.ravel()
            pair_lat, pair_n = np.zeros(len(pairs)), np.zeros(len(pairs))
            np.maximum.at(pair_lat, which, lat)  # a striped hop: its slowest rail
            np.add.at(pair_n, which, mult / r)
            np.add.at(latency, pairs[:, 0], pair_lat * pair_n)
        else:
            np.maximum.at(latency, keys[:, 0], lat)
            latency *= latency_steps
    return PhaseFlows(edges, mult.astype(np.float64), starts, latency, float(bytes_per_byte),
                      int(repeat), weight)


def collective_template(routes: RouteTable, devices: np.ndarray, members: np.ndarray, op: str,
                        algorithm: str, root: int, g: int, name: str,
                        weights: np.ndarray | None = None,
                        phases: list[Phase] | None = None) -> FlowTemplate:
    """Phases of ``algorithm`` for ``op`` on every row of ``members`` (ranks), rooted at
    member ``root``; ``g`` members per node as the algorithms assume (node-major).
    ``weights[i, j]``: the share of the op's bytes member i sends to member j (uneven
    all-to-all), laid out by the algorithm's uneven form. ``phases``: the layout to use
    (the cost model's, :meth:`CostModel.phases`, for even or uneven sizes), else the
    algorithm's generic one."""
    p = members.shape[1]
    rotated = np.roll(members, -root, axis=1) if root else members
    algo = get_algorithm(op, algorithm)
    if weights is not None and algo.uneven_phases is None:
        raise ConfigError(f"collective {name!r}: algorithm {algorithm!r} has no form for "
                          "uneven (split_bytes) sizes; choose another algorithm")
    try:
        if phases is None:
            phases = algo.phases(1.0, p, g) if weights is None \
                else algo.uneven_phases(weights, g)
    except ValueError as exc:
        raise ConfigError(f"collective {name!r}: algorithm {algorithm!r} cannot be laid out on a "
                          f"group of {p} ranks with {g} per node ({exc}); choose another "
                          "algorithm in parallel.collective_algorithm") from None
    dev = devices[rotated]
    out = []
    for ph in phases:
        pairs = np.asarray(ph.pairs, dtype=np.int64).reshape(-1, 2)
        out.append(_phase_flows(routes, dev[:, pairs[:, 0]], dev[:, pairs[:, 1]], ph.bytes,
                                ph.repeat, ph.latency_steps, ph.weights, ph.latency_s,
                                ph.own_rail))
    return FlowTemplate(name, rotated, tuple(out))


def p2p_template(routes: RouteTable, devices: np.ndarray, src_ranks: np.ndarray,
                 dst_ranks: np.ndarray, name: str) -> FlowTemplate:
    """One instance, one phase: every ``src_ranks[i]`` sends to ``dst_ranks[i]`` at once.

    A transfer between nodes goes through the receiver's rail(s) only
    (:meth:`Topology.p2p_rails`, NCCL's send/recv); one inside a node takes the node's own
    route. Each transfer stays ``r`` flows (``r`` the NICs of a node), as many as a striped
    collective transfer has, each with 1/r of the bytes: NCCL runs a send/recv over
    several channels (``NCCL_NCHANNELS_PER_NET_PEER``) and a NIC is shared per connection,
    so a transfer weighs on its NIC as a collective's channels there do."""
    topo = routes.topology
    src, dst = devices[src_ranks], devices[dst_ranks]
    r = _rails(topo)
    multi_rail = r > 1
    count, rails = _p2p_rails(topo, src, dst, multi_rail)
    keys = np.stack([np.repeat(src, count), np.repeat(dst, count), rails,
                     np.repeat(count, count)], axis=1)
    keys, same = unique_rows(keys)
    edges, lat = routes.lookup(keys[:, 0], keys[:, 1], keys[:, 2] if multi_rail else None)
    mult = same * (r / keys[:, 3])  # r flows per transfer, over its k rails
    phase = PhaseFlows(edges, mult.astype(np.float64), np.array([0, len(keys)]),
                       np.array([lat.max() if len(lat) else 0.0]), 1.0 / r, 1)
    return FlowTemplate(name, np.asarray(src_ranks)[None, :], (phase,))


def _p2p_rails(topo: Topology, src: np.ndarray, dst: np.ndarray, multi_rail: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per transfer ``src[i] → dst[i]`` (devices), how many rails it takes, and all their
    rails in transfer order: :meth:`Topology.p2p_rails` of the receiver between nodes (read
    from :attr:`Topology.p2p_rail_table`), rail 0 inside a node or with one rail."""
    cross = np.zeros(len(src), dtype=bool)
    if multi_rail:
        cross = topo.node_of_device[src] != topo.node_of_device[dst]
    if not cross.any():
        return np.ones(len(src), dtype=np.int64), np.zeros(len(src), dtype=np.int64)
    table = topo.p2p_rail_table[0][dst]
    table[~cross] = -1
    table[~cross, 0] = 0
    taken = table >= 0
    return taken.sum(axis=1), table[taken]

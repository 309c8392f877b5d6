"""Flow templates: a collective (or a class-to-class send) as phases of routed flows.

A template is built once per (group family, rank-class component, op, algorithm, root) and
reused for every issue of that op: each phase of the algorithm (:mod:`..collectives`) is
mapped from member indices to the devices of *every* group instance the classes touch, each
flow routed over the topology. Only the byte count changes between issues, and every phase's
bytes are linear in the collective's size, so a template stores bytes per collective byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError
from ...topologies import Topology
from ..collectives import get_algorithm
from .network import FlowNetwork

__all__ = ["PhaseFlows", "FlowTemplate", "RouteTable", "collective_template", "p2p_template"]


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

    @property
    def first_links(self) -> np.ndarray:
        """The first link of every flow of every phase (they name the flows' domains)."""
        got = self.cache.get("first_links")
        if got is None:
            firsts = [ph.edges[:, 0] for ph in self.phases if len(ph.edges)]
            got = np.unique(np.concatenate(firsts)) if firsts else np.empty(0, dtype=np.int64)
            self.cache["first_links"] = got
        return got


class RouteTable:
    """Routes between devices, cached as padded link-id rows, joined into network domains."""

    def __init__(self, topology: Topology, network: FlowNetwork):
        self.topology = topology
        self.network = network
        self._cache: dict[tuple[int, int], tuple[tuple[int, ...], float]] = {}

    def lookup(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Padded link-id rows (k, w) and path latencies (k,) of flows ``src[i] → dst[i]``."""
        topo, cache = self.topology, self._cache
        routes, latency, fresh = [], np.empty(len(src)), []
        for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
            hit = cache.get((a, b))
            if hit is None:
                path = topo.route(a, b, 0)
                hit = (path, topo.path_latency_s(path))
                cache[(a, b)] = hit
                fresh.append(path)
            routes.append(hit[0])
            latency[i] = hit[1]
        width = max(1, max((len(r) for r in routes), default=1))
        edges = np.full((len(routes), width), self.network.pad, dtype=np.int64)
        for i, r in enumerate(routes):
            edges[i, :len(r)] = r
        if fresh:
            self.network.join([np.asarray(r, dtype=np.int64) for r in fresh])
        return edges, latency


def _phase_flows(routes: RouteTable, src: np.ndarray, dst: np.ndarray, bytes_per_byte: float,
                 repeat: int, latency_steps: int, weights: np.ndarray | None = None
                 ) -> PhaseFlows:
    """Flows ``src[i, k] → dst[i, k]`` of instances i, duplicates merged; with ``weights``
    (per pair k), flow k carries ``weights[k]`` × the phase's bytes and none are merged."""
    n_inst, k = src.shape
    inst = np.repeat(np.arange(n_inst), k)
    keys = np.stack([inst, src.ravel(), dst.ravel()], axis=1)
    if weights is None:
        keys, mult = np.unique(keys, axis=0, return_counts=True)
        weight = None
    else:  # rows are instance-major already; every message is its own flow
        mult = np.ones(len(keys), dtype=np.int64)
        weight = np.tile(np.asarray(weights, dtype=np.float64), n_inst)
    edges, lat = routes.lookup(keys[:, 1], keys[:, 2])
    starts = np.searchsorted(keys[:, 0], np.arange(n_inst + 1))
    latency = np.zeros(n_inst)
    if len(keys):
        if latency_steps > 1 and latency_steps == k:  # a pipelined chain: hop after hop
            np.add.at(latency, keys[:, 0], lat * mult)
        else:
            np.maximum.at(latency, keys[:, 0], lat)
            latency *= latency_steps
    return PhaseFlows(edges, mult.astype(np.float64), starts, latency, float(bytes_per_byte),
                      int(repeat), weight)


def collective_template(routes: RouteTable, devices: np.ndarray, members: np.ndarray, op: str,
                        algorithm: str, root: int, g: int, name: str,
                        weights: np.ndarray | None = None) -> FlowTemplate:
    """Phases of ``algorithm`` for ``op`` on every row of ``members`` (ranks), rooted at
    member ``root``; ``g`` members per node as the algorithms assume (node-major).
    ``weights[i, j]``: the share of the op's bytes member i sends to member j (uneven
    all-to-all), laid out by the algorithm's uneven form."""
    p = members.shape[1]
    rotated = np.roll(members, -root, axis=1) if root else members
    algo = get_algorithm(op, algorithm)
    if weights is not None and algo.uneven_phases is None:
        raise ConfigError(f"collective {name!r}: algorithm {algorithm!r} has no form for "
                          "uneven (split_bytes) sizes; choose another algorithm")
    try:
        phases = algo.phases(1.0, p, g) if weights is None else algo.uneven_phases(weights, g)
    except ValueError as exc:
        raise ConfigError(f"collective {name!r}: algorithm {algorithm!r} cannot be laid out on a "
                          f"group of {p} ranks with {g} per node ({exc}); choose another "
                          "algorithm in parallel.collective_algorithm") from None
    dev = devices[rotated]
    out = []
    for ph in phases:
        pairs = np.asarray(ph.pairs, dtype=np.int64).reshape(-1, 2)
        out.append(_phase_flows(routes, dev[:, pairs[:, 0]], dev[:, pairs[:, 1]], ph.bytes,
                                ph.repeat, ph.latency_steps, ph.weights))
    return FlowTemplate(name, rotated, tuple(out))


def p2p_template(routes: RouteTable, devices: np.ndarray, src_ranks: np.ndarray,
                 dst_ranks: np.ndarray, name: str) -> FlowTemplate:
    """One instance, one phase: every ``src_ranks[i]`` sends to ``dst_ranks[i]`` at once."""
    src = devices[src_ranks][None, :]
    dst = devices[dst_ranks][None, :]
    phase = _phase_flows(routes, src, dst, 1.0, 1, 1)
    return FlowTemplate(name, np.asarray(src_ranks)[None, :], (phase,))

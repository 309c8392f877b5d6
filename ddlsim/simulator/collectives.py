"""Collective algorithms: closed-form α-β costs and their decomposition into phases of flows.

Both engines read this one module. The analytical engine calls :meth:`Algorithm.time` with a
:class:`GroupNet` (what the group's links look like from where its ranks sit). The
discrete-event engine replays :meth:`Algorithm.phases`: each :class:`Phase` is a set of
concurrent point-to-point transfers between *member indices* of the group, repeated ``repeat``
times, plus ``latency_steps`` per-message latencies. Without contention, replaying the phases
over the same links gives the closed form (this is tested).

Cost notation (Hockney / Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1)): ``p`` ranks, ``n`` bytes, per-message latency
α, per-byte time 1/B. Members are assumed node-major (``g`` consecutive members per node), which
is how ranks are placed by default.

Adding an algorithm is one function pair plus ``@register(op, name)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["GroupNet", "Phase", "Algorithm", "register", "get_algorithm", "algorithms_for",
           "collective_time", "best_algorithm", "BUSBW_FACTOR", "register_uneven",
           "split_matrix", "uneven_time", "best_uneven_algorithm"]


@dataclass(frozen=True, slots=True)
class GroupNet:
    """The links one group crosses, as the analytical engine sees them.

    Parameters
    ----------
    p : ranks in the group.
    g : members of the group per node, the most on any node (``p`` when it fits in one).
    alpha_intra_s, bw_intra_Bps : latency and per-device bandwidth inside a node.
    alpha_inter_s : latency of a message that crosses nodes (NIC + fabric).
    bw_node_Bps : bandwidth out of (and into) one node available to *this* group: the node's
        NICs divided among the groups of the same family that run at the same time there.
    """

    p: int
    g: int
    alpha_intra_s: float
    bw_intra_Bps: float
    alpha_inter_s: float = 0.0
    bw_node_Bps: float = math.inf
    nodes: int = 1

    @property
    def uniform(self) -> bool:
        """Every node holds exactly ``g`` members (needed by hierarchical algorithms)."""
        return self.nodes * self.g == self.p

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def ring_step(self, chunk: float) -> float:
        """One ring step: every member sends ``chunk`` to its successor; one flow per node
        leaves the node."""
        if not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + chunk / min(self.bw_intra_Bps, self.bw_node_Bps)

    def exchange_step(self, chunk: float, distance: int) -> float:
        """Every member sends ``chunk`` to the member ``distance`` away (recursive doubling,
        pairwise all-to-all): intra-node if the partner shares the node, else all ``g``
        members of a node send out at once and share its NICs."""
        if distance < self.g or not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + max(chunk / self.bw_intra_Bps, chunk * self.g / self.bw_node_Bps)

    def single_step(self, chunk: float, distance: int) -> float:
        """One member sends ``chunk`` to one other (a tree edge); no sharing."""
        if distance < self.g or not self.multi_node:
            return self.alpha_intra_s + chunk / self.bw_intra_Bps
        return self.alpha_inter_s + chunk / min(self.bw_intra_Bps, self.bw_node_Bps)

    @property
    def bottleneck_Bps(self) -> float:
        return min(self.bw_intra_Bps, self.bw_node_Bps) if self.multi_node else self.bw_intra_Bps

    @property
    def alpha_s(self) -> float:
        return self.alpha_inter_s if self.multi_node else self.alpha_intra_s


@dataclass(frozen=True, slots=True)
class Phase:
    """Concurrent transfers ``pairs[k] = (src_member, dst_member)`` of ``bytes`` each,
    repeated ``repeat`` times; ``latency_steps`` per-message latencies per repetition."""

    pairs: np.ndarray
    bytes: float
    repeat: int = 1
    latency_steps: int = 1
    weights: np.ndarray | None = None  # per pair: × bytes (uneven all-to-all)


TimeFn = Callable[[float, GroupNet], float]
PhaseFn = Callable[[float, int, int], list[Phase]]
#: ``time(B, net)``: seconds for the bytes matrix ``B[i, j]`` (member i sends to member j).
UnevenTimeFn = Callable[[np.ndarray, GroupNet], float]
#: ``phases(W, g)``: phases whose pairs carry ``W[i, j]`` bytes per collective byte.
UnevenPhaseFn = Callable[[np.ndarray, int], list[Phase]]


@dataclass(frozen=True, slots=True)
class Algorithm:
    op: str
    name: str
    time: TimeFn
    phases: PhaseFn
    uneven_time: UnevenTimeFn | None = None
    uneven_phases: UnevenPhaseFn | None = None


_REGISTRY: dict[tuple[str, str], Algorithm] = {}


def register(op: str, name: str) -> Callable[[TimeFn], TimeFn]:
    """Register ``time(n, net)``; the decorated function gets ``.phases`` set by
    :func:`phases_of` for the same key."""
    def wrap(fn: TimeFn) -> TimeFn:
        _REGISTRY[(op, name)] = Algorithm(op, name, fn, _NO_PHASES)
        return fn
    return wrap


def phases_of(op: str, name: str) -> Callable[[PhaseFn], PhaseFn]:
    def wrap(fn: PhaseFn) -> PhaseFn:
        a = _REGISTRY[(op, name)]
        _REGISTRY[(op, name)] = Algorithm(op, name, a.time, fn)
        return fn
    return wrap


def _NO_PHASES(n: float, p: int, g: int) -> list[Phase]:  # pragma: no cover - guard
    raise NotImplementedError("this algorithm has no phase decomposition")


def register_uneven(op: str, name: str, time: UnevenTimeFn, phases: UnevenPhaseFn) -> None:
    """Give the registered algorithm ``(op, name)`` its uneven (per-pair bytes) forms."""
    from dataclasses import replace
    _REGISTRY[(op, name)] = replace(_REGISTRY[(op, name)], uneven_time=time, uneven_phases=phases)


def get_algorithm(op: str, name: str) -> Algorithm:
    try:
        return _REGISTRY[(op, name)]
    except KeyError:
        raise ConfigError(f"no algorithm {name!r} for collective {op!r}; allowed: "
                          f"{', '.join(algorithms_for(op))}") from None


def algorithms_for(op: str) -> list[str]:
    return [name for (o, name) in _REGISTRY if o == op]


def collective_time(op: str, algorithm: str, nbytes: float, net: GroupNet) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests size convention) on ``net``."""
    if net.p <= 1:
        return 0.0
    return _REGISTRY[(op, algorithm)].time(nbytes, net)


def best_algorithm(op: str, nbytes: float, net: GroupNet) -> tuple[str, float]:
    """The cheapest registered algorithm for ``op`` (ties broken by name, deterministically)."""
    if net.p <= 1:
        return algorithms_for(op)[0], 0.0
    best = min((fn.time(nbytes, net), name) for (o, name), fn in _REGISTRY.items() if o == op)
    return best[1], best[0]


def split_matrix(split_bytes, by: str = "receiver") -> np.ndarray:
    """``B[i, j]``: bytes member i sends to member j (the diagonal stays on the device). With
    ``by="receiver"`` every member sends ``split_bytes[j]`` to member j (``B[i, j] = b_j``);
    with ``by="sender"`` member i sends ``split_bytes[i]`` to every member (``B[i, j] = b_i``),
    in group order (docs/trace.md)."""
    split = np.asarray(split_bytes, dtype=np.float64)
    matrix = np.tile(split, (len(split), 1))
    return matrix.T.copy() if by == "sender" else matrix


def uneven_time(op: str, algorithm: str, matrix: np.ndarray, net: GroupNet) -> float:
    """Seconds for ``op`` moving ``matrix[i, j]`` bytes from member i to member j, or inf if
    ``algorithm`` has no uneven form."""
    if net.p <= 1:
        return 0.0
    fn = _REGISTRY[(op, algorithm)].uneven_time
    return math.inf if fn is None else fn(matrix, net)


def best_uneven_algorithm(op: str, matrix: np.ndarray, net: GroupNet) -> tuple[str, float]:
    """The cheapest algorithm with an uneven form (ties broken by name)."""
    best = min((uneven_time(op, name, matrix, net), name) for (o, name) in _REGISTRY if o == op
               and _REGISTRY[(o, name)].uneven_time is not None)
    return best[1], best[0]


#: nccl-tests bus-bandwidth factors (``busbw = algbw × factor``), nccl-tests doc/PERFORMANCE.md.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "barrier": lambda p: 1.0,
}


def _log2(p: int) -> int:
    return max(1, math.ceil(math.log2(p)))


def _ring_pairs(p: int) -> np.ndarray:
    i = np.arange(p)
    return np.stack([i, (i + 1) % p], axis=1)


def _xor_pairs(p: int, d: int) -> np.ndarray:
    i = np.arange(p)
    j = i ^ d
    keep = j < p
    return np.stack([i[keep], j[keep]], axis=1)


# ------------------------------------------------------------------ all_reduce
@register("all_reduce", "ring")
def _ar_ring(n: float, net: GroupNet) -> float:
    """2(p−1) ring steps of n/p: 2(p−1)α + 2(p−1)/p · n/B (Patarasuk & Yuan 2009)."""
    return 2 * (net.p - 1) * net.ring_step(n / net.p)


@phases_of("all_reduce", "ring")
def _ar_ring_ph(n: float, p: int, g: int) -> list[Phase]:
    return [Phase(_ring_pairs(p), n / p, repeat=2 * (p - 1))]


@register("all_reduce", "tree")
def _ar_tree(n: float, net: GroupNet) -> float:
    """Binomial reduce then binomial broadcast, unpipelined: 2⌈log2 p⌉ (α + n/B)."""
    return _reduce_binomial(n, net) + _reduce_binomial(n, net)


@phases_of("all_reduce", "tree")
def _ar_tree_ph(n: float, p: int, g: int) -> list[Phase]:
    up = _binomial_phases(n, p, toward_root=True)
    return up + _binomial_phases(n, p, toward_root=False)


@register("all_reduce", "double_binary_tree")
def _ar_dbt(n: float, net: GroupNet) -> float:
    """NCCL's pipelined double binary tree: 2⌈log2 p⌉α + 2·n/B (each rank moves n up and
    n down across its two trees; Sanders, Speck & Träff 2009)."""
    return 2 * _log2(net.p) * net.alpha_s + 2 * n / net.bottleneck_Bps


@phases_of("all_reduce", "double_binary_tree")
def _ar_dbt_ph(n: float, p: int, g: int) -> list[Phase]:
    # pipelined: every tree edge busy at once; approximated as a chain up and a chain down
    up = np.stack([np.arange(1, p), np.arange(0, p - 1)], axis=1)
    return [Phase(up, n, 1, latency_steps=_log2(p)), Phase(up[:, ::-1].copy(), n, 1, _log2(p))]


@register("all_reduce", "recursive_doubling")
def _ar_rd(n: float, net: GroupNet) -> float:
    """⌈log2 p⌉ exchanges of the full vector: ⌈log2 p⌉ (α + n/B)."""
    return sum(net.exchange_step(n, 1 << k) for k in range(_log2(net.p)))


@phases_of("all_reduce", "recursive_doubling")
def _ar_rd_ph(n: float, p: int, g: int) -> list[Phase]:
    return [Phase(_xor_pairs(p, 1 << k), n) for k in range(_log2(p))]


@register("all_reduce", "rabenseifner")
def _ar_rab(n: float, net: GroupNet) -> float:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather:
    2 log2 p · α + 2 (p−1)/p · n/B (Rabenseifner 2004)."""
    return 2 * _rs_halving(n, net)


@phases_of("all_reduce", "rabenseifner")
def _ar_rab_ph(n: float, p: int, g: int) -> list[Phase]:
    half = _halving_phases(n, p)
    return half + half[::-1]


@register("all_reduce", "hierarchical")
def _ar_hier(n: float, net: GroupNet) -> float:
    """Intra-node ring reduce-scatter, inter-node ring all-reduce of n/g on g parallel rings
    (one per local member), intra-node ring all-gather. Needs the same number of members on
    every node."""
    if not net.uniform:
        return math.inf
    g, nodes = net.g, net.nodes
    intra = GroupNet(g, g, net.alpha_intra_s, net.bw_intra_Bps, nodes=1)
    t = 2 * (g - 1) * intra.ring_step(n / g) if g > 1 else 0.0
    if nodes > 1:
        chunk = n / g / nodes
        step = net.alpha_inter_s + max(chunk / net.bw_intra_Bps, chunk * g / net.bw_node_Bps)
        t += 2 * (nodes - 1) * step
    return t


def _hier_pairs(p: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Ring pairs inside each node, and rings across nodes (one per local member)."""
    idx = np.arange(p).reshape(max(1, p // g), g)
    intra = np.stack([idx.ravel(), np.roll(idx, -1, axis=1).ravel()], axis=1)
    inter = np.stack([idx.ravel(), np.roll(idx, -1, axis=0).ravel()], axis=1)
    return intra, inter


def _hier_rs_ph(n: float, p: int, g: int, inter_repeat: int = 1) -> list[Phase]:
    nodes = max(1, p // g)
    intra, inter = _hier_pairs(p, g)
    out = [Phase(intra, n / g, repeat=g - 1)] if g > 1 else []
    if nodes > 1:
        out.append(Phase(inter, n / g / nodes, repeat=inter_repeat * (nodes - 1)))
    return out


@phases_of("all_reduce", "hierarchical")
def _ar_hier_ph(n: float, p: int, g: int) -> list[Phase]:
    out = _hier_rs_ph(n, p, g, inter_repeat=2)
    return out + out[:1] if g > 1 else out


# ------------------------------------------------------ reduce_scatter / all_gather
def _rs_ring(n: float, net: GroupNet) -> float:
    """(p−1) ring steps of n/p: (p−1)α + (p−1)/p · n/B."""
    return (net.p - 1) * net.ring_step(n / net.p)


def _rs_halving(n: float, net: GroupNet) -> float:
    """log2 p steps, the k-th exchanging n/2^(k+1) with the member 2^k away."""
    return sum(net.exchange_step(n / (2 << k), 1 << k) for k in range(_log2(net.p)))


def _halving_phases(n: float, p: int) -> list[Phase]:
    return [Phase(_xor_pairs(p, 1 << k), n / (2 << k)) for k in range(_log2(p))]


def _rs_hier(n: float, net: GroupNet) -> float:
    """Intra-node ring, then g parallel inter-node rings on n/g (uniform placement only)."""
    if not net.uniform:
        return math.inf
    g, nodes = net.g, net.nodes
    intra = GroupNet(g, g, net.alpha_intra_s, net.bw_intra_Bps, nodes=1)
    t = (g - 1) * intra.ring_step(n / g) if g > 1 else 0.0
    if nodes > 1:
        chunk = n / g / nodes
        t += (nodes - 1) * (net.alpha_inter_s + max(chunk / net.bw_intra_Bps,
                                                    chunk * g / net.bw_node_Bps))
    return t


for _op in ("reduce_scatter", "all_gather"):
    register(_op, "ring")(_rs_ring)
    phases_of(_op, "ring")(lambda n, p, g: [Phase(_ring_pairs(p), n / p, repeat=p - 1)])
    register(_op, "recursive_halving" if _op == "reduce_scatter" else "recursive_doubling")(_rs_halving)
    phases_of(_op, "recursive_halving" if _op == "reduce_scatter" else "recursive_doubling")(
        lambda n, p, g: _halving_phases(n, p))
    register(_op, "hierarchical")(_rs_hier)


phases_of("reduce_scatter", "hierarchical")(_hier_rs_ph)
phases_of("all_gather", "hierarchical")(lambda n, p, g: _hier_rs_ph(n, p, g)[::-1])


# ------------------------------------------------------------------ rooted ops
def _binomial_phases(n: float, p: int, toward_root: bool) -> list[Phase]:
    rounds = []
    for k in range(_log2(p)):
        d = 1 << k
        src = np.arange(d, p, 2 * d)
        pairs = np.stack([src, src - d], axis=1)
        rounds.append(Phase(pairs, n))
    if not toward_root:
        rounds = [Phase(ph.pairs[:, ::-1].copy(), ph.bytes) for ph in reversed(rounds)]
    return rounds


@register("reduce", "binomial")
def _reduce_binomial(n: float, net: GroupNet) -> float:
    """⌈log2 p⌉ rounds of the full vector: ⌈log2 p⌉ (α + n/B), round k crossing distance 2^k."""
    return sum(net.single_step(n, 1 << k) for k in range(_log2(net.p)))


@register("reduce", "ring")
def _reduce_chain(n: float, net: GroupNet) -> float:
    """Pipelined chain toward the root: (p−1)α + n/B (every chain link busy at once)."""
    inter_hops = net.nodes - 1 if net.multi_node else 0
    return (inter_hops * net.alpha_inter_s + (net.p - 1 - inter_hops) * net.alpha_intra_s
            + n / net.bottleneck_Bps)


@register("reduce", "direct")
def _reduce_direct(n: float, net: GroupNet) -> float:
    """Every member sends n to the root at once: the root's links carry (p−1)·n."""
    t = (net.p - 1) * n / net.bw_intra_Bps
    if net.multi_node:
        t = max(t, (net.p - net.g) * n / net.bw_node_Bps)
    return net.alpha_s + t


def _chain_pairs(p: int) -> np.ndarray:
    return np.stack([np.arange(1, p), np.arange(0, p - 1)], axis=1)


def _star_pairs(p: int) -> np.ndarray:
    return np.stack([np.arange(1, p), np.zeros(p - 1, dtype=np.int64)], axis=1)


phases_of("reduce", "binomial")(lambda n, p, g: _binomial_phases(n, p, toward_root=True))
phases_of("reduce", "ring")(lambda n, p, g: [Phase(_chain_pairs(p), n, 1, latency_steps=p - 1)])
phases_of("reduce", "direct")(lambda n, p, g: [Phase(_star_pairs(p), n)])

for _name, _fn in (("binomial", _reduce_binomial), ("ring", _reduce_chain), ("direct", _reduce_direct)):
    register("broadcast", _name)(_fn)
phases_of("broadcast", "binomial")(lambda n, p, g: _binomial_phases(n, p, toward_root=False))
phases_of("broadcast", "ring")(
    lambda n, p, g: [Phase(_chain_pairs(p)[:, ::-1].copy(), n, 1, latency_steps=p - 1)])
phases_of("broadcast", "direct")(lambda n, p, g: [Phase(_star_pairs(p)[:, ::-1].copy(), n)])


@register("broadcast", "scatter_allgather")
def _bcast_sag(n: float, net: GroupNet) -> float:
    """Binomial scatter then ring all-gather (van de Geijn): (log2 p + p−1)α + 2(p−1)/p·n/B."""
    return _gather_binomial(n, net) + _rs_ring(n, net)


@phases_of("broadcast", "scatter_allgather")
def _bcast_sag_ph(n: float, p: int, g: int) -> list[Phase]:
    return _gather_binomial_ph(n, p, g, scatter=True) + [Phase(_ring_pairs(p), n / p, repeat=p - 1)]


@register("gather", "binomial")
def _gather_binomial(n: float, net: GroupNet) -> float:
    """Round k moves 2^k blocks of n/p: ⌈log2 p⌉α + (p−1)/p · n/B."""
    return sum(net.single_step(n / net.p * (1 << k), 1 << k) for k in range(_log2(net.p)))


def _gather_binomial_ph(n: float, p: int, g: int, scatter: bool = False) -> list[Phase]:
    out = []
    for k in range(_log2(p)):
        d = 1 << k
        src = np.arange(d, p, 2 * d)
        pairs = np.stack([src, src - d], axis=1)
        out.append(Phase(pairs[:, ::-1].copy() if scatter else pairs, n / p * d))
    return out[::-1] if scatter else out


@register("gather", "direct")
def _gather_direct(n: float, net: GroupNet) -> float:
    """Every member sends its n/p block to the root at once."""
    return _reduce_direct(n / net.p, net)


phases_of("gather", "binomial")(lambda n, p, g: _gather_binomial_ph(n, p, g))
phases_of("gather", "direct")(lambda n, p, g: [Phase(_star_pairs(p), n / p)])
register("scatter", "binomial")(_gather_binomial)
register("scatter", "direct")(_gather_direct)
phases_of("scatter", "binomial")(lambda n, p, g: _gather_binomial_ph(n, p, g, scatter=True))
phases_of("scatter", "direct")(lambda n, p, g: [Phase(_star_pairs(p)[:, ::-1].copy(), n / p)])


# ------------------------------------------------------------------ all_to_all, barrier
@register("all_to_all", "pairwise")
def _a2a_pairwise(n: float, net: GroupNet) -> float:
    """p−1 steps; in step k each member sends n/p to member (i+k) mod p."""
    return sum(net.exchange_step(n / net.p, k) for k in range(1, net.p))


@phases_of("all_to_all", "pairwise")
def _a2a_pairwise_ph(n: float, p: int, g: int) -> list[Phase]:
    i = np.arange(p)
    return [Phase(np.stack([i, (i + k) % p], axis=1), n / p) for k in range(1, p)]


@register("all_to_all", "direct")
def _a2a_direct(n: float, net: GroupNet) -> float:
    """All p−1 messages at once: each device link carries (p−1)/p·n; each node's NICs carry
    g·(p−g)/p·n."""
    chunk = n / net.p
    t = (net.p - 1) * chunk / net.bw_intra_Bps
    if net.multi_node:
        t = max(t, net.g * (net.p - net.g) * chunk / net.bw_node_Bps)
    return net.alpha_s + t


@phases_of("all_to_all", "direct")
def _a2a_direct_ph(n: float, p: int, g: int) -> list[Phase]:
    i, j = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    mask = i != j
    return [Phase(np.stack([i[mask], j[mask]], axis=1), n / p)]


def _off_diagonal(B: np.ndarray) -> np.ndarray:
    return B - np.diag(np.diag(B))


def _a2a_pairwise_uneven(B: np.ndarray, net: GroupNet) -> float:
    """Step k moves ``B[i, (i+k) mod p]`` for every i at once and lasts as long as its largest
    message: ``Σ_k exchange_step(max_i B[i, i+k])``. With one hot receiver h (``B[i, h] = k·s``)
    every step holds one message to h, so the time is ``(p−1)(α + k·s/bw)``, i.e.
    ``max_j Σ_i B[i, j] / bw`` plus p−1 latencies."""
    p, i = net.p, np.arange(net.p)
    return sum(net.exchange_step(float(B[i, (i + k) % p].max()), k) for k in range(1, p))


def _a2a_pairwise_uneven_ph(W: np.ndarray, g: int) -> list[Phase]:
    p, out = len(W), []
    for k in range(1, p):
        i = np.arange(p)
        i = i[W[i, (i + k) % p] > 0]  # empty messages are not sent
        out.append(Phase(np.stack([i, (i + k) % p], axis=1), 1.0, weights=W[i, (i + k) % p]))
    return out


def _a2a_direct_uneven(B: np.ndarray, net: GroupNet) -> float:
    """All messages at once: ``α + max(max_i max(Σ_j B[i, j], Σ_j B[j, i]) / bw_device,
    max_node (bytes leaving or entering the node) / bw_node)``, members node-major, ``g`` per
    node; the diagonal stays on the device. Uniform ``B`` gives :func:`_a2a_direct`."""
    off = _off_diagonal(B)
    t = max(off.sum(axis=1).max(), off.sum(axis=0).max()) / net.bw_intra_Bps
    if net.multi_node:
        node = np.arange(net.p) // net.g
        cross = np.where(node[:, None] != node[None, :], B, 0.0)
        out, into = np.bincount(node, cross.sum(axis=1)), np.bincount(node, cross.sum(axis=0))
        t = max(t, max(out.max(), into.max()) / net.bw_node_Bps)
    return net.alpha_s + t


def _a2a_direct_uneven_ph(W: np.ndarray, g: int) -> list[Phase]:
    i, j = np.nonzero(_off_diagonal(W) > 0)
    return [Phase(np.stack([i, j], axis=1), 1.0, weights=W[i, j])]


register_uneven("all_to_all", "pairwise", _a2a_pairwise_uneven, _a2a_pairwise_uneven_ph)
register_uneven("all_to_all", "direct", _a2a_direct_uneven, _a2a_direct_uneven_ph)


@register("barrier", "dissemination")
def _barrier(n: float, net: GroupNet) -> float:
    """⌈log2 p⌉ rounds of zero-byte messages (Hensgen, Finkel & Manber 1988)."""
    return sum(net.single_step(0.0, 1 << k) for k in range(_log2(net.p)))


@phases_of("barrier", "dissemination")
def _barrier_ph(n: float, p: int, g: int) -> list[Phase]:
    i = np.arange(p)
    return [Phase(np.stack([i, (i + (1 << k)) % p], axis=1), 0.0) for k in range(_log2(p))]

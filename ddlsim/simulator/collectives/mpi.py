"""The generic (MPI-style) collective algorithms: α-β closed forms and their phases of flows.

Cost notation (Hockney / Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1)): ``p`` ranks, ``n`` bytes, per-message latency
α, per-byte time 1/B. Members are assumed node-major (``g`` consecutive members per node), which
is how ranks are placed by default. These are the algorithms of ``collectives.backend: mpi``;
NCCL's are in :mod:`ddlsim.simulator.collectives.nccl`.
"""

from __future__ import annotations

import math

import numpy as np

from .base import (GroupNet, Phase, _log2, _ring_pairs, _xor_pairs,
                   phases_of, register, register_uneven)

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
def _a2a_direct(n: float, net: GroupNet, device_share: float = 1.0) -> float:
    """All p−1 messages at once: each device link carries (p−1)/p·n (at ``device_share`` of
    its rate: a library that fills only that share, NCCL's ``nccl_p2p``); each node's NICs
    carry g·(p−g)/p·n."""
    chunk = n / net.p
    t = (net.p - 1) * chunk / (net.bw_intra_Bps * device_share)
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


def _a2a_direct_uneven(B: np.ndarray, net: GroupNet, device_share: float = 1.0) -> float:
    """All messages at once: ``α + max(max_i max(Σ_j B[i, j], Σ_j B[j, i]) / (bw_device ·
    device_share), max_node (bytes leaving or entering the node) / bw_node)``, members
    node-major, ``g`` per node; the diagonal stays on the device. Uniform ``B`` gives
    :func:`_a2a_direct` (``device_share`` < 1: a library that fills only that share of the
    device link, NCCL's ``nccl_p2p``)."""
    off = _off_diagonal(B)
    t = max(off.sum(axis=1).max(), off.sum(axis=0).max()) / (net.bw_intra_Bps * device_share)
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


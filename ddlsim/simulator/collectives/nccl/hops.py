"""The time the steps of NCCL's ring LL take as nccl-tests measures them (one NVLink step, one
network step, and the network steps a ring makes), where they differ from NCCL's tuning model.

NCCL's estimate of a ring collective's latency (``ncclTopoTuneModel``, src/graph/tuning.cc of
NCCL 2.30.7, lines 394–412) is ``baseLat + (nsteps − nInterSteps)·intraLat +
nInterSteps·interLat``, with one NVLink step of the LL protocol at ``hwLat[NVLINK][RING][LL]``
= 0.6 µs for every GPU generation (line 159; 0.47 µs up to NCCL 2.16, line 65 of v2.16.5-1).
A message of a few bytes is all latency, so nccl-tests' time at 8 B reads the step off: on a
DGX A100 the forced ring at 2–8 GPUs on one channel takes 10.0–33.7 µs (NVIDIA/nccl-tests#123),
about 3.8 µs more for each GPU (two more steps): 1.9 µs a step, three times NCCL's 0.6. On H100 the published 8-GPU times
(DeepEP#303: 12.5 µs all-reduce, 10.6 µs all-gather at 8–128 B) are at or below NCCL's
estimate, so Hopper keeps it. nccl-tests#123 ran one process for all its GPUs (``-g <gpus>``),
so its slope may be, in part, the host launching one kernel a GPU (4.2 µs a GPU reads its 4–8
GPU rows within 1 %); its rows cannot tell the two apart.

The measured step replaces NCCL's in the **time taken** only; NCCL still chooses by its own
estimate (:mod:`.choice`). It applies to the ring's NVLink steps of the LL protocol; on several
nodes NCCL's own floor of a step (``netOverhead``, 1 µs on Intel, 2 µs on AMD CPUs: tuning.cc
lines 228–233 and 405–410) still applies to both. LL128 and Simple keep NCCL's steps (no published
measurement isolates them), as does the tree.

Across nodes the ring LL's time taken also counts its **network steps as the ring's code
makes them**, at a network step as measured. The LL protocol forwards each 8-byte line as it
lands (``ncclLLFifoLine``), so a message of a few bytes takes the sum of the steps along its
longest path: one chunk's ``nsteps`` consecutive hops around a ring of ``p`` GPUs that crosses
the network once every ``p / nodes`` hops (src/device/all_reduce.h ``runRing``: ``2(p − 1)``
hops for an all-reduce, ``p − 1`` for an all-gather or reduce-scatter). The chunk that starts
just after a network crossing crosses ``⌈nsteps / (p / nodes)⌉`` times (:func:`ring_crossings`:
an all-reduce on 2 nodes of 8 crosses 4 times, on 2 nodes of 1 twice), where NCCL 2.30.7's
estimate counts ``2(nodes − 1)`` (tuning.cc line 411; ``2·nodes`` up to NCCL 2.22). Each
network step takes :data:`NET_LL_HOP_US`, measured, where NCCL's estimate has 2.7 µs (5.0 µs
with one GPU a node: ``hwLat[NET][RING or TREE][LL]``); the other steps keep their NVLink step
as above. On two DGX A100 (NCCL_ALGO=Ring, 8–512 B: nccl#812, held out) this takes 26 NVLink
steps at the AMD host's 2 µs floor and 4 network steps, 85 µs against 93 measured, where
NCCL's estimate reads 68. LL128, Simple, the tree and NVLS keep NCCL's network steps (no
published small-message curve isolates them).

Fitted constants (each names the rows of ``benchmarks/data/nccl_tests_published.csv`` it was
fitted to; ``python benchmarks/validate_nccl.py --fit`` prints the fits): :data:`LL_HOP_US`,
:data:`NET_LL_HOP_US`.
"""

from __future__ import annotations

import math

from . import tuning as T
from .versions import DEFAULT_VERSION, tables

__all__ = ["LL_HOP_US", "NET_LL_HOP_US", "fit_ll_hop_us", "fit_net_ll_hop_us", "ring_crossings",
           "ring_ll_extra_us", "ring_ll_levels", "ring_steps", "nccl_inter_steps"]

#: µs one NVLink step of the ring's LL protocol takes, per GPU generation (others: NCCL's
#: 0.6). FITTED to rows ``nccl123`` (DGX A100, NCCL_ALGO=Ring, NCCL_MAX_NCHANNELS=1, 8 B, 2–8
#: GPUs): the least-squares slope of ``time − baseLat[RING][LL]`` (6.6 µs, NCCL's own base)
#: over ``2(p − 1)`` steps, :func:`fit_ll_hop_us`, rounded to 0.001 µs.
LL_HOP_US = {"ampere": 1.877}

#: µs one network step of the ring's LL protocol takes (the proxy's RDMA write of the lines
#: and the peer GPU's poll of their flags; whether GPUDirect RDMA was on is not stated).
#: FITTED to rows ``nccl150`` (2 nodes of 8 A100-80GB on HDR InfiniBand, one GPU of each,
#: all-reduce 8–64 B):
#: the least-squares step of ``time − baseLat[RING][LL]`` over the ring's 2 network steps,
#: :func:`fit_net_ll_hop_us`, rounded to 0.001 µs. One cluster, one NCCL of mid-2023: the
#: same for every GPU generation (the step is the NIC's and the proxy's, not the GPU's).
NET_LL_HOP_US = 6.586


def fit_ll_hop_us(points: list[tuple[int, float]]) -> float:
    """The least-squares step (µs) of ring all-reduces of a few bytes on one node.

    Parameters
    ----------
    points : (GPUs, time in µs) of each measurement.

    Returns
    -------
    float
        ``h`` minimising ``Σ (t − baseLat − 2(p − 1)·h)²``, with NCCL's ring LL base latency.
    """
    base = T.BASE_LATENCY_US["ring"][T.PROTOCOLS.index("LL")]
    steps = [2 * (p - 1) for p, _ in points]
    num = sum(s * (t - base) for s, (_, t) in zip(steps, points))
    return num / sum(s * s for s in steps)


def fit_net_ll_hop_us(points: list[tuple[int, int, float]]) -> float:
    """The least-squares network step (µs) of ring all-reduces of a few bytes, one GPU a node.

    Parameters
    ----------
    points : (GPUs, nodes, time in µs) of each measurement; one GPU a node (``GPUs == nodes``),
        so that every step of the ring crosses the network.

    Returns
    -------
    float
        ``h`` minimising ``Σ (t − baseLat − c·h)²``, ``c`` the network steps of the ring
        (:func:`ring_crossings`), with NCCL's ring LL base latency.

    Raises
    ------
    ValueError
        Where a point has more than one GPU a node (its steps are not all network steps).
    """
    if any(p != nodes for p, nodes, _ in points):
        raise ValueError(f"points {points!r}: the network step is fitted to one GPU a node "
                         "(GPUs == nodes)")
    base = T.BASE_LATENCY_US["ring"][T.PROTOCOLS.index("LL")]
    steps = [ring_crossings("all_reduce", p, nodes) for p, nodes, _ in points]
    num = sum(c * (t - base) for c, (_, _, t) in zip(steps, points))
    return num / sum(c * c for c in steps)


def ring_steps(op: str, p: int) -> int:
    """Steps of a ring collective over ``p`` ranks: one chunk's hops around the ring
    (src/device/all_reduce.h ``runRing``), ``2(p − 1)`` for an all-reduce, ``p − 1`` for an
    all-gather or reduce-scatter, ``p`` for a broadcast or reduce (tuning.cc ``nsteps``)."""
    return 2 * (p - 1) if op == "all_reduce" else p - 1 if op in ("all_gather",
                                                                    "reduce_scatter") else p


def ring_crossings(op: str, p: int, nodes: int) -> int:
    """Network steps on the longest path of a ring all-reduce, all-gather or reduce-scatter.

    Parameters
    ----------
    op : ``all_reduce``, ``all_gather`` or ``reduce_scatter``.
    p : ranks of the ring.
    nodes : nodes it spans (the ring crosses the network once every ``p / nodes`` hops).

    Returns
    -------
    int
        ``⌈nsteps / (p / nodes)⌉``: the crossings of the ``nsteps`` consecutive hops that start
        just after one (0 on one node).

    References
    ----------
    NVIDIA/nccl 2.30.7 src/device/all_reduce.h ``runRing`` (``2(p − 1)`` steps) and
    src/graph/tuning.cc line 411 (NCCL's own count, ``2(nodes − 1)``).
    """
    if nodes <= 1:
        return 0
    return math.ceil(ring_steps(op, p) * nodes / p - 1e-9)


def _intra_steps(op: str, p: int, nodes: int, per_node: bool = False) -> int:
    """Steps of a ring collective NCCL's latency counts at the NVLink rate (tuning.cc)."""
    if op in ("broadcast", "reduce"):
        return p if nodes == 1 else 0  # several nodes: every step at the network's latency
    return ring_steps(op, p) - nccl_inter_steps(op, nodes, per_node)


def nccl_inter_steps(op: str, nodes: int, per_node: bool = False) -> int:
    """Network steps NCCL's estimate of a ring all-reduce, all-gather or reduce-scatter
    counts: ``2(nodes − 1)`` or ``nodes − 1`` (2.30.7 tuning.cc line 411; from 2.23), or with
    ``per_node`` (before 2.23, v2.21.5-1 line 161) ``2·nodes`` for an all-reduce."""
    if nodes == 1:
        return 0
    if op == "all_reduce":
        return 2 * nodes if per_node else 2 * (nodes - 1)
    return nodes - 1


def ring_ll_extra_us(op: str, p: int, nodes: int, arch: str, intra: str, cpu: str,
                     version: str = DEFAULT_VERSION) -> float:
    """µs a ring LL collective takes beyond NCCL's estimate: its NVLink steps at the measured
    step (:data:`LL_HOP_US`) instead of NCCL's, each no less than NCCL's network floor, and
    across nodes its network steps as the ring makes them (:func:`ring_crossings`) at the
    measured network step (:data:`NET_LL_HOP_US`) instead of NCCL's count at its own step.

    Parameters
    ----------
    op : collective.
    p, nodes : ranks and nodes of the communicator.
    arch : GPU generation (``ampere``, ``hopper``, …).
    intra : ``nvlink`` or ``pci``.
    cpu : ``intel`` or ``amd``.
    version : the NCCL release whose estimate the measured steps replace (:mod:`.versions`).

    Returns
    -------
    float
        µs (0 where nothing was measured: one node without a measured NVLink step; broadcast
        and reduce, whose steps NCCL counts otherwise).

    References
    ----------
    NVIDIA/nccl 2.30.7 src/graph/tuning.cc lines 394–412; NVIDIA/nccl-tests#123 and #150.
    """
    ll, tab = T.PROTOCOLS.index("LL"), tables(version)
    nccl_hop = tab.hw_latency_us[intra]["ring"][ll]
    hop = LL_HOP_US.get(arch, nccl_hop) if intra == "nvlink" else nccl_hop
    floor = tab.net_overhead_us[cpu] if nodes > 1 else 0.0
    per_node = tab.inter_steps_per_node
    extra = _intra_steps(op, p, nodes, per_node) * (max(hop, floor) - max(nccl_hop, floor))
    if nodes == 1 or op not in ("all_reduce", "all_gather", "reduce_scatter"):
        return extra
    # NCCL: its network steps at its network step, the others at its intra step; taken:
    # the ring's crossings at the measured network step, the others at the intra step taken
    nccl_net = tab.hw_latency_us["net"]["tree" if p == nodes and tab.ppn1_tree_net
                                        else "ring"][ll]
    n_inter = nccl_inter_steps(op, nodes, per_node)
    more = ring_crossings(op, p, nodes) - n_inter
    return (extra + n_inter * (NET_LL_HOP_US - nccl_net)
            + more * (NET_LL_HOP_US - max(hop, floor)))


def ring_ll_levels(op: str, p: int, nodes: int, arch: str, intra: str, cpu: str, edges: int,
                   version: str = DEFAULT_VERSION
                   ) -> tuple[tuple[float, ...], tuple[float, ...], float] | None:
    """:func:`ring_ll_extra_us` as the ``(edges, fills, slope)`` levels the fills of
    :mod:`.measured` and :mod:`.tree` use (one level for every size, no cap), or None."""
    extra = ring_ll_extra_us(op, p, nodes, arch, intra, cpu, version)
    if extra == 0.0:
        return None
    return (math.inf,) * edges, (extra,) * (edges + 1), math.inf

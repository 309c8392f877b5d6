"""The time one LL step of NCCL's ring takes over NVLink as nccl-tests measures it, where it
differs from the step NCCL's tuning model assumes.

NCCL's estimate of a ring collective's latency (``ncclTopoTuneModel``, src/graph/tuning.cc of
NCCL 2.30.7, lines 394–412) is ``baseLat + (nsteps − nInterSteps)·intraLat +
nInterSteps·interLat``, with one NVLink step of the LL protocol at ``hwLat[NVLINK][RING][LL]``
= 0.6 µs for every GPU generation (line 159; 0.47 µs up to NCCL 2.16, line 65 of v2.16.5-1).
A message of a few bytes is all latency, so nccl-tests' time at 8 B reads the step off: on a
DGX A100 the forced ring at 2–8 GPUs on one channel takes 10.0–33.7 µs (NVIDIA/nccl-tests#123),
about 3.8 µs more for each GPU (two more steps): 1.9 µs a step, three times NCCL's 0.6. On H100 the published 8-GPU times
(DeepEP#303: 12.5 µs all-reduce, 10.6 µs all-gather at 8–128 B) are at or below NCCL's
estimate, so Hopper keeps it.

The measured step replaces NCCL's in the **time taken** only; NCCL still chooses by its own
estimate (:mod:`.choice`). It applies to the ring's NVLink steps of the LL protocol; on several
nodes NCCL's own floor of a step (``netOverhead``, 1 µs on Intel, 2 µs on AMD CPUs: tuning.cc
lines 228–233 and 405–410) still applies to both. LL128 and Simple keep NCCL's steps (no published
measurement isolates them), as do the network steps and the tree.

Fitted constant (it names the rows of ``benchmarks/data/nccl_tests_published.csv`` it was fitted
to; ``python benchmarks/validate_nccl.py --fit`` prints the fit): :data:`LL_HOP_US`.
"""

from __future__ import annotations

import math

from . import tuning as T

__all__ = ["LL_HOP_US", "fit_ll_hop_us", "ring_ll_extra_us", "ring_ll_levels"]

#: µs one NVLink step of the ring's LL protocol takes, per GPU generation (others: NCCL's
#: 0.6). FITTED to rows ``nccl123`` (DGX A100, NCCL_ALGO=Ring, NCCL_MAX_NCHANNELS=1, 8 B, 2–8
#: GPUs): the least-squares slope of ``time − baseLat[RING][LL]`` (6.6 µs, NCCL's own base)
#: over ``2(p − 1)`` steps, :func:`fit_ll_hop_us`, rounded to 0.001 µs.
LL_HOP_US = {"ampere": 1.877}


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


def _intra_steps(op: str, p: int, nodes: int) -> int:
    """Steps of a ring collective NCCL's latency counts at the NVLink rate (tuning.cc)."""
    if op in ("broadcast", "reduce"):
        return p if nodes == 1 else 0  # several nodes: every step at the network's latency
    nsteps = 2 * (p - 1) if op == "all_reduce" else p - 1
    n_inter = 0 if nodes == 1 else 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
    return nsteps - n_inter


def ring_ll_extra_us(op: str, p: int, nodes: int, arch: str, intra: str, cpu: str) -> float:
    """µs a ring LL collective takes beyond NCCL's estimate: its NVLink steps at the measured
    step (:data:`LL_HOP_US`) instead of NCCL's, each no less than NCCL's network floor.

    Parameters
    ----------
    op : collective.
    p, nodes : ranks and nodes of the communicator.
    arch : GPU generation (``ampere``, ``hopper``, …).
    intra : ``nvlink`` or ``pci``.
    cpu : ``intel`` or ``amd``.

    Returns
    -------
    float
        µs (0 where no step was measured).

    References
    ----------
    NVIDIA/nccl 2.30.7 src/graph/tuning.cc lines 394–412; NVIDIA/nccl-tests#123.
    """
    hop = LL_HOP_US.get(arch)
    if hop is None or intra != "nvlink":
        return 0.0
    nccl_hop = T.HW_LATENCY_US["nvlink"]["ring"][T.PROTOCOLS.index("LL")]
    floor = T.NET_OVERHEAD_US[cpu] if nodes > 1 else 0.0
    return _intra_steps(op, p, nodes) * (max(hop, floor) - max(nccl_hop, floor))


def ring_ll_levels(op: str, p: int, nodes: int, arch: str, intra: str, cpu: str,
                   edges: int) -> tuple[tuple[float, ...], tuple[float, ...], float] | None:
    """:func:`ring_ll_extra_us` as the ``(edges, fills, slope)`` levels the fills of
    :mod:`.measured` and :mod:`.tree` use (one level for every size, no cap), or None."""
    extra = ring_ll_extra_us(op, p, nodes, arch, intra, cpu)
    if extra == 0.0:
        return None
    return (math.inf,) * edges, (extra,) * (edges + 1), math.inf

"""Open MPI's own choice of collective algorithm (``system.collectives.backend: openmpi``).

With no dynamic rules file, Open MPI's ``coll/tuned`` component picks an algorithm per call
from fixed decision tables keyed by communicator size and message size. The tables below
re-express, as data, the commutative-operation branches of the ``*_intra_dec_fixed``
functions of ``ompi/mca/coll/tuned/coll_tuned_decision_fixed.c`` in open-mpi/ompi at commit
8efebee745e15516a7f5f1f295df86c78014c76c (2026-08-21), including the two "disjoint" tables
(``ompi_coll_tuned_allreduce_intra_disjoint_dec_fixed``,
``ompi_coll_tuned_bcast_intra_disjoint_dec_fixed``) that ``coll_tuned_module.c`` installs on
a communicator whose ranks all sit on different nodes (``max_local_peers == 1``; here
``GroupNet.g == 1``).

The size each function compares is Open MPI's own: the whole buffer for all-reduce,
broadcast, reduce and reduce-scatter (``MPI_Reduce_scatter``: the sum of the receive
counts), one rank's block for all-gather, all-to-all, gather and scatter (ddlsim's
nccl-tests size divided by ``p``). Each Open MPI algorithm is mapped onto the ddlsim
algorithm of the same cost structure; where ddlsim has none the closest is taken, as the
table in ``docs/collectives-openmpi.md`` lists. The fixed rules run the algorithms
unsegmented (segment size 0), which the mapping follows (an unsegmented chain or pipeline
is bandwidth-bound like the linear algorithm).
"""

from __future__ import annotations

import math

from .base import GroupNet, Phase, phases_of, register
from .mpi import _halving_phases, _rs_halving

__all__ = ["openmpi_algorithm", "TABLES", "NAMES"]

_INF = math.inf

#: the all-reduce rows from ``p_below`` 128 on, where the plain and the disjoint tables agree
_ALLREDUCE_LARGE = (
    (128, ((262144, 3), (_INF, 6))),
    (256, ((131072, 2), (262144, 3), (_INF, 6))),
    (512, ((4096, 2), (_INF, 6))),
    (2048, ((2048, 2), (16384, 3), (_INF, 6))),
    (4096, ((2048, 2), (4096, 5), (16384, 3), (_INF, 6))),
    (_INF, ((2048, 2), (16384, 5), (32768, 3), (_INF, 6))),
)

#: ``op -> ((p_below, ((bytes_below, algorithm id), ...)), ...)``: the first row whose
#: ``p_below`` exceeds the communicator size, then the first column whose ``bytes_below``
#: exceeds the compared size. Ids are Open MPI's (``coll_tuned_<op>_decision.c``).
TABLES: dict[str, tuple] = {
    "all_reduce": (  # ompi_coll_tuned_allreduce_intra_dec_fixed, commutative branch
        (4, ((8, 4), (4096, 3), (8192, 4), (16384, 3), (65536, 4), (262144, 5), (_INF, 6))),
        (8, ((16, 4), (8192, 3), (_INF, 6))),
        (16, ((8192, 3), (_INF, 6))),
        (32, ((64, 5), (4096, 3), (_INF, 6))),
        (64, ((128, 5), (_INF, 6))),
        *_ALLREDUCE_LARGE,
    ),
    "all_reduce/disjoint": (  # ..._allreduce_intra_disjoint_dec_fixed, commutative branch
        (3, ((_INF, 3),)),
        (4, ((_INF, 7),)),
        (8, ((1048576, 7), (_INF, 3))),
        (16, ((262144, 7), (1048576, 6), (_INF, 3))),
        (32, ((32768, 7), (131072, 2), (_INF, 6))),
        (65, ((32768, 7), (131072, 3), (_INF, 6))),
        *_ALLREDUCE_LARGE,
    ),
    "all_to_all": (  # ompi_coll_tuned_alltoall_intra_dec_fixed (per-peer block)
        (3, ((2, 2), (4, 5), (16, 2), (64, 5), (256, 2), (4096, 5), (32768, 2), (262144, 4),
             (1048576, 5), (_INF, 2))),
        (8, ((8192, 4), (16384, 1), (65536, 4), (524288, 1), (1048576, 2), (_INF, 1))),
        (16, ((262144, 4), (_INF, 1))),
        (32, ((4, 4), (512, 3), (8192, 4), (32768, 1), (262144, 4), (524288, 1), (_INF, 4))),
        (64, ((512, 3), (524288, 1), (_INF, 4))),
        (128, ((1024, 3), (2048, 1), (4096, 4), (262144, 1), (_INF, 2))),
        (256, ((1024, 3), (2048, 4), (262144, 1), (_INF, 2))),
        (512, ((1024, 3), (8192, 4), (32768, 1), (_INF, 2))),
        (1024, ((512, 3), (8192, 4), (16384, 1), (131072, 4), (262144, 1), (_INF, 2))),
        (2048, ((512, 3), (1024, 4), (2048, 1), (16384, 4), (262144, 1), (_INF, 4))),
        (4096, ((1024, 3), (4096, 4), (8192, 1), (131072, 4), (_INF, 1))),
        (_INF, ((2048, 3), (8192, 4), (16384, 1), (32768, 4), (65536, 1), (_INF, 4))),
    ),
    "barrier": (  # ompi_coll_tuned_barrier_intra_dec_fixed (size only)
        (4, ((_INF, 3),)), (8, ((_INF, 1),)), (64, ((_INF, 3),)), (256, ((_INF, 4),)),
        (512, ((_INF, 6),)), (1024, ((_INF, 4),)), (4096, ((_INF, 6),)), (_INF, ((_INF, 4),)),
    ),
    "broadcast": (  # ompi_coll_tuned_bcast_intra_dec_fixed
        (4, ((32, 3), (256, 5), (512, 3), (1024, 7), (32768, 1), (131072, 5), (262144, 2),
             (524288, 1), (1048576, 6), (_INF, 5))),
        (8, ((64, 5), (128, 6), (2048, 5), (8192, 6), (1048576, 1), (_INF, 2))),
        (16, ((8, 7), (64, 5), (4096, 7), (16384, 5), (32768, 6), (_INF, 1))),
        (32, ((4096, 7), (1048576, 6), (_INF, 8))),
        (64, ((2048, 6), (_INF, 7))),
        (128, ((_INF, 7),)),
        (256, ((2, 6), (16384, 5), (32768, 1), (65536, 5), (_INF, 7))),
        (1024, ((16384, 7), (32768, 4), (_INF, 7))),
        (2048, ((524288, 7), (_INF, 8))),
        (4096, ((262144, 7), (_INF, 8))),
        (_INF, ((8192, 7), (16384, 5), (262144, 7), (_INF, 8))),
    ),
    "broadcast/disjoint": (  # ompi_coll_tuned_bcast_intra_disjoint_dec_fixed
        (4, ((_INF, 1),)),
        (16, ((1048576, 1), (_INF, 5))),
        (32, ((262144, 1), (1048576, 7), (_INF, 5))),
        (_INF, ((65536, 1), (1048576, 7), (_INF, 5))),
    ),
    "reduce": (  # ompi_coll_tuned_reduce_intra_dec_fixed, commutative branch
        (4, ((8, 7), (16, 4), (32, 3), (262144, 1), (524288, 3), (1048576, 2), (_INF, 3))),
        (8, ((4096, 4), (65536, 2), (262144, 5), (524288, 1), (1048576, 5), (_INF, 1))),
        (16, ((8192, 4), (_INF, 5))),
        (32, ((4096, 4), (_INF, 5))),
        (256, ((_INF, 5),)),
        (512, ((8192, 5), (16384, 6), (_INF, 5))),
        (2048, ((_INF, 5),)),
        (4096, ((512, 5), (1024, 6), (8192, 5), (16384, 6), (_INF, 5))),
        (_INF, ((16, 5), (32, 6), (1024, 5), (2048, 6), (8192, 5), (16384, 6), (_INF, 5))),
    ),
    "reduce_scatter": (  # ompi_coll_tuned_reduce_scatter_intra_dec_fixed, commutative
        (4, ((65536, 3), (131072, 4), (_INF, 3))),
        (8, ((8, 1), (262144, 2), (_INF, 3))),
        (32, ((262144, 2), (_INF, 3))),
        (64, ((64, 1), (2048, 2), (524288, 4), (_INF, 3))),
        (128, ((256, 1), (512, 2), (2048, 4), (4096, 2), (_INF, 4))),
        (256, ((256, 1), (512, 2), (_INF, 4))),
        (512, ((256, 1), (1024, 2), (_INF, 4))),
        (1024, ((512, 1), (2048, 2), (8192, 4), (16384, 2), (_INF, 4))),
        (2048, ((512, 1), (4096, 2), (16384, 4), (32768, 2), (_INF, 4))),
        (4096, ((512, 1), (4096, 2), (_INF, 4))),
        (_INF, ((1024, 1), (8192, 2), (_INF, 4))),
    ),
    "all_gather": (  # ompi_coll_tuned_allgather_intra_dec_fixed (one rank's block)
        (3, ((_INF, 6),)),
        (32, ((_INF, 3),)),
        (64, ((1024, 3), (65536, 5), (_INF, 4))),
        (128, ((512, 3), (65536, 5), (_INF, 4))),
        (256, ((512, 3), (131072, 5), (524288, 4), (1048576, 5), (_INF, 4))),
        (512, ((32, 3), (128, 2), (1024, 3), (131072, 5), (524288, 4), (1048576, 5),
               (_INF, 4))),
        (1024, ((64, 3), (256, 2), (2048, 3), (_INF, 5))),
        (2048, ((4, 3), (8, 2), (16, 3), (32, 2), (256, 3), (512, 2), (4096, 3), (_INF, 5))),
        (4096, ((32, 2), (128, 3), (512, 2), (4096, 3), (_INF, 5))),
        (_INF, ((2, 3), (8, 2), (16, 3), (512, 2), (4096, 3), (_INF, 5))),
    ),
    "gather": (  # ompi_coll_tuned_gather_intra_dec_fixed (one rank's block)
        (4, ((2, 3), (4, 1), (32768, 2), (65536, 1), (131072, 2), (_INF, 3))),
        (8, ((1024, 2), (8192, 1), (32768, 2), (262144, 1), (_INF, 3))),
        (256, ((_INF, 2),)),
        (512, ((2048, 2), (8192, 1), (_INF, 2))),
        (_INF, ((_INF, 2),)),
    ),
    "scatter": (  # ompi_coll_tuned_scatter_intra_dec_fixed (one rank's block)
        (4, ((2, 3), (131072, 1), (262144, 3), (_INF, 1))),
        (8, ((2048, 2), (4096, 1), (8192, 2), (32768, 1), (1048576, 3), (_INF, 1))),
        (16, ((16384, 2), (1048576, 3), (_INF, 1))),
        (32, ((16384, 2), (32768, 1), (_INF, 3))),
        (64, ((512, 2), (8192, 3), (16384, 2), (_INF, 3))),
        (_INF, ((512, 2), (_INF, 3))),
    ),
}

#: Open MPI algorithm id -> the ddlsim algorithm that times it (docs/collectives-openmpi.md)
NAMES: dict[str, dict[int, str]] = {
    # 2 nonoverlapping = reduce then bcast; 5 segmented ring; 7 allgather + local reduce
    "all_reduce": {2: "tree", 3: "recursive_doubling", 4: "ring", 5: "ring",
                   6: "rabenseifner", 7: "allgather_reduce"},
    # 1 linear, 3 modified Bruck, 4 linear_sync (bounded requests), 5 two_proc
    "all_to_all": {1: "direct", 2: "pairwise", 3: "direct", 4: "direct", 5: "pairwise"},
    # linear, double ring, recursive doubling, Bruck, tree: all ⌈log2 p⌉-round-like here
    "barrier": {i: "dissemination" for i in range(1, 7)},
    # 1 linear, 2 chain and 3 pipeline unsegmented, 4 split binary, 5 binary, 6 binomial,
    # 7 k-nomial, 8 scatter + recursive-doubling allgather, 9 scatter + ring allgather
    "broadcast": {1: "direct", 2: "direct", 3: "direct", 4: "binomial", 5: "binomial",
                  6: "binomial", 7: "binomial", 8: "scatter_allgather",
                  9: "scatter_allgather"},
    # 1 linear, 2 chain and 3 pipeline unsegmented, 4 binary, 5 binomial, 6 in-order binary,
    # 7 Rabenseifner (reduce-scatter + gather; picked below 8 B only)
    "reduce": {1: "direct", 2: "direct", 3: "direct", 4: "binomial", 5: "binomial",
               6: "binomial", 7: "binomial"},
    # 1 non-overlapping (reduce + scatterv), 2 recursive halving, 3 ring, 4 butterfly
    "reduce_scatter": {1: "recursive_halving", 2: "recursive_halving", 3: "ring",
                       4: "recursive_halving"},
    # 2 Bruck, 3 recursive doubling, 4 ring, 5 neighbour exchange, 6 two_proc
    "all_gather": {2: "recursive_doubling", 3: "recursive_doubling", 4: "ring", 5: "ring",
                   6: "recursive_doubling"},
    "gather": {1: "direct", 2: "binomial", 3: "direct"},
    "scatter": {1: "direct", 2: "binomial", 3: "direct"},
}

#: ops whose decision compares one rank's block (``scount × size``), not the whole buffer
_PER_RANK = frozenset({"all_gather", "all_to_all", "gather", "scatter"})


def _lookup(table: tuple, p: int, size: float) -> int:
    """Open MPI's algorithm id for communicator size ``p`` and compared size ``size``."""
    row = next(cols for p_below, cols in table if p < p_below)
    return next(alg for size_below, alg in row if size < size_below)


def openmpi_id(op: str, nbytes: float, p: int, g: int) -> int | None:
    """Open MPI's algorithm id for ``op`` of ``nbytes`` (nccl-tests size) on ``p`` ranks with
    at most ``g`` on one node, or None for an op Open MPI's fixed rules do not cover."""
    disjoint = g == 1 and p > 1
    key = f"{op}/disjoint" if disjoint and f"{op}/disjoint" in TABLES else op
    if key not in TABLES:
        return None
    size = nbytes / p if op in _PER_RANK else nbytes
    return _lookup(TABLES[key], p, size)


def openmpi_algorithm(op: str, nbytes: float, p: int, g: int) -> str | None:
    """The ddlsim algorithm Open MPI's fixed ``coll/tuned`` rules pick.

    Parameters
    ----------
    op : the collective (``all_reduce``, ``all_gather``, …).
    nbytes : its size in bytes, nccl-tests convention (docs/trace.md); one rank's block,
        ``nbytes / p``, is what Open MPI compares for all-gather, all-to-all, gather, scatter.
    p : ranks in the group.
    g : most members of the group on one node; ``g == 1`` selects the disjoint tables.

    Returns
    -------
    str or None
        A registered algorithm of ``op``, or None where the rules name nothing ddlsim can
        time (the caller then takes the cheapest MPI algorithm, as for ``mpi``).
    """
    alg = openmpi_id(op, nbytes, p, g)
    return None if alg is None else NAMES[op].get(alg)


# ------------------------------------------------------------- allgather + local reduce
@register("all_reduce", "allgather_reduce", backend="openmpi")
def _ar_allgather_reduce(n: float, net: GroupNet) -> float:
    """Open MPI's ``allreduce_intra_allgather_reduce``: every rank gathers all p vectors
    (a recursive-doubling all-gather of p·n, Open MPI's all-gather below 32 ranks) and
    reduces locally: ⌈log2 p⌉α + (p−1)·n/B. The local reduction is not timed."""
    return _rs_halving(net.p * n, net)


@phases_of("all_reduce", "allgather_reduce")
def _ar_allgather_reduce_ph(n: float, p: int, g: int) -> list[Phase]:
    return _halving_phases(p * n, p)

"""MPICH's own choice of collective algorithm (``system.collectives.backend: mpich``).

MPICH picks an algorithm per call from a decision tree (its "CSEL" tuning file). These are
the rules of ``maint/tuning/coll/mpir/generic.json`` in pmodels/mpich at commit 6a79bf65
(2026-08-20), for intra-communicator calls with a built-in commutative operation, mapped onto
ddlsim's algorithms of the same cost structure:

* all-reduce: recursive doubling for messages of at most 8 B or fewer elements than the
  largest power of two ≤ p (``count<pow2``), else reduce-scatter + all-gather (Rabenseifner);
* all-gather: p a power of two: recursive doubling below 512 KiB in total, else ring;
  otherwise Bruck below 80 KiB (here recursive doubling: the same ⌈log2 p⌉ steps and bytes)
  and ring above;
* reduce-scatter: recursive halving below 512 KiB in total, else pairwise exchange (here ring:
  the same p − 1 steps of n/p);
* broadcast: binomial for p < 8 or at most 12,288 B, else scatter + all-gather;
* reduce: binomial up to 2,048 B or for fewer elements than the largest power of two ≤ p;
  MPICH's reduce-scatter + gather above is not in ddlsim, so the cheapest closed form is used.

Elements are counted as 4-byte words (MPI_FLOAT), the message size being all ddlsim knows.
Open MPI's ``coll/tuned`` fixed rules (``backend: openmpi``) are in :mod:`.openmpi`;
:func:`library_algorithm` dispatches to either. Any op without a rule (or a rule whose
algorithm cannot run on the group) takes the cheapest of the MPI algorithms, as ``mpi`` does.
"""

from __future__ import annotations

__all__ = ["mpich_algorithm", "library_algorithm", "LIBRARIES"]

_KIB = 1024
_WORD = 4  # bytes per element assumed for MPICH's ``count`` rules


def _pof2_below(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def mpich_algorithm(op: str, nbytes: float, p: int) -> str | None:
    """The ddlsim algorithm MPICH's generic rules pick for ``op`` of ``nbytes`` (nccl-tests
    size convention) on ``p`` ranks, or None where MPICH's choice has no counterpart."""
    count = nbytes / _WORD
    pow2 = p & (p - 1) == 0
    if op == "all_reduce":
        small = nbytes <= 8 or count < _pof2_below(p)
        return "recursive_doubling" if small else "rabenseifner"
    if op == "all_gather":
        if pow2:
            return "recursive_doubling" if nbytes < 512 * _KIB else "ring"
        return "recursive_doubling" if nbytes < 80 * _KIB else "ring"
    if op == "reduce_scatter":
        return "recursive_halving" if nbytes < 512 * _KIB else "ring"
    if op == "broadcast":
        return "binomial" if p < 8 or nbytes <= 12288 else "scatter_allgather"
    if op == "reduce" and (nbytes <= 2048 or count < _pof2_below(p)):
        return "binomial"
    return None


#: backends that choose among the MPI algorithms by an MPI library's own rules
LIBRARIES = ("mpich", "openmpi")


def library_algorithm(backend: str, op: str, nbytes: float, p: int, g: int) -> str | None:
    """The algorithm ``backend`` (one of :data:`LIBRARIES`) picks for ``op`` of ``nbytes`` on
    ``p`` ranks with at most ``g`` on one node, or None where its rules name none."""
    if backend == "openmpi":
        from .openmpi import openmpi_algorithm
        return openmpi_algorithm(op, nbytes, p, g)
    return mpich_algorithm(op, nbytes, p)

"""NCCL's own choice of algorithm and protocol: the least of its tuning model's *estimates*
(:func:`.model.estimate_time`), not of the times they then take (:func:`.model.nccl_time`),
registered as the ``nccl`` backend's chooser for ``auto``."""

from __future__ import annotations

import math

from ..base import GroupNet, register_chooser
from . import tuning as T
from .model import ALGORITHMS, NcclEnv, estimate_time

__all__ = ["NCCL_ORDER", "nccl_choice"]


#: NCCL's algorithm indices (v2.26.2-1 src/include/nccl_common.h lines 56–61: ``NCCL_ALGO_TREE``
#: 0, ``_RING`` 1, ``_COLLNET_DIRECT`` 2, ``_NVLS`` 4, ``_NVLS_TREE`` 5): its tuner scans them
#: in this order and keeps the first of equal estimates (enqueue.cc ``topoGetAlgoInfo``, line
#: 1703: ``table[a][p] < minTime``)
NCCL_ORDER = ("tree", "ring", "collnet", "nvls", "nvls_tree")


def nccl_choice(op: str, n: float, net: GroupNet, env: NcclEnv) -> tuple[str, str] | None:
    """The algorithm and protocol NCCL's tuner picks: the least estimate, not the least time.

    Parameters
    ----------
    op : collective (``all_reduce``, ``all_gather``, …).
    n : message size (bytes, nccl-tests convention).
    net : the group's links (:class:`~ddlsim.simulator.collectives.GroupNet`).
    env : the machine as NCCL's tuning model sees it.

    Returns
    -------
    tuple[str, str] or None
        (algorithm, protocol) of least :func:`~.model.estimate_time` (seconds), the first of
        equals in NCCL's scan order; None where no algorithm runs.

    References
    ----------
    NVIDIA/nccl v2.26.2-1, src/enqueue.cc ``topoGetAlgoInfo`` (lines 1691–1712).
    """
    protos = T.PROTOCOLS if env.protocol == "auto" else (env.protocol,)
    best, best_t = None, math.inf
    for algo in NCCL_ORDER:
        if algo not in ALGORITHMS.get(op, ()):
            continue
        for proto in protos:
            t = estimate_time(op, algo, proto, n, net, env)
            if t < best_t:
                best, best_t = (algo, proto), t
    return best


@register_chooser("nccl")
def _choose(op: str, n: float, net: GroupNet) -> str | None:
    """The registered NCCL algorithm NCCL's tuner picks (None without an NCCL machine)."""
    got = None if net.nccl is None else nccl_choice(op, n, net, net.nccl)
    return None if got is None else f"nccl_{got[0]}"

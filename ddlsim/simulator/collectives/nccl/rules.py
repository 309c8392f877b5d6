"""The bandwidth rules of NCCL's tuning model that changed between releases (NVLS, the bus to
algorithm bandwidth ratio), read through the release's tables (:mod:`.versions`); used by
:mod:`.model`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hops import ring_steps

if TYPE_CHECKING:  # pragma: no cover
    from ..base import GroupNet
    from .model import NcclEnv

__all__ = ["col", "has_nvls", "nvls_channels", "nvls_bus", "algbw_ratio", "converts"]


def col(nodes: int) -> int:
    """The column of NCCL's per-node-count tables (tuning.cc ``index2``): 1, 2 or ≥ 3 nodes.

    Parameters
    ----------
    nodes : int
        Nodes the group spans (≥ 1).

    Returns
    -------
    int
        0 for one node, 1 for two, 2 for three or more.
    """
    return min(nodes, 3) - 1


def has_nvls(env: NcclEnv) -> bool:
    """Whether NVLS can run: on Hopper and later (tuning.cc ``nvlsEfficiency`` 0 for Volta and
    Ampere; src/transport/nvls.cc: NVLS needs SM90).

    Parameters
    ----------
    env : NcclEnv
        The machine and NCCL release (its ``arch``).

    Returns
    -------
    bool
        True on ``hopper`` and ``blackwell``.
    """
    return env.arch in ("hopper", "blackwell")


def nvls_channels(net: GroupNet) -> int:
    """Channels of NCCL's NVLS graph: one per GPU of the node (search.cc: ``maxChannels =
    min(NCCL_MAX_NVLS_ARITY, GPUs)``, and ``minChannels = maxChannels`` on one node).

    Parameters
    ----------
    net : GroupNet
        The group's links (``p`` ranks over ``nodes`` nodes).

    Returns
    -------
    int
        GPUs of the group per node, at least 1.
    """
    return max(1, int(round(net.p / net.nodes)))


def nvls_bus(op: str, algo: str, link: float, net: GroupNet, env: NcclEnv) -> float:
    """NCCL's NVLS or NVLS-tree bus bandwidth (GB/s).

    Parameters
    ----------
    op, algo : collective; ``nvls`` or ``nvls_tree``.
    link : the bandwidth of NCCL's channels (GB/s: channels × per-channel bandwidth).
    net : the group's links (``bw_node_Bps``: a node's network bandwidth, B/s).
    env : the machine and NCCL release.

    Returns
    -------
    float
        GB/s: with ``nvlsEfficiency`` (2.30.7 tuning.cc lines 307–323; the 2-node NVLS tree
        halves the inter-node traffic), or before it (releases whose tables have none) the
        graph's ``min(bwIntra, bwInter)``, ``bwInter / 2`` for an NVLS tree of 3 or more nodes
        (v2.26.2-1 tuning.cc lines 250–253, v2.21.5-1 lines 174–177).
    """
    tab, node = env.tab, net.bw_node_Bps / 1e9
    if tab.nvls_efficiency is None:
        if algo == "nvls":
            return min(link, node) if net.multi_node else link
        return min(link, node if net.nodes <= 2 else node / 2)
    nc, ppn = nvls_channels(net), net.p / net.nodes
    intra = link * tab.nvls_efficiency[env.arch] * (nc - 1) / nc
    if algo == "nvls":
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        return min(intra, node) if net.multi_node else intra
    inter = node * (2 if net.nodes <= 2 else 1)
    return min(intra * 2.0, inter,
               nc * tab.per_ch_max_bw["nvls_tree"][env.arch][col(net.nodes)])


def algbw_ratio(op: str, algo: str, p: int, env: NcclEnv) -> float:
    """NCCL's bus → algorithm bandwidth ratio (tuning.cc "Convert bus BW to algorithm BW"): the
    ring, and NVLS where the release has ``nvlsEfficiency``, ``p / nsteps``; NVLS before it 5/6
    (v2.26.2-1 line 293, v2.21.5-1 line 216); tree and CollNet 1/2.

    Parameters
    ----------
    op : str
        The collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, …).
    algo : str
        NCCL's algorithm (``ring``, ``tree``, ``nvls``, ``nvls_tree``, ``collnet``, …).
    p : int
        Ranks of the group.
    env : NcclEnv
        The machine and NCCL release (its tables: ``nvls_efficiency``).

    Returns
    -------
    float
        Algorithm bandwidth per unit of bus bandwidth (dimensionless).
    """
    nvls = algo in ("nvls", "nvls_tree")
    if algo == "ring" or (nvls and env.tab.nvls_efficiency is not None):
        return p / ring_steps(op, p)
    return 5.0 / 6.0 if nvls else 0.5


def converts(op: str, algo: str, env: NcclEnv) -> bool:
    """Whether NCCL converts ``algo``'s bus bandwidth to an algorithm bandwidth: every
    all-reduce; an all-gather or reduce-scatter on the ring only (from 2.23: v2.26.2-1 line
    290), or on all but CollNet-direct (v2.21.5-1 line 213).

    Parameters
    ----------
    op : str
        The collective.
    algo : str
        NCCL's algorithm.
    env : NcclEnv
        The machine and NCCL release (its tables: ``converts_all_gather``).

    Returns
    -------
    bool
        Whether :func:`algbw_ratio` applies to ``algo``'s bus bandwidth for ``op``.
    """
    if op not in ("all_gather", "reduce_scatter"):
        return True
    return algo == "ring" or (env.tab.converts_all_gather
                              and algo != "collnet")

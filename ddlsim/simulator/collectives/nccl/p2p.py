"""NCCL's all-to-all: grouped point-to-point sends and receives, registered as ``nccl_p2p``.

NCCL has no all-to-all collective: frameworks and nccl-tests issue one ``ncclSend`` and one
``ncclRecv`` per peer inside ``ncclGroupStart``/``ncclGroupEnd`` (NVIDIA/nccl-tests
``src/alltoall.cu`` ``AlltoAllRunColl``; PyTorch's ``ProcessGroupNCCL::alltoall_base`` the
same), which NCCL's tuning model (:mod:`.model`) does not time. The bytes move as the direct
all-to-all's (:func:`ddlsim.simulator.collectives.mpi._a2a_direct`: all ``p − 1`` messages at
once), but over NVLink at the share of a link NCCL's transports fill, not the line rate: NCCL's
own NVLink bandwidth per link over the signalling rate (:data:`.tuning.NVLINK_EFFICIENCY`,
Hopper 20.6 / 25: 371 GB/s of the H100's 450), which is the effective NVLink bandwidth the
NCCL maintainer gives for every operation but the NVLS all-reduce, "which you can observe as
BusBw when running non-allreduce operations" (NVIDIA/nccl-tests#212, sjeaugey 2024-05-06:
"450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink
bandwidth of 370GB/s"). The network side stays the direct form's: each node's NICs carry its
``g·(p − g)/p·n`` bytes (all-to-all "cannot aggregate the bandwidth of multiple NICs",
nccl-tests#267). Not modelled: NCCL's p2p chunking and channel count per peer
(``NCCL_P2P_NET_CHUNKSIZE``, ``NCCL_NCHANNELS_PER_NET_PEER``), LL for small p2p messages.
"""

from __future__ import annotations

import numpy as np

from ..base import GroupNet, Phase, register, register_uneven
from ..mpi import _a2a_direct, _a2a_direct_ph, _a2a_direct_uneven, _a2a_direct_uneven_ph

__all__ = ["p2p_efficiency"]


def p2p_efficiency(net: GroupNet) -> float:
    """The share of the NVLink line rate NCCL's sends fill inside a node (1 over PCIe, and
    1 without an NCCL machine)."""
    env = net.nccl
    if env is None or env.intra != "nvlink":
        return 1.0
    return env.tab.nvlink_efficiency[env.arch]


def _inside_inflated(phase: Phase, net: GroupNet) -> list[Phase]:
    """``phase`` with its flows inside a node inflated by ``1 / efficiency`` (the
    discrete-event engine replays them at the line rate)."""
    node = phase.pairs // max(net.g, 1)
    inside = node[:, 0] == node[:, 1]
    weights = 1.0 if phase.weights is None else phase.weights
    weights = np.where(inside, weights / p2p_efficiency(net), weights)
    return [Phase(phase.pairs, phase.bytes, weights=weights)]


def _layout(n: float, net: GroupNet) -> list[Phase]:
    """The direct all-to-all's flows (bytes per collective byte), inflated inside a node."""
    return _inside_inflated(_a2a_direct_ph(1.0, net.p, net.g)[0], net)


@register("all_to_all", "nccl_p2p", backend="nccl", layout=_layout)
def _a2a_p2p(n: float, net: GroupNet) -> float:
    """``α + max((p − 1)·n/p / (bw_intra·efficiency), g·(p − g)·n/p / bw_node)``: the direct
    form (:func:`ddlsim.simulator.collectives.mpi._a2a_direct`) at NCCL's device share."""
    return _a2a_direct(n, net, p2p_efficiency(net))


def _a2a_p2p_uneven(B: np.ndarray, net: GroupNet) -> float:
    """Uneven sizes (``B[i, j]``: bytes member i sends to member j; a hot expert-parallel rank
    under routing imbalance): the direct uneven all-to-all
    (:func:`ddlsim.simulator.collectives.mpi._a2a_direct_uneven`) with its device term at
    NCCL's share of the NVLink rate, as :func:`_a2a_p2p` is the direct form's; uniform ``B``
    gives :func:`_a2a_p2p`. Until 2026-12-01 an uneven all-to-all took the cheapest MPI
    algorithm whatever the backend, and so ran NCCL's sends at the NVLink line rate."""
    return _a2a_direct_uneven(B, net, p2p_efficiency(net))


def _uneven_layout(W: np.ndarray, net: GroupNet) -> list[Phase]:
    """The direct uneven all-to-all's flows (``W[i, j]`` per collective byte), inflated
    inside a node as :func:`_layout`'s."""
    return _inside_inflated(_a2a_direct_uneven_ph(W, net.g)[0], net)


register_uneven("all_to_all", "nccl_p2p", _a2a_p2p_uneven, _a2a_direct_uneven_ph,
                layout=_uneven_layout)

"""SMs taken from overlapped GEMMs by the communication kernels that run beside them.

A GEMM that runs while a communication kernel holds ``k`` of the device's ``S`` SMs runs on
the other ``S − k``: for as long as both run it does ``(S − k)/S`` of its work per second.
A trace marks such a pairing with a compute op carrying a
:class:`~ddlsim.workloads.trace.Contention` (the overlapped GEMMs' FLOPs and what holds the
SMs); the op's duration is the *extra* time the GEMMs take, placed beside them on the
compute stream, so both engines (which time every compute op by
:meth:`~ddlsim.simulator.costs.CostModel.compute`) and the search tier see the same physics.

With ``G`` the GEMMs' time on all SMs, ``G_k = G·S/(S − k)`` on ``S − k`` and ``C`` the time
the communication kernels run, the GEMMs lose ``k/S`` of their rate for ``min(C, G_k)``:

    extra = (k / S) · min(C, G_k)          (= G_k − G when C ≥ G_k)

* **TransformerEngine userbuffers** (``pipeline``/``bulk``, ``set_sm_margin``): the GEMM is
  launched on ``S − num_sm`` SMs for its whole duration (``C = ∞``), ``num_sm = 16``
  (TE ``pytorch/module/base.py`` ``initialize_ub`` defaults).
* **NCCL** (Megatron's asynchronous TP backward): an NCCL collective is one CUDA block per
  channel (``ncclLaunchKernel``'s grid is the channel count, NCCL ``src/enqueue.cc``), and a
  channel's block (512–640 threads, ``NCCL_*_MAX_NTHREADS``) holds its SM against a GEMM's
  CTA (a CUTLASS/cuBLAS tile of 128×256 takes most of an SM's registers and shared memory),
  so ``k`` is the communicator's channels (:func:`nccl_ring_ctas`), for ``C`` the collective's
  time as the cost model gives it.

The 24 channels of an 8-GPU A100 NVSwitch node are what NCCL prints there ("Channel 23/24",
NVIDIA/nccl-tests issue 100, an HGX A100 all-reduce log).

Not modelled: the HBM bandwidth the communication kernels move (hundreds of GB/s against
2–3 TB/s, which matters for memory-bound kernels beside them, not for the GEMMs charged
here), the GEMM's wave quantisation on ``S − k`` SMs, the channels NCCL drops for messages
under ``channels × threads × threshold`` bytes (:mod:`ddlsim.simulator.collectives.nccl.channels`:
kilobytes, not the MiB collectives overlapped here) and NVLS's own channel count (16 by
default on Hopper; the ring's is counted for every collective inside a node). Across nodes
the ring's channels follow the NICs (:func:`nccl_ring_ctas` with the group's net; 16 on
3 × 8 H100s in NVIDIA/nccl issue 1453's log): data-parallel and FSDP collectives
(:mod:`ddlsim.workloads.smcontention`).

**Not modelled, and measured to matter for the expert-parallel overlap: when the
communication kernel starts.** The formula assumes the communication kernel takes its ``k``
SMs as soon as its inputs are ready. DeepEP's kernels are cooperative launches in clusters
of two SMs (DeepEP 567632d ``csrc/kernels/launch.cuh`` ``SETUP_LAUNCH_CONFIG``:
``cudaLaunchAttributeCooperative``, cluster dimension 2), so all their blocks must find SMs
at once; a compute kernel that holds every SM keeps them out until it ends ("communication
kernels require a substantially larger sm_margin to overlap if not picked first — no less
than the number of SMs used by them", SandAI-org/MagiAttention 0501722
``docs/source/blog/kernel_overlap.md``; "a persistent compute kernel that occupies every SM
can prevent the communication kernel from being scheduled", NVIDIA/Megatron-LM fc81b209
``docs/user-guide/features/moe_a2a_overlap.md``; the EP-overlap recipes leave 20 SMs beside
the norm kernels, ``NVTE_FWD/BWD_LAYERNORM_SM_MARGIN=20``: yanring/Megatron-MoE-ModelZoo
c1ad0b5c ``sbatch_benchmarking.sh``, Megatron-Bridge 7ded17da
``perf_recipes/qwen/h100/qwen3_moe.py``; Megatron-LM 54f90af0 added
``--high-priority-a2a-comm-stream``, off by default). A profile of Megatron-Core's combined 1F1B
(Megatron-Bridge 067f987d ``skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md``, Qwen3-30B-A3B
on 16 H100s, HybridEP, rank 0, Nsight Systems) found 36.55 % of the communication time beside
GEMMs or attention (3,959 ms), and the communication kernels' total time about 30 % longer
than without the overlap (3,959 ms / 0.3655 = 10.8 s against 9.079 ms / 0.0011 = 8.3 s). The
published gains of three overlap A/B runs (Megatron-MoE-ModelZoo Qwen3-235B rows 1-2, DeepEP;
that Qwen3-30B-A3B run and an alltoall one on the same shape) are 36-63 % of the gain ddlsim
predicts with the communication hidden as this module assumes.

References
----------
NCCL ``src/graph/search.cc`` ``ncclTopoCompute`` (speed arrays; ``ncclTopoDupChannels``:
channels doubled where a channel moves ≥ 25 GB/s, except on compute capability > 8.0 below
50 GB/s with more than 4 channels) and ``src/graph/connect.cc`` ``ncclTopoPostset`` ("Duplication
should be complete now": ``nChannels = min(MAXCHANNELS, nChannels*2)``), NCCL 2.18–2.26.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAXCHANNELS", "nccl_ring_ctas", "extra_seconds", "gemm_seconds", "contention_seconds"]

#: NCCL's most channels per communicator (``MAXCHANNELS``, src/include/device.h)
MAXCHANNELS = 32
#: compute capability above which the duplication rule also asks for ≥ 50 GB/s per channel
_CC = {"volta": 70, "ampere": 80, "hopper": 90, "blackwell": 100}


def nccl_ring_ctas(system: Any, net: Any = None) -> int:
    """SMs an NCCL ring collective holds: its channels, one CUDA block each.

    The topology search's channels are the group's link bandwidth over the first per-channel
    speed it tries (ddlsim's NCCL model: :mod:`ddlsim.simulator.collectives.nccl.model`
    ``_link`` and ``_channels``; inside a DGX A100: 300 GB/s × 0.8 / 40 GB/s = 6; across nodes
    the NICs' bandwidth over the inter-node speed, 200 GB/s / 48 GB/s = 4 from 8 HDR NICs),
    doubled by
    ``ncclTopoDupChannels`` where a channel moves ≥ 25 GB/s (not on compute capability > 8.0
    below 50 GB/s with more than 4 channels), and doubled again by ``ncclTopoPostset``, at
    most :data:`MAXCHANNELS`: 24 inside a DGX A100 or H100 node, 16 across DGX A100 nodes,
    14 across DGX H100 nodes (7 channels at 48 GB/s are not duplicated on Hopper; NCCL
    printed 16 on 3 × 8 H100s, NVIDIA/nccl issue 1453).

    Parameters
    ----------
    system : a :class:`~ddlsim.config.SystemConfig`.
    net : the group's :class:`~ddlsim.simulator.netmodel.GroupNet`, or None for a group
        inside one NVLink node.

    Returns
    -------
    int : SMs (0 where NCCL's model does not apply: no known GPU generation, or no NVLink
    inside the node for a group inside one).
    """
    from ..collectives.nccl import tuning as T
    from ..collectives.nccl.model import _channels, _link
    from ..collectives.nccl.system import env_for_system
    env = env_for_system(system)
    if env is None:
        return 0
    if net is None or not net.multi_node:
        if env.intra != "nvlink":
            return 0
        link_GBps = system.intra_node.bandwidth_Bps * T.NVLINK_EFFICIENCY[env.arch] / 1e9
        speed = T.TOP_SPEED_GBPS[env.arch][0]
        channels = max(1, math.floor(link_GBps / speed))
    else:   # the model's own channel count across nodes (its busBw uses the same)
        speed = T.TOP_SPEED_GBPS[env.arch][1]
        channels = max(1, math.floor(_channels(_link(net, env)[1], net, env)))
    if speed >= 25.0 and not (_CC[env.arch] > 80 and speed < 50.0 and channels > 4):
        channels = min(2 * channels, MAXCHANNELS)
    return min(2 * channels, MAXCHANNELS)


def extra_seconds(gemm_s, comm_s, sms_taken: int, sm_count: int):
    """Extra seconds of GEMMs of ``gemm_s`` (on all SMs) while ``sms_taken`` SMs are held
    for ``comm_s`` seconds (``inf``: for the GEMMs' whole duration): ``(k/S)·min(C, G_k)``,
    ``G_k = G·S/(S − k)``.

    Parameters
    ----------
    gemm_s : seconds of the overlapped GEMMs on all ``sm_count`` SMs (float or array).
    comm_s : seconds the communication kernels hold their SMs (float or array).
    sms_taken : SMs they hold, ``k``.
    sm_count : the device's SMs, ``S``.

    Returns
    -------
    float or array : seconds (0 where nothing is taken).
    """
    import numpy as np
    if sms_taken <= 0 or not sm_count:
        return 0.0 * np.asarray(comm_s) if np.ndim(comm_s) else 0.0
    if sms_taken >= sm_count:
        from ...errors import ConfigError
        raise ConfigError(f"system.device.sm_count = {sm_count}: the communication kernels "
                          f"overlapped with GEMMs hold {sms_taken} SMs, leaving none to the "
                          f"GEMMs; sm_count must exceed {sms_taken} (or turn the overlap off)")
    g_k = gemm_s * sm_count / (sm_count - sms_taken)
    out = sms_taken / sm_count * np.minimum(comm_s, g_k)
    return float(out) if np.ndim(out) == 0 else out


def gemm_seconds(flops, dev: Any, dtype: str):
    """Seconds of GEMMs of ``flops`` (float or array) on all of ``dev``'s SMs at its matmul
    ceiling in ``dtype``: the ``gemm_s`` of :func:`extra_seconds`."""
    return flops / (dev.peak_flops(dtype) * dev.ceiling(dtype))


def contention_seconds(op: Any, dev: Any, nccl_ctas: int, comm_s=math.inf):
    """Seconds of a contention op (a compute op carrying a
    :class:`~ddlsim.workloads.trace.Contention`): :func:`extra_seconds` of its GEMM FLOPs at
    the device's matmul ceiling.

    Parameters
    ----------
    op : the :class:`~ddlsim.workloads.trace.Compute` op.
    dev : the :class:`~.device.KernelDevice`.
    nccl_ctas : SMs an NCCL collective holds (:func:`nccl_ring_ctas`), for a contention by
        collectives that names no SM count of its own (``Contention.sms`` 0).
    comm_s : seconds of its collectives, one after another (float or array over plans);
        ignored for a fixed margin (``Contention.sms``).

    Returns
    -------
    float or array : seconds.
    """
    c = op.contention
    gemm_s = gemm_seconds(c.gemm_flops, dev, op.dtype)
    if c.collectives:   # their kernels' own SM count (DeepEP's num_sms), else NCCL's channels
        return extra_seconds(gemm_s, comm_s, c.sms or nccl_ctas, dev.sm_count)
    return extra_seconds(gemm_s, math.inf, c.sms, dev.sm_count)

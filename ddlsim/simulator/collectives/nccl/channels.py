"""How many of its channels NCCL runs a small ring or tree collective on.

Once NCCL has chosen an algorithm and protocol by its estimate (which assumes every channel),
``topoGetAlgoInfo`` (src/enqueue.cc of NCCL 2.26.2, lines 1735–1763) drops channels while the
message is smaller than ``channels × threads × threadThreshold`` bytes: each channel's block of
threads gets at least ``threads × threadThreshold`` bytes. A message below that runs on fewer
channels, each moving its share at one channel's bandwidth, so its bandwidth term is
``channels / channels used`` times the estimate's. NVLS and CollNet keep their channels
(NVLS) or have their own rule (CollNet: not modelled). NCCL also halves the threads of a
channel below the same threshold; that is not modelled (how a channel's bandwidth scales with
its threads is not in NCCL's code).

Constants from NCCL 2.26.2: ``maxThreads`` (src/graph/tuning.cc lines 199–210, with
src/include/device.h ``NCCL_LL_MAX_NTHREADS`` 512, ``NCCL_LL128_MAX_NTHREADS`` 640,
``NCCL_SIMPLE_MAX_NTHREADS`` 512; the ring's Simple kernel takes 256 where the ring's
bandwidth is at most ``PCI_BW``, 12 GB/s, src/graph/topo.h) and ``threadThresholds``
(tuning.cc lines 487–495, src/include/comm.h: LL 8, LL128 8, Simple 64; ring LL × ranks).
"""

from __future__ import annotations

import math

__all__ = ["MAX_THREADS", "THREAD_THRESHOLD", "channel_bytes", "channels_used"]

#: threads of a channel's block per protocol (``NCCL_*_MAX_NTHREADS``, device.h)
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}

#: bytes per thread below which NCCL drops a channel (``NCCL_*_THREAD_THRESHOLD``, comm.h)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}

#: tuning.cc ``simpleDefaultThreads``: 256 threads where the ring moves at most ``PCI_BW``
_PCI_BW_GBPS = 12.0


def channel_bytes(algo: str, proto: str, p: int, ring_GBps: float) -> float:
    """Bytes one channel must get to be kept (``threads × threadThreshold``).

    Parameters
    ----------
    algo : ``ring`` or ``tree`` (others: ``0``, no channel is dropped).
    proto : ``LL``, ``LL128`` or ``Simple``.
    p : ranks of the communicator (the ring LL threshold is per rank).
    ring_GBps : NCCL's ring bandwidth, channels × per-channel (GB/s).

    Returns
    -------
    float
        Bytes.

    References
    ----------
    NVIDIA/nccl v2.26.2-1, src/enqueue.cc ``topoGetAlgoInfo`` lines 1735–1763;
    src/graph/tuning.cc lines 199–210 and 487–495.
    """
    if algo not in ("ring", "tree"):
        return 0.0
    threads = MAX_THREADS[proto]
    if algo == "ring" and proto == "Simple" and ring_GBps <= _PCI_BW_GBPS:
        threads = 256
    threshold = THREAD_THRESHOLD[proto] * (p if (algo, proto) == ("ring", "LL") else 1)
    return float(threads * threshold)


def channels_used(n: float, per_channel_bytes: float, channels: int) -> int:
    """Channels NCCL runs ``n`` bytes on: the most of ``channels`` (at least 1) each of which
    gets ``per_channel_bytes`` (enqueue.cc: ``while (nBytes < nc*nt*threshold) nc--``)."""
    if per_channel_bytes <= 0 or n >= channels * per_channel_bytes:
        return channels
    return max(1, min(channels, math.floor(n / per_channel_bytes)))

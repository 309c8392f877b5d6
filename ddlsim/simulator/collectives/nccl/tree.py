"""The pipeline fill of NCCL's tree all-reduce, which its tuning model's estimate leaves out.

NCCL's tree all-reduce (``runTreeUpDown``/``runTreeSplit``, src/device/all_reduce.h of NCCL
2.26.2) moves each channel's share in chunks up a chain of the node's GPUs and the inter-node
tree, then down again: a GPU forwards a chunk once it holds all of it. The estimate NCCL
chooses by (``ncclTopoGetAlgoTime``) counts one hop latency per level of that path and the
steady state ``bytes / algBw``; a real run also pays the **pipeline fill**: the first chunk
crosses ``D`` hops before the last GPU receives anything, so ``D − 1`` more chunk moves than
the steady state. With ``c`` the bytes per chunk and channel and ``nc`` channels, each move
takes ``c·nc / algBw`` (the steady-state step: every channel moves one chunk):

    fill = (D − 1) · min(c, n / nc) · nc / algBw

where ``D = 2·((GPUs per node − 1) + ⌊log2 nodes⌋)`` is the number of hops NCCL's own tree
latency counts (tuning.cc: ``2·((nRanks/nNodes−1)·intraLat + log2i(nNodes)·interLat)``), ``c``
is the chunk NCCL picks (``calcCollChunking``: LL128 shrinks it for small messages, Simple
keeps one step of its buffer), a message smaller than ``nc`` chunks moves one chunk of
``n / nc`` per channel, and ``algBw`` is NCCL's bandwidth before its size correction (the
correction is NCCL's own stand-in for such losses; the chunk moves at the channel's rate).

Which protocols pay it: Simple signals a whole slice (one chunk for the tree: ``ProtoSimple<1,
1>``) with one flag, so a GPU forwards nothing of a chunk before all of it has landed. LL
flags every 8-byte word (``ncclLLFifoLine``), so a GPU forwards each word as it lands: no
chunk-level fill, none is added. LL128 flags every 128-byte line but NCCL sizes its tree chunk
by the pipeline's depth (the ``nstepsLL128`` rule below), and nccl-tests shows the fill: the
LL128 tree rows of NVIDIA/nccl-tests#309 (1–4 MiB on 2, 4 and 8 nodes, held out in
``benchmarks/validate_nccl.py``) go from 18–58 % optimistic to within 23 % with it. The
Simple tree's fill follows from its code alone; no published measurement checks it yet.

Nothing here is fitted: every constant is NCCL's (tag v2.26.2-1, the version of
NVIDIA/nccl-tests#309's measurements).
"""

from __future__ import annotations

import math

__all__ = ["TREE_STEP_BYTES", "tree_depth", "tree_chunk_bytes", "tree_fill_levels"]

#: bytes of data one step of a protocol's buffer carries (``comm->buffSizes[p] / NCCL_STEPS``,
#: src/enqueue.cc ``calcCollChunking`` lines 1859–1864; tree: ``chunkSteps = 1``), for the
#: protocols that pay a chunk-level fill. NCCL 2.26.2 src/init.cc lines 606–608 and
#: src/include/device.h: LL128 120 elements × 640 threads × 8 steps × 8 B / 8 steps = 614,400
#: B, of which 15 of 16 words are data (``NCCL_LL128_DATAELEMS``); Simple 4 MiB / 8 steps
TREE_STEP_BYTES = {"LL128": 120 * 640 * 8 // 16 * 15, "Simple": (1 << 22) // 8}

#: enqueue.cc lines 1901–1909: the LL128 tree chunk halves while the message is under
#: ``factor × nsteps / ppn`` chunks per channel and the chunk above ``floor`` bytes
_LL128_RULES = ((64, 131072), (16, 32768))


def _log2i(n: int) -> int:
    return int(n).bit_length() - 1 if n > 0 else 0


def tree_depth(p: int, nodes: int) -> int:
    """Hops from the first GPU up the tree and back down: ``2·((p/nodes − 1) + ⌊log2 nodes⌋)``.

    Parameters
    ----------
    p : ranks of the communicator.
    nodes : nodes it spans.

    Returns
    -------
    int
        Hops, as NCCL's tree latency counts them (src/graph/tuning.cc, NCCL 2.26.2).
    """
    ppn = max(1, int(round(p / nodes)))
    return 2 * ((ppn - 1) + _log2i(nodes))


def tree_chunk_bytes(proto: str, n: float, channels: int, p: int, nodes: int) -> int:
    """The chunk (bytes per channel) NCCL's ``calcCollChunking`` picks for a tree all-reduce.

    Parameters
    ----------
    proto : ``LL128`` or ``Simple``.
    n : message size (bytes).
    channels : NCCL's channels.
    p, nodes : ranks and nodes of the communicator.

    Returns
    -------
    int
        Bytes.

    References
    ----------
    NVIDIA/nccl v2.26.2-1, src/enqueue.cc, ``calcCollChunking``, lines 1901–1909 (LL128;
    Simple keeps one step of its buffer).
    """
    chunk = TREE_STEP_BYTES[proto]
    if proto != "LL128":
        return chunk
    ppn = p / nodes
    nsteps = 1 + _log2i(nodes) + 0.1 * ppn
    for factor, floor in _LL128_RULES:
        while n // (channels * chunk) < nsteps * factor / ppn and chunk > floor:
            chunk //= 2
    return chunk


def _edges(proto: str, channels: int, p: int, nodes: int) -> list[tuple[float, int]]:
    """(size from which, chunk) for every chunk :func:`tree_chunk_bytes` can pick, ascending."""
    if proto != "LL128":
        return [(0.0, TREE_STEP_BYTES[proto])]
    ppn = p / nodes
    nsteps = 1 + _log2i(nodes) + 0.1 * ppn
    chunks = [TREE_STEP_BYTES[proto] >> k for k in range(8)]
    # n // (nc·c) < T flips at n = ceil(T)·nc·c: every threshold of every rule and chunk
    sizes = {0.0} | {float(math.ceil(nsteps * f / ppn) * channels * c)
                     for f, _ in _LL128_RULES for c in chunks}
    out: list[tuple[float, int]] = []
    for n in sorted(sizes):
        c = tree_chunk_bytes(proto, n, channels, p, nodes)
        if not out or c != out[-1][1]:
            out.append((n, c))
    return out


def tree_fill_levels(proto: str, p: int, nodes: int, channels: float, algbw_GBps: float,
                     max_edges: int) -> tuple[tuple[float, ...], tuple[float, ...], float] | None:
    """The fill (µs) of a tree all-reduce as a step function of the size, capped by a line.

    Parameters
    ----------
    proto : ``LL``, ``LL128`` or ``Simple`` (LL: None, no chunk-level fill).
    p, nodes : ranks and nodes of the communicator.
    channels : NCCL's channel count as the tuning model sees it (rounded to NCCL's integer).
    algbw_GBps : NCCL's algorithm bandwidth before its size correction (GB/s).
    max_edges : edges of the step function (``inf`` pads).

    Returns
    -------
    tuple or None
        ``(edges, fills, slope)``: ascending sizes (bytes), one more fill (µs) than edges,
        ``fills[k]`` applying from ``edges[k-1]`` to ``edges[k]``, and ``slope`` (µs per byte):
        the fill at ``n`` bytes is ``min(fills[level], slope·n)``, the second where a message
        is smaller than one chunk per channel.
    """
    if proto not in TREE_STEP_BYTES or algbw_GBps <= 0:
        return None
    nc = max(1, int(round(channels)))
    per_byte_us = max(0, tree_depth(p, nodes) - 1) * nc / (1e3 * algbw_GBps)
    steps = _edges(proto, nc, p, nodes)
    edges = [n for n, _ in steps[1:]]
    fills = [per_byte_us * c for _, c in steps]
    if len(edges) > max_edges:
        raise ValueError(f"{len(edges)} chunk sizes exceed the {max_edges} edges of a fill")
    edges += [math.inf] * (max_edges - len(edges))
    fills += [fills[-1]] * (max_edges + 1 - len(fills))
    return tuple(edges), tuple(fills), per_byte_us / nc

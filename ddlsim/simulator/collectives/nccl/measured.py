"""What NCCL's NVLink SHARP (NVLS) all-reduce takes as nccl-tests measures it, beyond the
estimate its tuning model makes (:mod:`.model`).

NCCL's tuner estimates each algorithm and protocol to choose one (``ncclTopoGetAlgoTime``);
it does not claim the estimate is the time. For the ring the estimate matches published
nccl-tests plateaus (A100 ring all-reduce 240 vs 230 GB/s, H100 ring all-gather 370 vs 370), so
ddlsim keeps it (the tree's pipeline fill, derived from NCCL's code, is in :mod:`.tree`; the
channels NCCL drops for small messages in :mod:`.channels`). For NVLS it does not, in two
ways, both modelled here:

1. **The plateau.** NCCL estimates an 8-GPU H100 NVLS all-reduce at 551 GB/s bus bandwidth; it
   reaches ~480 (algorithm bandwidth ~275 GB/s, NCCL maintainer, NVIDIA/nccl-tests#212). The
   achieved algorithm bandwidth is a fraction of the NVLink line rate per GPU and direction
   (:data:`NVLS_ALGBW_FRACTION`), the same at 5–8 GPUs (NVIDIA/nccl#1455: algbw 258–273 GB/s).
2. **The pipeline fill.** NVLS moves ``chunk`` bytes per (channel, NVLS head) at a time
   (``concurrentOps = nvlsChannels × nHeads``), with the chunk size NCCL picks by message size
   (``calcCollChunking``, src/enqueue.cc of NCCL 2.26.2, lines 1877–1900: 16–128 KiB for NVLS,
   32–128 KiB for NVLS-tree, at most 64 KiB from 4 nodes). Before the first chunk leaves the
   last stage, :data:`FILL_CHUNKS` rounds of ``concurrentOps × chunk`` bytes are in flight: a
   latency of ``FILL_CHUNKS × concurrentOps × chunk / algBw`` that grows with the chunk, which
   is why a 128 MiB NVLS all-reduce reaches only 80 % of the plateau (NVIDIA/nccl-tests#290).

Fitted constants (each says the rows of ``benchmarks/data/nccl_tests_published.csv`` it was
fitted to; ``benchmarks/validate_nccl.py`` reports those rows apart from the held-out ones):
:data:`NVLS_ALGBW_FRACTION` and :data:`FILL_CHUNKS`. NCCL's own constants (channels, chunk
sizes, thresholds) are read from its source at tag v2.26.2-1, the version of
NVIDIA/nccl-tests#309's measurements.
"""

from __future__ import annotations

import math

__all__ = ["NVLS_CHANNELS", "NVLS_CHUNK_BYTES", "NVLS_ALGBW_FRACTION", "FILL_CHUNKS",
           "nvls_chunk_bytes", "achieved_algbw_GBps", "fill_levels", "fill_us", "FILL_EDGES"]

#: src/transport/nvls.cc (v2.26.2-1, lines 144–145): ``NVLS_NCHANNELS_SM90`` 16,
#: ``NVLS_NCHANNELS_SM100`` 32 (``comm->nvlsChannels``, all of which NVLS runs on: enqueue.cc
#: line 1750 "NVLS should not need more than 16 channels")
NVLS_CHANNELS = {"hopper": 16, "blackwell": 32}

#: src/transport/nvls.cc (v2.26.2-1, line 149): ``NCCL_NVLS_CHUNKSIZE`` default 128 KiB
NVLS_CHUNK_BYTES = 128 * 1024

#: achieved NVLS all-reduce algorithm bandwidth over the NVLink line rate per GPU and
#: direction. FITTED to row ``nccl212`` all_reduce 8 GiB (8 x H100: busbw ~480 GB/s, "algbw
#: ~275GB/s", NCCL maintainer) with H100's 450 GB/s line rate (NVIDIA H100 datasheet: 900 GB/s
#: bidirectional): 275 / 450. Measured on Hopper only; other generations keep NCCL's estimate.
NVLS_ALGBW_FRACTION = {"hopper": 275.0 / 450.0}

#: chunks of every concurrent op (channel x head) in flight before the pipeline delivers: the
#: fill latency in units of ``concurrentOps x chunk / algBw``. FITTED, the half-integer in
#: 1-5 of least mean |error| (``python benchmarks/validate_nccl.py --fit`` prints the scan):
#: ``nvls`` to rows ``nccl290`` (1 node, 128 MiB-4 GiB; no release stated, timed with the
#: default 2.30.7's tables), ``nvls_tree`` to rows ``nccl309a`` (2 nodes, 1 MiB-16 GiB) timed
#: with the release they ran, NCCL 2.26.2 (:mod:`.versions`), with NCCL's own choice of
#: algorithm: 2.5 (7.8 % mean on those rows; it was 1.5 when the rows were timed with 2.30.7's
#: tables, which they did not run). Of the order of the stages of NCCL's NVLS all-reduce
#: kernel (scatter, reduce, gather warp groups, each holding chunks: src/device/all_reduce.h,
#: v2.26.2-1, lines 390-510); not derived from them.
FILL_CHUNKS = {"nvls": 3.5, "nvls_tree": 2.5}

#: number of size edges of a fill's step function (NCCL picks among at most 4 NVLS chunk
#: sizes, and 6 LL128 tree chunk sizes: :mod:`.tree`)
FILL_EDGES = 5


def _nvls_rules(nodes: int, algbw_estimate_GBps: float) -> tuple[int, tuple]:
    """enqueue.cc lines 1877–1887: the largest chunk and (factor, chunk) shrink rules."""
    top = NVLS_CHUNK_BYTES
    if nodes > 1 and algbw_estimate_GBps < 150:
        top = 32768
    return top, ((64, 65536), (8, 32768), (2, 16384))


def _nvls_tree_rules(nodes: int) -> tuple[int, tuple]:
    """enqueue.cc lines 1888–1900 (``NCCL_NVLSTREE_MAX_CHUNKSIZE`` unset: 64 KiB from 4 nodes)."""
    top = min(NVLS_CHUNK_BYTES, 65536 if nodes >= 4 else NVLS_CHUNK_BYTES)
    return top, ((32, 262144), (16, 131072), (4, 65536), (1, 32768))


def nvls_chunk_bytes(algo: str, n: float, ops: int, nodes: int,
                     algbw_estimate_GBps: float = math.inf) -> int:
    """The chunk (bytes) NCCL's ``calcCollChunking`` picks for an NVLS or NVLS-tree
    all-reduce of ``n`` bytes with ``ops`` concurrent ops (channels x NVLS heads).

    Parameters
    ----------
    algo : ``nvls`` or ``nvls_tree``.
    n : message size (bytes, nccl-tests convention).
    ops : ``nvlsChannels x nHeads``.
    nodes : nodes of the communicator.
    algbw_estimate_GBps : NCCL's estimated NVLS all-reduce bandwidth (GB/s); below 150 on
        several nodes NCCL caps the NVLS chunk at 32 KiB.

    Returns
    -------
    int
        Chunk size (bytes).

    References
    ----------
    NVIDIA/nccl v2.26.2-1, src/enqueue.cc, ``calcCollChunking``, lines 1877–1900.
    """
    chunk, rules = (_nvls_rules(nodes, algbw_estimate_GBps) if algo == "nvls"
                    else _nvls_tree_rules(nodes))
    for factor, smaller in rules:
        if n < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def _concurrent_ops(net, env) -> int:
    """``nvlsChannels x nHeads`` (NVLS runs on Hopper and later: other classes take Hopper's)."""
    heads = max(1, int(round(net.p / net.nodes)))  # NVLS graph: one head per GPU of a node
    return NVLS_CHANNELS.get(env.arch, NVLS_CHANNELS["hopper"]) * heads


def achieved_algbw_GBps(op: str, algo: str, estimate_GBps: float, net, env) -> float:
    """The algorithm bandwidth nccl-tests measures.

    Parameters
    ----------
    op, algo : collective and NCCL algorithm.
    estimate_GBps : NCCL's estimated algorithm bandwidth (GB/s).
    net : the group's links (``bw_intra_Bps``: NVLink line rate per GPU and direction, B/s).
    env : the machine as NCCL sees it (``arch``).

    Returns
    -------
    float
        GB/s: the estimate, capped for the NVLS and NVLS-tree all-reduce at
        :data:`NVLS_ALGBW_FRACTION` of the line rate where that fraction was measured.
    """
    frac = NVLS_ALGBW_FRACTION.get(env.arch)
    if algo in ("nvls", "nvls_tree") and op == "all_reduce" and frac is not None:
        return min(estimate_GBps, frac * net.bw_intra_Bps / 1e9)
    return estimate_GBps


def fill_levels(op: str, algo: str, net, env, algbw_GBps: float,
                estimate_GBps: float) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The pipeline fill (µs) as a step function of the message size.

    Parameters
    ----------
    op, algo : collective and NCCL algorithm (a fill is modelled for the NVLS all-reduce).
    net, env : the group's links and the machine as NCCL sees it.
    algbw_GBps : the achieved algorithm bandwidth (GB/s, :func:`achieved_algbw_GBps`).
    estimate_GBps : NCCL's estimate of it (GB/s), which one of NCCL's chunk rules reads.

    Returns
    -------
    tuple or None
        ``(edges, fills, slope)``: :data:`FILL_EDGES` ascending sizes (bytes; ``inf`` pads) and
        one more fill (µs), ``fills[k]`` applying from ``edges[k-1]`` (inclusive) to
        ``edges[k]``: ``FILL_CHUNKS[algo] x concurrentOps x chunk / algBw``, and ``slope``
        ``FILL_CHUNKS[algo] / algBw`` (µs per byte), which caps the fill at
        ``FILL_CHUNKS[algo] x n / algBw`` (:func:`fill_us`): a message smaller than
        ``concurrentOps x chunk`` gives each concurrent op ``n / concurrentOps`` bytes, not a
        chunk (the cap of the tree's fill, :mod:`.tree`; nothing fitted). None where no fill
        is modelled.
    """
    depth = FILL_CHUNKS.get(algo)
    if depth is None or op != "all_reduce" or algbw_GBps <= 0:
        return None
    ops = _concurrent_ops(net, env)
    top, rules = (_nvls_rules(net.nodes, estimate_GBps) if algo == "nvls"
                  else _nvls_tree_rules(net.nodes))
    # the chunk changes only where a rule's threshold factor x ops x chunk is crossed
    sizes = {0.0} | {float(f * ops * c) for f, _ in rules for c in (top, *(s for _, s in rules))}
    edges, chunks = [], [nvls_chunk_bytes(algo, 0.0, ops, net.nodes, estimate_GBps)]
    for n in sorted(sizes):
        c = nvls_chunk_bytes(algo, n, ops, net.nodes, estimate_GBps)
        if c != chunks[-1]:
            edges.append(n)
            chunks.append(c)
    edges += [math.inf] * (FILL_EDGES - len(edges))
    chunks += [chunks[-1]] * (FILL_EDGES + 1 - len(chunks))
    fills = tuple(depth * ops * c / (1e3 * algbw_GBps) for c in chunks)
    return tuple(edges), fills, depth / (1e3 * algbw_GBps)


def fill_us(n: float, levels: tuple | None) -> float:
    """The fill (µs) at ``n`` bytes of ``(edges, fills, slope)`` levels (:func:`fill_levels`,
    :func:`.tree.tree_fill_levels`): the step's fill, capped at ``slope·n`` where the slope is
    finite; 0 where there is none."""
    if levels is None:
        return 0.0
    edges, fills, slope = levels
    fill = fills[sum(n >= e for e in edges)]
    return fill if slope == math.inf else min(fill, slope * n)

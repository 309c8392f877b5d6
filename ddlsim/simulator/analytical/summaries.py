"""Block summaries: a scalar step's max-plus form (:mod:`.maxplus`) and its accounting.

A step is scalar when its block has at most one recv (without deps) and at most one send
(after compute-stream instructions only), no collective across classes, no wait on the
compute stream, and no compute-stream instruction waiting for another stream. Instructions on
other streams (gradient buckets hanging off the backward) may be present: they cannot change
the compute stream, so they are replayed by the scheduler afterwards, in step order.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from ..timing import NOT_COMM
from .instructions import COLL, COMPUTE, RECV, SEND, WAIT, Instr

__all__ = ["Summary", "summarise", "closed_streams", "shape_summary"]

class Summary(NamedTuple):
    """A scalar step's max-plus form and its accounting (see the module docstring).

    ``E`` is the compute-stream seconds up to and including the send's last dep, ``after``
    whether that dep comes after the first instruction waiting for the message; ``exposed``
    and ``nbytes`` are (label, seconds or bytes) pairs; ``side``: the block also uses other
    streams (replayed by the scheduler, which then does its accounting).
    """

    A: float
    F: float
    waits: bool
    recv: Instr | None
    send: Instr | None
    E: float
    after: bool
    side: bool
    compute: float
    optimizer: float
    flops: float
    exposed: tuple[tuple[str, float], ...]
    nbytes: tuple[tuple[str, float], ...]
    blocking: bool = False
    #: per closed stream the block uses, (stream, how long before the step's end it is
    #: free): its ops follow the message rigidly, as the step's end does
    tails: tuple[tuple[int, float], ...] = ()


def closed_streams(programs: list) -> frozenset[int]:
    """Streams every block drains itself: wherever one is used, its ops are class-local
    collectives, compute ops or waits, and a compute-stream wait for it follows its last op
    in the block (the TP overlaps of ``ddlsim.workloads.decoder.tp_overlap``). Such a stream
    is free when each block begins, so a block using it is still a max-plus affine map of the
    compute stream (:func:`summarise`)."""
    used: set[int] = set()
    bad: set[int] = set()
    seen: set[int] = set()
    for p in programs:
        for instrs, shape in zip(p.blocks, p.shapes):
            if shape in seen:   # blocks of one shape differ only in p2p peers and times
                continue
            seen.add(shape)
            pending: set[int] = set()   # streams with ops not yet waited for
            for x in instrs:
                sid = x.stream
                if sid == 0:
                    if x.code == WAIT:
                        pending.discard(x.target)
                    continue
                used.add(sid)
                if x.code == SEND or x.code == RECV or x.group is not None:
                    bad.add(sid)
                pending.add(sid)
            bad |= pending
    return frozenset(used - bad)


def _volume(instrs: tuple[Instr, ...]) -> tuple[float, dict[str, float]] | None:
    """A block's FLOPs and communication bytes by label (collectives and sends), or None
    when a collective meets other classes (such a block is never scalar)."""
    flops = 0.0
    nbytes: dict[str, float] = defaultdict(float)
    for x in instrs:
        if x.group is not None:
            return None
        if x.code == COMPUTE:
            flops += x.flops
        elif x.code == COLL or x.code == SEND:
            nbytes[x.label] += x.nbytes
    return flops, nbytes


def summarise(instrs: tuple[Instr, ...], closed: frozenset[int] = frozenset()) -> Summary | None:
    """The max-plus form of a block, or None when it is not scalar.

    Ops on a ``closed`` stream (:func:`closed_streams`) and the compute stream's waits for
    them are timed here, by the timing rule from the block's start, provided they all come
    after the first instruction that waits for the block's received message (if any), or are
    that instruction: a wait on a closed stream for both the message and the compute stream
    (the overlapped TP backward's first collective waits so), when no compute-stream
    instruction runs between it and the compute stream's first use of the message. The
    rest of the block then runs rigidly from that instruction's start, and ``A`` is the
    compute stream's end with the waits' gaps, booked as exposed communication of the
    awaited stream's last collective as the scheduler books them. Every instruction of the
    compute stream and of the closed streams is timed by the timing rule from the block's
    start, all streams free at 0; with no closed stream, ``A`` is the sum of the compute
    stream's durations."""
    recvs = [i for i, x in enumerate(instrs) if x.code == RECV]
    sends = [i for i, x in enumerate(instrs) if x.code == SEND]
    # a blocking receive: posted after a wait on the compute stream that opens the block,
    # i.e. when the compute stream is free (the step's f); see :func:`nodes`
    opens = bool(instrs) and instrs[0].code == WAIT and instrs[0].stream == 0 \
        and instrs[0].target == 0 and not instrs[0].deps
    blocking = bool(recvs) and opens and instrs[recvs[0]].deps == (0,)
    if len(recvs) > 1 or len(sends) > 1 or (recvs and instrs[recvs[0]].deps and not blocking):
        return None
    volume = _volume(instrs)
    if volume is None:
        return None
    r = recvs[0] if recvs else -1
    send = instrs[sends[0]] if sends else None
    # (end, label, duration) of each timed instruction, as the scheduler's ``loc``
    loc: dict[int, tuple[float, str, float]] = {0: (0.0, "", 0.0)} if blocking else {}
    free: dict[int, float] = dict.fromkeys(closed, 0.0)
    last_kind: dict[int, str] = dict.fromkeys(closed, "")
    t0 = F = 0.0
    first_wait = -1
    side = False
    compute = optimizer = 0.0
    exposed: dict[str, float] = defaultdict(float)
    used: set[int] = set()
    gated: set[int] = set()   # instructions after the message (directly or through deps)
    gate = True   # False from a closed stream's anchor to the compute stream's first such
    for i, x in enumerate(instrs):
        if x.code == SEND or x.code == RECV:
            continue
        if x.stream != 0 and x.stream not in closed:
            side = True
            continue
        joins = False
        if x.stream in closed and first_wait < 0 and r >= 0:
            # issued before the message is waited for: not rigid after it, unless it waits
            # for both the message and the compute stream (the step's anchor, then)
            if not (x.code == WAIT and x.target == 0 and r in x.deps):
                return None
            joins = True
        ready, why, why_dur = 0.0, "", 0.0
        for d in x.deps:
            if d == r:
                continue
            e = loc.get(d)
            if e is None:
                return None
            if e[0] > ready:
                ready, why, why_dur = e
        after_msg = r >= 0 and (r in x.deps or not gated.isdisjoint(x.deps))
        if after_msg:
            gated.add(i)
        if x.stream == 0:
            if after_msg:
                if first_wait < 0:
                    first_wait, F = i, max(t0, ready)
                gate = True
            elif not gate:
                return None   # runs before the message beside a stream that waits for it
        if joins:
            if ready > t0:
                return None
            first_wait, F, gate = i, t0, False
        if x.code == WAIT:
            if i == 0 and blocking:   # the blocking receive's anchor: the step's own f
                continue
            if x.target == 0:
                if x.stream == 0:
                    return None
                target_free, kind = t0, "compute"
            elif x.target in closed:
                if first_wait < 0 and r >= 0:
                    return None
                target_free, kind = free[x.target], last_kind[x.target]
            else:
                return None
            if target_free > ready:
                ready, why, why_dur = target_free, kind, float("inf")
        f = t0 if x.stream == 0 else free[x.stream]
        if ready > f:
            if x.stream == 0:
                gap = ready - f
                exp = gap if why_dur >= gap else why_dur
                if exp > 0 and why not in NOT_COMM:
                    exposed[why] += exp
                    gap -= exp
                if gap > 0:
                    return None   # a bubble inside the block: left to the scheduler
            f = ready
        end = f + x.dur
        if x.stream == 0:
            t0 = end
            if x.code == COLL:
                exposed[x.label] += x.dur
            elif x.code == COMPUTE:
                if x.label == "optimizer":
                    optimizer += x.dur
                else:
                    compute += x.dur
        else:
            free[x.stream] = end
            used.add(x.stream)
            if x.code == COLL:
                last_kind[x.stream] = x.label
        loc[i] = (end, x.label, x.dur)
    if any(v > t0 for v in free.values()):
        return None
    if send is not None and (not send.deps or any(d not in loc for d in send.deps)):
        return None
    last = max(send.deps) if send is not None else -1
    E = max(loc[d][0] for d in send.deps) if send is not None else 0.0
    return Summary(t0, F if first_wait >= 0 else t0, first_wait >= 0,
                   instrs[r] if r >= 0 else None, send, E,
                   0 <= first_wait <= last, side, compute, optimizer, volume[0],
                   tuple(exposed.items()), tuple(volume[1].items()), blocking,
                   tuple((sid, t0 - free[sid]) for sid in sorted(used)))


def shape_summary(instrs: tuple[Instr, ...], shape: int, cache: dict,
             closed: frozenset[int] = frozenset()) -> Summary | None:
    """:func:`summarise`, once per block shape (blocks that differ only in their
    point-to-point peers and transfer times, one per pipeline stage, share the work)."""
    hit = cache.get(shape)
    if hit is None:
        s = summarise(instrs, closed)
        where = (-1, -1) if s is None else tuple(
            next((i for i, x in enumerate(instrs) if x.code == code), -1) for code in (RECV, SEND))
        hit = cache[shape] = (s, where)
    s, (r, snd) = hit
    if s is None or (r < 0 and snd < 0):
        return s
    return tuple.__new__(Summary, (s[0], s[1], s[2], instrs[r] if r >= 0 else None,
                                   instrs[snd] if snd >= 0 else None) + s[5:])   # (fast)

"""The timing rule and the gap attribution, written once for both engines.

Every op of a stream starts when the stream is free and its inputs are ready, and holds the
stream for its duration::

    start = max(ready, stream free);   end = start + duration

(the analytical engine applies it to closed-form durations, the DES to the ends of its flow
simulation). Idle time on a class's compute stream (stream 0) before an op is attributed to
what the op waited for: the op whose end set ``ready`` (``why``, with that op's duration
``why_dur``) accounts for the gap as exposed communication of its kind up to its duration,
the rest is pipeline bubble. Waiting for peers at a collective, or for a compute op, is
bubble. After a class's last compute-stream op, communication still running is exposed
communication of the stream that ends last.
"""

from __future__ import annotations

from .result import ClassTiming

__all__ = ["NOT_COMM", "HOST", "stream_kinds", "attribute_gap", "split_gaps", "book", "finish_class"]

#: ``why`` labels whose waits are never exposed communication.
NOT_COMM = frozenset({"", "bubble", "compute", "host"})
#: The label of a compute op on the ``host`` stream (the host's launches, Python and syncs):
#: the device's idle time waiting for one is :attr:`~ddlsim.simulator.result.Breakdown.host_s`.
HOST = "host"


def stream_kinds(streams: dict[str, int]) -> dict[int, str]:
    """The kinds :func:`finish_class` starts from, per stream id of ``streams`` (name → id):
    :data:`HOST` for the host stream, which carries the host's work and no collective, so
    its run past the device is the wait for the host; the other streams take the kind of
    their last collective as they run."""
    return {sid: HOST for name, sid in streams.items() if name == HOST}


def attribute_gap(T: ClassTiming, gap: float, why: str, why_dur: float) -> None:
    """Book ``gap`` seconds of compute-stream idle time of a class.

    Parameters
    ----------
    T : the class's accumulators.
    gap : idle seconds before the op, ``start - stream free`` (> 0).
    why : label of the op whose end made the op ready (a group kind such as ``pp``,
        ``bubble`` for a collective's rendezvous, ``compute``…).
    why_dur : that op's duration in seconds (``inf`` for a wait on a stream).
    """
    if why == HOST:   # the device waited for the host
        T.host += gap
        return
    exp = gap if why_dur >= gap else why_dur
    if exp > 0 and why not in NOT_COMM:
        T.exposed[why] += exp
        gap -= exp
    T.bubble += gap


def split_gaps(gap, why_dur):
    """:func:`attribute_gap` for arrays of gaps that all waited for communication: (exposed,
    bubble) seconds, ``exposed = min(gap, why_dur)`` and the rest bubble.

    Parameters
    ----------
    gap : array of idle seconds (>= 0).
    why_dur : array of the durations of the transfers waited for.
    """
    import numpy as np

    exposed = np.minimum(gap, why_dur)
    return exposed, gap - exposed


def book(T: ClassTiming, compute_stream: bool, label: str, is_compute: bool, dur: float,
         flops: float, nbytes: float) -> None:
    """Account one executed op: FLOPs and bytes always; on the compute stream its duration as
    compute, optimizer or exposed communication of its kind.

    Parameters
    ----------
    T : the class's accumulators.
    compute_stream : whether the op ran on stream 0.
    label : ``compute``/``optimizer`` for compute ops, else the group kind.
    is_compute : a compute op (else a collective).
    dur : seconds it held its stream.
    flops, nbytes : what it adds to the class's FLOPs and communication bytes.
    """
    if is_compute:
        T.flops += flops
        if compute_stream:
            if label == "optimizer":
                T.optimizer += dur
            else:
                T.compute += dur
        return
    T.comm_bytes[label] += nbytes
    if compute_stream:
        T.exposed[label] += dur


def finish_class(T: ClassTiming, free: dict[int, float] | list[float],
                 kind: dict[int, str] | list[str]) -> None:
    """Set the class's end to its latest stream end; communication running after the last
    compute-stream op is exposed communication of the (lowest-numbered) stream ending last.

    Parameters
    ----------
    T : the class's accumulators.
    free : per stream id, when the stream is free (its last op's end), seconds.
    kind : per stream id, the label of its last communication op, :data:`HOST` for the
        host stream (``""`` if none).
    """
    items = free.items() if isinstance(free, dict) else enumerate(free)
    end, compute_end, tail = 0.0, 0.0, None
    for sid, t in sorted(items):
        if sid == 0:
            compute_end = t
        if t > end or tail is None and t == end:
            end, tail = t, sid
    if end > compute_end:
        label = kind[tail] if isinstance(kind, list) else kind.get(tail, "")
        if label == HOST:   # the host ends the iteration, behind the device
            T.host += end - compute_end
        else:
            T.exposed[label or "other"] += end - compute_end
    T.end = end

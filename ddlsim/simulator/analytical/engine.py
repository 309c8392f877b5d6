"""The analytical engine: a contention-free list scheduler over the workload trace.

Every op gets its closed-form duration from :class:`~ddlsim.simulator.costs.CostModel`
(:mod:`.instructions`); the engine then times the program exactly as the trace semantics say
(streams in issue order, dependencies, collective rendezvous across rank classes,
point-to-point matching; :mod:`.interpreter`), so pipeline schedules are timed step by step
rather than by the bubble formula, and gradient buckets overlap backward as their
dependencies allow. One representative rank per class is simulated.

Runs of scalar steps (:mod:`.maxplus`) are timed all at once by the max-plus recurrence they
obey, vectorised over steps: the scheduler runs each class up to such a run and parks it
there, and when no class can go on, the parked classes' runs are solved together
(:mod:`.rounds`); the scheduler replays the solved steps that also use other streams and
times the rest. Both apply the one timing rule and gap attribution
of :mod:`ddlsim.simulator.timing`: idle time on a class's compute stream waiting for a
received activation counts as exposed ``pp`` communication up to the transfer's duration and
as pipeline bubble beyond it; waiting on a communication stream (DDP buckets, ZeRO prefetch)
counts as exposed communication of that group's kind; waiting for peers at a collective
counts as bubble (load imbalance).
"""

from __future__ import annotations

from collections import deque

from ...errors import DeadlockError
from ...workloads.trace import Workload
from ..costs import CostModel
from ..result import ClassTiming, EngineRun
from ..timing import stream_kinds
from .instructions import lower
from .interpreter import State, run_class
from .rounds import Rounds

__all__ = ["simulate_analytical", "ClassTiming"]

#: Time runs of scalar steps with the vectorised max-plus solver (False: the scheduler
#: times every step; tests compare the two).
SOLVER = True


def simulate_analytical(workload: Workload, cost: CostModel, *,
                        record_spans: bool = False) -> EngineRun:
    """Time every rank class; raises :class:`DeadlockError` if the program cannot finish.

    Parameters
    ----------
    workload : the trace of one iteration.
    cost : the closed-form durations of its ops.
    record_spans : also return the spans of each class's representative (first) rank, as
        the engine times them (same timings: recording only observes).

    Returns
    -------
    EngineRun
        ``timings``: one :class:`ClassTiming` per class, in ``workload.classes`` order
        (``end`` in seconds); ``algorithms``: the collective choices of the ops it timed
        (:meth:`~ddlsim.simulator.costs.CostModel.choice` key → label); with ``record_spans``,
        ``spans``: :class:`~ddlsim.simulator.result.Span` sorted by rank, stream and start.
    """
    from ..hostcollectives import on_compute_cores
    workload = on_compute_cores(workload, cost.system)  # a CPU rank's collectives: its cores
    programs, streams, choices = lower(workload, cost)
    st = State(len(programs), len(streams), stream_kinds(streams))
    if record_spans:
        from .spans import SpanRecorder
        st.rec = SpanRecorder(len(programs))
    rounds = Rounds(programs, st) if SOLVER else None
    done = [False] * len(programs)
    queue = deque(range(len(programs)))
    queued = [True] * len(programs)

    def enqueue(classes: list[int]) -> None:
        for w in classes:
            if not queued[w] and not done[w]:
                queued[w] = True
                queue.append(w)
        st.woken.clear()

    while True:
        while queue:
            ci = queue.popleft()
            queued[ci] = False
            done[ci] = run_class(ci, programs[ci], st)
            enqueue(st.woken)
        if not st.parked:
            break
        parked, st.parked = st.parked, []
        rounds.solve(st, parked)   # (or parks no more)
        enqueue(parked + st.woken)
    if not all(done):
        from .deadlock import describe_deadlock
        raise DeadlockError(describe_deadlock(workload, programs, st, done))
    spans = st.rec.spans(workload, streams) if st.rec is not None else ()
    return EngineRun(st.timings, choices, spans)

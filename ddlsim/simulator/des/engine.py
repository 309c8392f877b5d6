"""The discrete-event engine: rank classes run their programs in SimPy over a flow network.

Class lockstep: all ranks of a class run one program, so one SimPy process per class and
stream drives them together (like the analytical engine's representative rank). When a class
reaches a collective, the flows of *every* group instance of that family that its rendezvous
component touches are injected, each routed over the real topology, so traffic from all
groups and stages contends on the links it shares; the collective ends for the class when its
slowest instance ends. A send injects the flows of every rank of the class to its peer.

Timing semantics follow the trace (and the analytical engine): ops on one stream run in issue
order, an op also waits for its ``deps``; a Wait waits for the last op issued before it on
the awaited stream; collectives wait for every class of their rendezvous component;
point-to-point ops never hold their stream: a send is posted when its deps are done, the
transfer starts when the matching recv is posted too, and ops depending on the recv wait for
the transfer. Idle time on the compute stream is attributed by the rules of
:mod:`ddlsim.simulator.timing`, shared with the analytical engine, so both engines'
breakdowns compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from ...errors import DeadlockError
from ...workloads.trace import Workload
from ..costs import CostModel
from ..result import ClassTiming
from ..timing import attribute_gap, book, finish_class, stream_kinds
from .network import FlowNetwork
from .p2p import P2PMatcher
from .program import COLL, COMPUTE, WAIT, ClassProgram, Instr, rendezvous_components, resolve
from .rendezvous import Collectives
from .runs import FlowRecord
from .templates import RouteTable

__all__ = ["ClassTiming", "DESRun", "run_des_engine", "PROGRESS_EVERY"]

#: A progress hook hears from the engine every this many events.
PROGRESS_EVERY = 16_384


@dataclass
class ClassState:
    """What the engine tracks for one class while it runs."""

    index: int
    prog: ClassProgram
    timing: ClassTiming = field(default_factory=ClassTiming)
    info: dict[int, tuple[float, str, float]] = field(default_factory=dict)
    events: dict[int, simpy.Event] = field(default_factory=dict)
    stream_end: dict[int, float] = field(default_factory=dict)
    stream_kind: dict[int, str] = field(default_factory=dict)
    at: dict[int, tuple[int, str]] = field(default_factory=dict)  # stream → (flat, waiting on)
    open_streams: int = 0
    spans: list[tuple[int, str, float, float, str]] | None = None

    def done_event(self, env: simpy.Environment, flat: int) -> simpy.Event:
        ev = self.events.get(flat)
        if ev is None:
            ev = self.events[flat] = env.event()
        return ev

    def finish(self, flat: int, end: float, label: str, dur: float) -> None:
        self.info[flat] = (end, label, dur)
        ev = self.events.pop(flat, None)
        if ev is not None:
            ev.succeed()


@dataclass
class DESRun:
    """Raw output of one simulation (turned into a :class:`~..result.Result` elsewhere)."""

    programs: list[ClassProgram]
    timings: list[ClassTiming]
    streams: dict[str, int]
    spans: list[list[tuple[int, str, float, float, str]] | None]
    network: FlowNetwork
    flow_records: list[FlowRecord] | None
    devices: np.ndarray
    events: int
    algorithms: dict[str, str]  # collective choices, as EngineRun.algorithms


class _Engine:
    def __init__(self, workload: Workload, cost: CostModel, topology, devices: np.ndarray,
                 record_spans: bool, record_flows: bool, audit: bool, shortcuts: bool):
        self.env = env = simpy.Environment()
        self.workload = workload
        self.network = FlowNetwork(env, topology.edge_bandwidth_Bps, audit=audit,
                                   shortcuts=shortcuts)
        routes = RouteTable(topology, self.network)
        self.programs, self.streams, self.choices = resolve(workload, cost)
        kinds = stream_kinds(self.streams)   # the host stream's, preset (finish_class)
        self.states = [ClassState(i, p, stream_kind=dict(kinds),
                                  spans=[] if record_spans else None)
                       for i, p in enumerate(self.programs)]
        self.records: list[FlowRecord] | None = [] if record_flows else None
        self.collectives = Collectives(self, cost, routes, devices,
                                       rendezvous_components(workload))
        self.p2p = P2PMatcher(self, routes, devices, cost)
        self.devices = devices

    # ------------------------------------------------------------------ running
    def run(self, progress=None) -> DESRun:
        if progress is not None:
            progress.start(self.workload)
            try:
                return self._run(progress)
            finally:
                progress.stop()
        return self._run(None)

    def _run(self, progress) -> DESRun:
        env = self.env
        for st in self.states:
            streams = st.prog.stream_ops
            st.open_streams = len(streams)
            for sid, flats in streams.items():
                env.process(self._stream(st, sid, flats))
            self.p2p.arm(st)
            if not streams:
                self._class_done(st)
        events = 0
        step = env.step
        while True:
            try:
                step()
            except simpy.core.EmptySchedule:
                break
            events += 1
            if progress is not None and not events % PROGRESS_EVERY:
                progress.update(env.now, events)
        self._check_finished()
        self.network.close()
        return DESRun(self.programs, [s.timing for s in self.states], self.streams,
                      [s.spans for s in self.states], self.network, self.records, self.devices,
                      events, self.choices)

    def _stream(self, st: ClassState, sid: int, flats: list[int]):
        """One class's stream: its ops in issue order. ``st.at`` names where the stream
        waits whenever it waits on something that may never come (deadlock reports)."""
        env, info, instrs, bases = self.env, st.info, st.prog.instrs, st.prog.bases
        free = 0.0
        for flat in flats:
            ins = instrs[flat]
            ready, why, why_dur = 0.0, "", 0.0
            base = bases[flat]
            for d in ins.deps:
                got = info.get(base + d)
                if got is None:
                    st.at[sid] = (flat, "deps")
                    yield st.done_event(env, base + d)
                    got = info[base + d]
                if got[0] > ready:
                    ready, why, why_dur = got
            code = ins.code
            if code == COLL:
                issue, why, why_dur = yield from self._rendezvous(st, sid, flat, ins, why,
                                                                  why_dur)
            elif code == WAIT:
                why, why_dur = yield from self._join(st, sid, flat, ready, why, why_dur)
            start = env.now
            if sid == 0 and start > free:
                attribute_gap(st.timing, start - free, why, why_dur)
            if code == COMPUTE:
                if ins.duration_s > 0:
                    yield env.timeout(ins.duration_s)
                book(st.timing, sid == 0, ins.label, True, ins.duration_s, ins.flops, 0.0)
            elif code == COLL:
                if not issue.ended:
                    st.at[sid] = (flat, "collective")
                    yield issue.end_event()
                book(st.timing, sid == 0, ins.label, False, env.now - start, 0.0, ins.nbytes)
                st.stream_kind[sid] = ins.label
            free = end = env.now
            st.finish(flat, end, ins.label, end - start)
            if st.spans is not None and (end > start or code != WAIT):
                st.spans.append((sid, ins.name, start, end, "wait" if code == WAIT
                                 else ins.label))
        st.stream_end[sid] = free
        st.at.pop(sid, None)
        st.open_streams -= 1
        if st.open_streams == 0:
            self._class_done(st)

    def _join(self, st: ClassState, sid: int, flat: int, ready: float, why: str,
              why_dur: float):
        """A Wait: the last op issued before it on the awaited stream; returns why the
        op waited last (label, how long that op took)."""
        target, label = st.prog.waits[flat]
        if target >= 0:
            info = st.info
            if target not in info:
                st.at[sid] = (flat, "wait")
                yield st.done_event(self.env, target)
            if info[target][0] > ready:
                why, why_dur = label, np.inf
        return why, why_dur

    def _rendezvous(self, st: ClassState, sid: int, flat: int, ins: Instr, why: str,
                    why_dur: float):
        """A collective: wait for its group to start it; returns its issue and why the op
        waited last (``bubble`` when the group started it after this class arrived)."""
        env = self.env
        arrived = env.now
        issue = self.collectives.arrive(st, flat, ins)
        if not issue.started:
            st.at[sid] = (flat, "rendezvous")
            yield issue.start_event()
        if env.now > arrived:
            why, why_dur = "bubble", 0.0
        return issue, why, why_dur

    def _class_done(self, st: ClassState) -> None:
        finish_class(st.timing, st.stream_end, st.stream_kind)

    # ------------------------------------------------------------------ deadlock
    def _check_finished(self) -> None:
        from .deadlock import describe_deadlock
        stuck = [st for st in self.states if st.open_streams > 0 or st.at]
        unmatched = self.p2p.unmatched()
        if stuck or unmatched:
            raise DeadlockError(describe_deadlock(self, stuck, unmatched))


def run_des_engine(workload: Workload, cost: CostModel, topology, devices: np.ndarray, *,
                   record_spans: bool = True, record_flows: bool = False,
                   audit: bool = False, shortcuts: bool = True, progress=None) -> DESRun:
    """Simulate one iteration; raises :class:`DeadlockError` if the program cannot finish.

    ``progress``: a :class:`~.progress.Progress` told the start, every :data:`PROGRESS_EVERY` events
    (simulated seconds, events) and the end.
    """
    return _Engine(workload, cost, topology, devices, record_spans, record_flows, audit,
                   shortcuts).run(progress)

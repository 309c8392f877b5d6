"""Collectives: rendezvous of the classes a group family links, then a run of flow phases.

The classes of one rendezvous component (see :func:`.program.rendezvous_components`) count
their issues of collectives on a family; the n-th issue of every class of the component is
one collective, started when the last class arrives (the analytical engine's matching rule).
The algorithm is the one the analytical engine uses for the op (the run's choice, or the
cheapest closed form), so both engines time the same algorithm; when a calibration profile
times the op, its flows are stretched to the profile's time (:mod:`.calibrated`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import simpy

from ..costs import CostModel
from .program import Instr
from .calibrated import alone_seconds, stretch_template
from .runs import TemplateRun
from ..collectives import get_algorithm, split_weights
from .templates import FlowTemplate, RouteTable, collective_template

__all__ = ["Collectives", "CollectiveIssue"]


class CollectiveIssue:
    """One collective as the classes that take part see it: started? ended? Its start and
    end events exist only once a class waits for them (most collectives start at the
    arrival of their only class, and an event nobody waits for would still cost a step)."""

    __slots__ = ("started", "ended", "_start_ev", "_end_ev", "env", "op", "classes",
                 "arrived")

    def __init__(self, env: simpy.Environment, op, classes: tuple[int, ...]):
        self.started = self.ended = False
        self._start_ev = self._end_ev = None
        self.env, self.op, self.classes = env, op, classes
        self.arrived: dict[int, Instr] = {}

    def start_event(self) -> simpy.Event:
        """The event of the start (succeeds at :meth:`begin`)."""
        if self._start_ev is None:
            self._start_ev = self.env.event()
        return self._start_ev

    def end_event(self) -> simpy.Event:
        """The event of the end (succeeds at :meth:`finish`)."""
        if self._end_ev is None:
            self._end_ev = self.env.event()
        return self._end_ev

    def begin(self) -> None:
        self.started = True
        if self._start_ev is not None:
            self._start_ev.succeed()

    def finish(self, _end: float) -> None:
        self.ended = True
        if self._end_ev is not None:
            self._end_ev.succeed()


class Collectives:
    """Matches the classes' collective issues and launches their flow runs."""

    def __init__(self, engine, cost: CostModel, routes: RouteTable, devices: np.ndarray,
                 components: dict[str, tuple[np.ndarray, list[tuple[int, ...]]]]):
        self.engine, self.cost, self.routes, self.devices = engine, cost, routes, devices
        self.components = components
        self.class_of = engine.workload.class_of()
        self.open: dict[tuple[str, int, int], CollectiveIssue] = {}
        self._occ: dict[tuple[int, str], int] = defaultdict(int)
        self._templates: dict[tuple, FlowTemplate] = {}
        self._plans: dict[tuple[int, int], tuple[FlowTemplate | None, float, object]] = {}
        self._comps: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
        #: (template id, bytes, measured s) -> (stretched template, the template, kept alive)
        self._stretched: dict[tuple, tuple[FlowTemplate, FlowTemplate]] = {}

    def arrive(self, st, flat: int, ins: Instr) -> CollectiveIssue:
        """Class ``st`` reached collective ``ins``; the issue starts when its component has."""
        op = ins.payload
        cid, classes = self._component(op.group, st.index)
        env = self.engine.env
        if len(classes) == 1:
            issue = CollectiveIssue(env, op, classes)
            self._launch(issue, ins, cid)
            return issue
        n = self._occ[(st.index, op.group)]
        self._occ[(st.index, op.group)] = n + 1
        key = (op.group, cid, n)
        issue = self.open.get(key)
        if issue is None:
            issue = self.open[key] = CollectiveIssue(env, op, classes)
        issue.arrived[st.index] = ins
        if len(issue.arrived) == len(classes):
            del self.open[key]
            self._launch(issue, issue.arrived[min(issue.arrived)], cid)
        return issue

    def _component(self, group: str, cls: int) -> tuple[int, tuple[int, ...]]:
        """The rendezvous component of class ``cls`` on family ``group`` and its classes."""
        got = self._comps.get((group, cls))
        if got is None:
            comp_of, members = self.components[group]
            cid = int(comp_of[cls])
            got = self._comps[(group, cls)] = (cid, members[cid])
        return got

    def _launch(self, issue: CollectiveIssue, ins: Instr, cid: int) -> None:
        issue.begin()
        tpl, nbytes = self._plan(ins.payload, cid)
        if tpl is None:
            issue.finish(self.engine.env.now)
            return
        eng = self.engine
        TemplateRun(eng.env, eng.network, tpl, nbytes, ins.repeat, issue.finish, eng.records)

    def _plan(self, op, cid: int) -> tuple[FlowTemplate | None, float]:
        """The flow template of ``op`` on component ``cid`` (None on a group of one) and
        the bytes of one issue, looked up once per op and component (an op of a block is
        issued once per step)."""
        got = self._plans.get((id(op), cid))
        if got is None:
            tpl, nbytes = None, op.bytes if op.split_bytes is None else float(sum(op.split_bytes))
            if self.engine.workload.groups[op.group].size > 1:
                choice = self.cost.choice(op)  # the closed form the analytical engine times
                tpl = self._template(op, cid, choice.algorithm)
                if choice.closed_form_s is not None:  # a profile's time: the same, stretched
                    tpl = self._calibrated(tpl, nbytes, choice)
            got = self._plans[(id(op), cid)] = (tpl, nbytes, op)  # op kept: its id stays its own
        return got[0], got[1]

    def _calibrated(self, tpl: FlowTemplate, nbytes: float, choice) -> FlowTemplate:
        """``tpl`` stretched to the profile's time of one issue (:mod:`.calibrated`)."""
        key = (id(tpl), nbytes, choice.time_s)
        got = self._stretched.get(key)
        if got is None:
            alone = alone_seconds(tpl, nbytes, self.engine.network.capacity_Bps)
            alone = choice.closed_form_s if alone is None else alone
            got = self._stretched[key] = (stretch_template(tpl, choice.time_s, alone), tpl)
        return got[0]

    def _template(self, op, cid: int, algo: str) -> FlowTemplate:
        group, kind, split, split_by = op.group, op.op, op.split_bytes, op.split_by
        root = op.root % self.engine.workload.groups[group].size
        sized = get_algorithm(kind, algo).layout is not None  # a layout per size (NCCL's)
        key = (group, cid, kind, algo, root, split, split_by, op.bytes if sized else None)
        tpl = self._templates.get(key)
        if tpl is None:
            fam = self.engine.workload.groups[group]
            classes = np.asarray(self.components[group][1][cid])
            rows = np.flatnonzero(np.isin(self.class_of[fam.members], classes).any(axis=1))
            g = self.cost.nets[group].g
            weights = None if split is None else split_weights(split, split_by)
            phases = self.cost.phases(op, algo, weights)  # None: the generic uneven form
            tpl = collective_template(self.routes, self.devices, fam.members[rows], kind, algo,
                                      root, g, f"{group}.{kind}/{algo}", weights, phases)
            self._templates[key] = tpl
        return tpl

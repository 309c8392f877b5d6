"""Runs of a flow template: every group instance steps through the phases on its own.

An instance's phase is a set of concurrent flows; when the last of them has delivered its
bytes, the phase's per-message latency (``repeat ×`` the instance's step latency, see
:class:`~.templates.PhaseFlows`) elapses and the instance starts its next phase. A phase with ``repeat = r`` is one flow set
carrying ``r`` × the bytes (the steps of a ring are pipelined back to back; exact while the
rates stay put, see docs/engines.md). The run is done when its slowest instance is.
Instances that finish a phase at the same instant move on together, as one submission.

A run that starts on idle links and whose phases are uniform (:mod:`.express`) reserves its
links and sleeps to its end; other traffic arriving on them materialises it first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from .express import IsolatedPhase, isolated_profile
from .network import FlowNetwork
from .templates import FlowTemplate, PhaseFlows
from .uniq import unique_inverse, unique_values

__all__ = ["TemplateRun", "FlowRecord"]

#: (template name, phase, instance, start_s, end_s, bytes per flow, first member rank)
FlowRecord = tuple[str, int, int, float, float, float, int]

_UNSET = object()  # a cache entry not computed yet (None is a value: no isolated profile)


class TemplateRun:
    """One issue of ``template`` moving ``nbytes`` (× ``repeat``); calls ``on_done(end)``.

    Parameters
    ----------
    env, network : the simulation and its links.
    template : the phases and flows of every instance.
    nbytes : bytes of one issue of the op (nccl-tests convention).
    repeat : back-to-back issues folded into this run.
    on_done : called once, at the instant the last instance finishes.
    records : if a list, one :data:`FlowRecord` per instance and phase is appended.
    """

    __slots__ = ("env", "network", "template", "nbytes", "repeat", "on_done", "records",
                 "left", "express")

    def __init__(self, env: simpy.Environment, network: FlowNetwork, template: FlowTemplate,
                 nbytes: float, repeat: int, on_done: Callable[[float], None],
                 records: list[FlowRecord] | None = None):
        self.env, self.network, self.template = env, network, template
        self.nbytes, self.repeat, self.on_done, self.records = nbytes, repeat, on_done, records
        self.left = template.instances
        self.express: tuple | None = None
        if self.left == 0:
            on_done(env.now)
        elif not self._try_express():
            self.start(np.arange(template.instances), 0)

    def _flow_bytes(self, ph: PhaseFlows) -> float:
        return ph.bytes_per_byte * self.nbytes * ph.repeat * self.repeat

    def _latency(self, ph: PhaseFlows, step_latency_s):
        return ph.repeat * self.repeat * step_latency_s

    # ------------------------------------------------------------------ flows
    def start(self, instances: np.ndarray, k: int, fraction: float = 1.0,
              started: float | None = None) -> None:
        """Start phase ``k`` (``fraction`` of its bytes left) for ``instances``, or finish
        them after the last phase."""
        phases = self.template.phases
        if k == len(phases):
            self.left -= len(instances)
            if self.left == 0:
                self.on_done(self.env.now)
            return
        ph = phases[k]
        flow_bytes = self._flow_bytes(ph) * fraction
        started = self.env.now if started is None else started
        counts = ph.starts[instances + 1] - ph.starts[instances]
        moving = counts > 0 if flow_bytes > 0 else np.zeros(len(instances), dtype=bool)
        if not moving.all():
            self.phase_done(k, instances[~moving], started)
        if moving.any():
            insts = instances[moving]
            rows, which = ph.rows_of(insts)
            sub = _Submission(self, k, insts, which, started)
            nbytes = np.full(len(rows), flow_bytes) if ph.weight is None \
                else flow_bytes * ph.weight[rows]
            whole = len(rows) == len(ph.edges)  # every instance: the phase's own rows
            if whole:  # booked per phase: its rows' bytes summed, folded into links once
                self.network.links.carry_phase(
                    ph, ph.edges, ph.mult if ph.weight is None else ph.mult * ph.weight,
                    flow_bytes)
            self.network.submit(sub, ph.edges[rows], nbytes, ph.mult[rows], booked=whole)

    def phase_done(self, k: int, instances: np.ndarray, started: float) -> None:
        """``instances`` delivered phase ``k``'s bytes; wait out its latency, then go on."""
        if len(instances) == 0:
            return
        ph = self.template.phases[k]
        if self.records is not None:
            self._record(k, instances, started, self.env.now, self._flow_bytes(ph))
        levels, group = unique_inverse(self._latency(ph, ph.latency_s[instances]))
        for i, lat in enumerate(levels):
            self._after(float(lat), instances[group == i], k + 1)

    def _after(self, delay: float, instances: np.ndarray, k: int) -> None:
        if delay > 0:
            ev = self.env.timeout(delay)
            ev.callbacks.append(lambda _e: self.start(instances, k))
        else:
            self.start(instances, k)

    def _record(self, k: int, instances: np.ndarray, start: float, end: float,
                flow_bytes: float) -> None:
        first = self.template.members[instances, 0]
        for inst, rank in zip(instances.tolist(), first.tolist()):
            self.records.append((self.template.name, k, inst, start, end, flow_bytes, rank))

    # ------------------------------------------------------------------ express
    def _try_express(self) -> bool:
        """Reserve idle links and sleep to the end, if the isolated timeline is exact (no
        other flow crosses the run's links while it holds them: a flow submitted over one
        materialises it first)."""
        net = self.network
        if not net.shortcuts:
            return False
        cache = self.template.cache
        profile = cache.get("isolated", _UNSET)
        if profile is _UNSET:
            profile = cache["isolated"] = isolated_profile(self.template, net.capacity_Bps)
        if profile is None:
            return False
        links = cache.get("links")
        if links is None:  # every link a phase's flows cross
            links = cache["links"] = unique_values(np.concatenate([iso.links for iso in profile]))
        if not net.idle(links):
            return False
        plan, total = self._plan(profile)
        self.express = (self.env.now, plan, links, profile)
        net.reserve(links, self)
        self.env.timeout(total).callbacks.append(self._express_end)
        return True

    def _plan(self, profile: tuple[IsolatedPhase, ...]) -> tuple[list, float]:
        """Per phase (transfer seconds, latency seconds) of an isolated run of this size,
        and their sum: computed once per template, size and repeat (an op is issued once
        per micro-batch with the same bytes)."""
        plans = self.template.cache.get("plans")
        if plans is None:
            plans = self.template.cache["plans"] = {}
        key = (self.nbytes, self.repeat)
        got = plans.get(key)
        if got is None:
            plan = [(self._flow_bytes(ph) * iso.seconds_per_byte if len(ph.edges) else 0.0,
                     self._latency(ph, iso.step_latency_s))
                    for ph, iso in zip(self.template.phases, profile)]
            got = plans[key] = (plan, sum(t + lat for t, lat in plan))
        return got

    def _book(self, k: int, iso: IsolatedPhase, fraction: float, start: float, end: float,
              new_flows: bool = True) -> None:
        ph = self.template.phases[k]
        flow_bytes = self._flow_bytes(ph) * fraction
        if len(ph.edges) and flow_bytes > 0:
            self.network.account(ph, ph.edges, ph.mult, flow_bytes, iso.links, end - start,
                                 new_flows)
            if self.network.audit:
                self.network.note_load_ratio(iso.load_ratio)
        if self.records is not None and fraction == 1.0:
            self._record(k, np.arange(self.template.instances), start, end, flow_bytes)

    def _express_end(self, _event: simpy.Event) -> None:
        if self.express is None:  # materialised meanwhile
            return
        t, plan, links, profile = self.express
        self.express = None
        self.network.release(links)
        for k, ((transfer, lat), iso) in enumerate(zip(plan, profile)):
            self._book(k, iso, 1.0, t, t + transfer)
            t += transfer + lat
        self.left = 0
        self.on_done(self.env.now)

    def materialise(self) -> None:
        """Continue as real flows from now: the current phase with the bytes it has left,
        or the rest of the current latency wait."""
        t, plan, links, profile = self.express
        self.express = None
        self.network.release(links)
        now, everyone = self.env.now, np.arange(self.template.instances)
        for k, ((transfer, lat), iso) in enumerate(zip(plan, profile)):
            if now < t + transfer:
                done = (now - t) / transfer
                self._book(k, iso, done, t, now, new_flows=False)
                self.start(everyone, k, fraction=1.0 - done, started=t)
                return
            self._book(k, iso, 1.0, t, t + transfer)
            t += transfer
            if now < t + lat:
                self._after(t + lat - now, everyone, k + 1)
                return
            t += lat
        self.start(everyone, len(plan))


class _Submission:
    """The flows one :meth:`TemplateRun.start` handed to the network."""

    __slots__ = ("run", "k", "instances", "which", "left", "started")

    def __init__(self, run: TemplateRun, k: int, instances: np.ndarray, which: np.ndarray,
                 started: float):
        self.run, self.k, self.instances, self.which = run, k, instances, which
        self.left = np.bincount(which, minlength=len(instances))
        self.started = started

    def flows_done(self, local: np.ndarray) -> None:
        before = self.left > 0
        self.left -= np.bincount(self.which[local], minlength=len(self.instances))
        finished = np.flatnonzero(before & (self.left == 0))
        if len(finished):
            self.run.phase_done(self.k, self.instances[finished], self.started)

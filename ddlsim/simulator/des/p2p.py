"""Point-to-point matching: non-blocking sends and receives between rank classes.

A send of class C is posted when its deps are done (and completes then: it is an isend). Its
ranks' peers may belong to several classes; each destination class D gets one part. A recv
of class D waits for one part from every class its peers belong to. A part is matched by
``(C, D, tag, micro-batch)`` in posting order; its transfer starts when both sides are posted
and moves the bytes of every rank pair at once; the recv completes when its last part has
arrived.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from .calibrated import alone_seconds, stretch_template
from .program import SEND, Instr
from .runs import TemplateRun
from .templates import FlowTemplate, RouteTable, p2p_template

__all__ = ["P2PMatcher"]


@dataclass
class _Recv:
    st: object
    flat: int
    ins: Instr
    left: int
    end: float = 0.0
    dur: float = 0.0


@dataclass
class _Send:
    st: object
    flat: int
    ins: Instr
    dst: int


class P2PMatcher:
    """Posts P2P ops when their deps are done, matches them, runs their transfers."""

    def __init__(self, engine, routes: RouteTable, devices: np.ndarray, cost=None):
        self.engine, self.routes, self.devices, self.cost = engine, routes, devices, cost
        self.class_of = engine.workload.class_of()
        self.sends: dict[tuple, deque[_Send]] = defaultdict(deque)
        self.recvs: dict[tuple, deque[_Recv]] = defaultdict(deque)
        self._index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._peers: dict[tuple, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        self._templates: dict[tuple, FlowTemplate] = {}
        self._together: dict[tuple, FlowTemplate] = {}

    # ------------------------------------------------------------------ posting
    def arm(self, st) -> None:
        """Post each of the class's P2P ops as soon as its deps are done."""
        prog = st.prog
        for flat in prog.p2p_ops:
            base = int(prog.base_of[flat])
            pending = [base + d for d in prog.instrs[flat].deps if base + d not in st.info]
            if not pending:
                self._post(st, flat)
                continue
            left = [len(pending)]

            def ready(_ev, st=st, flat=flat, left=left) -> None:
                left[0] -= 1
                if left[0] == 0:
                    self._post(st, flat)

            for dep in pending:
                st.done_event(self.engine.env, dep).callbacks.append(ready)

    def _post(self, st, flat: int) -> None:
        ins = st.prog.instrs[flat]
        mb = st.prog.microbatch[int(st.prog.step_of[flat])]
        tag = ins.payload.tag
        if ins.code == SEND:
            st.finish(flat, self.engine.env.now, ins.label, 0.0)
            st.timing.comm_bytes[ins.label] += ins.nbytes
            for dst, _src, _dst in self._parts(st.index, ins.payload):
                key = (st.index, dst, tag, mb)
                send = _Send(st, flat, ins, dst)
                if self.recvs.get(key):
                    self._transfer(send, self.recvs[key].popleft())
                else:
                    self.sends[key].append(send)
            return
        sources = [src for src, _a, _b in self._parts(st.index, ins.payload)]
        recv = _Recv(st, flat, ins, len(sources))
        for src in sources:
            key = (src, st.index, tag, mb)
            if self.sends.get(key):
                self._transfer(self.sends[key].popleft(), recv)
            else:
                self.recvs[key].append(recv)

    # ------------------------------------------------------------------ transfers
    def _transfer(self, send: _Send, recv: _Recv) -> None:
        eng = self.engine
        p = send.ins.payload
        tpl = self._template(send.st.index, p, send.dst)
        if self.cost is not None and self.cost.copies:
            tpl = self._shared(send.st.index, p, send.dst, tpl)
        start = eng.env.now

        def delivered(end: float) -> None:
            recv.left -= 1
            recv.end, recv.dur = end, end - start
            for side in (send, recv):
                if side.st.spans is not None:
                    side.st.spans.append((side.ins.stream, side.ins.name, start, end,
                                          "send" if side is send else "recv"))
            if recv.left == 0:
                recv.st.finish(recv.flat, recv.end, recv.ins.label, recv.dur)

        TemplateRun(eng.env, eng.network, tpl, p.bytes, send.ins.repeat, delivered, eng.records)

    def _template(self, cls: int, p, dst: int) -> FlowTemplate:
        key = (cls, p.group, p.peer, dst)
        tpl = self._templates.get(key)
        if tpl is None:
            part = next(x for x in self._parts(cls, p) if x[0] == dst)
            tpl = p2p_template(self.routes, self.devices, part[1], part[2], f"{p.group}.p2p")
            self._templates[key] = tpl
        return tpl

    def _shared(self, cls: int, p, dst: int, tpl: FlowTemplate) -> FlowTemplate:
        """``tpl`` stretched to :meth:`CostModel.p2p_together` of the class's transfers (all
        its parts, sent at once) where that is longer than ``tpl`` alone, as the analytical
        engine times the send (:mod:`ddlsim.simulator.sharedcopies`)."""
        key = (cls, p.group, p.peer, dst, p.bytes)
        hit = self._together.get(key)
        if hit is None:
            parts = self._parts(cls, p)
            src = np.concatenate([own for _, own, _ in parts])
            peers = np.concatenate([peer for _, _, peer in parts])
            alone = alone_seconds(tpl, p.bytes, self.engine.network.capacity_Bps)
            t = None if alone is None else self.cost.p2p_together(p, src, peers, alone)
            hit = tpl if t is None or t <= alone else stretch_template(tpl, t, alone)
            self._together[key] = hit
        return hit

    def _parts(self, cls: int, p) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The ``peer`` of each rank of class ``cls`` (a send's destination, a recv's
        source), split by the peers' class: ``[(peer class, own ranks, peer ranks)]``."""
        key = (cls, p.group, p.peer)
        parts = self._peers.get(key)
        if parts is None:
            fam = self.engine.workload.groups[p.group]
            row_of, pos_of = self._rank_index(p.group)
            ranks = self.engine.programs[cls].ranks
            row, pos = row_of[ranks], pos_of[ranks]
            if (row < 0).any():
                raise ConfigError(f"op {p.name!r}: rank {int(ranks[row < 0][0])} is in no group "
                                  f"of family {p.group!r}")
            peers = fam.members[row, (pos + p.peer) % fam.size]
            peer_cls = self.class_of[peers]
            parts = [(int(c), ranks[peer_cls == c], peers[peer_cls == c])
                     for c in np.unique(peer_cls)]
            self._peers[key] = parts
        return parts

    def _rank_index(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        if group not in self._index:
            fam = self.engine.workload.groups[group]
            world = self.engine.workload.world_size
            row_of = np.full(world, -1, dtype=np.int64)
            pos_of = np.full(world, -1, dtype=np.int64)
            rows, cols = np.indices(fam.members.shape)
            row_of[fam.members.ravel()] = rows.ravel()
            pos_of[fam.members.ravel()] = cols.ravel()
            self._index[group] = (row_of, pos_of)
        return self._index[group]

    # ------------------------------------------------------------------ leftovers
    def unmatched(self) -> list[tuple[str, tuple, object]]:
        """Posted sends and recvs that never met their other side: (kind, key, post)."""
        out = []
        for kind, table in (("send", self.sends), ("recv", self.recvs)):
            for key, q in table.items():
                out += [(kind, key, x) for x in q]
        return out

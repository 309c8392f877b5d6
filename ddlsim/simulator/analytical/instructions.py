"""The analytical engine's instructions: a block's ops, resolved for one rank class.

Each op becomes one :class:`Instr` with its closed-form duration from the cost model; a
point-to-point op learns its peer class and transfer time, a collective whose group spans
several rank classes learns which (its rendezvous). Resolution is cached: blocks shared by
several classes (a model's middle stages) are resolved once per distinct set of partners.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ...workloads.trace import Collective, Compute, P2P, StepTable, Workload
from ..costs import CostModel
from ..timing import HOST

__all__ = ["COMPUTE", "COLL", "SEND", "RECV", "WAIT", "Instr", "Program", "lower"]

COMPUTE, COLL, SEND, RECV, WAIT = range(5)


class Instr(NamedTuple):
    """One op of a block as the engine times it.

    Attributes
    ----------
    code : ``COMPUTE``, ``COLL``, ``SEND``, ``RECV`` or ``WAIT``.
    stream : stream id (0 is the compute stream).
    deps : indices of earlier instructions of the block it waits for.
    dur : seconds it holds its stream (a send: the transfer's seconds; recv and wait: 0).
    label : ``compute``/``optimizer`` for compute ops, else the group kind (``dp``, ``pp``…).
    flops : FLOPs (compute ops).
    nbytes : communication bytes it adds (collectives, sends).
    peer : point-to-point ops: ``(peer class, tag)``.
    group : a collective across classes: ``(group family, classes that must arrive)``.
    target : a wait: the awaited stream.
    """

    code: int
    stream: int
    deps: tuple[int, ...]
    dur: float
    label: str
    flops: float = 0.0
    nbytes: float = 0.0
    peer: tuple[int, str] | None = None
    group: tuple[str, frozenset] | None = None
    target: int = -1


def _new_instr(fields: tuple) -> Instr:
    """An :class:`Instr` from a full tuple of its fields (faster than ``_replace``)."""
    return tuple.__new__(Instr, fields)


class Program(NamedTuple):
    """One class's program: its steps (block index, micro-batch) and resolved blocks;
    ``shapes``: per block, a number shared by the blocks of every class that differ only in
    their point-to-point peers and transfer times."""

    names: tuple[str, ...]
    block: np.ndarray
    microbatch: np.ndarray
    blocks: tuple[tuple[Instr, ...], ...]
    shapes: tuple[int, ...]


def lower(workload: Workload, cost: CostModel) -> tuple[list[Program], dict[str, int],
                                                        dict[str, str]]:
    """Resolve every class's blocks.

    Returns
    -------
    programs : one :class:`Program` per class, in ``workload.classes`` order.
    streams : stream name → id, ``compute`` first, then in order of first use.
    choices : collective choice key → algorithm label, in resolution order.
    """
    lw = _Lowering(workload, cost)
    programs = []
    for ci, cls in enumerate(workload.classes):
        steps = cls.program.steps
        if isinstance(steps, StepTable):
            names, block, mb = steps.names, steps.block, steps.microbatch
        else:
            names = tuple(dict.fromkeys(s.block for s in steps))
            index = {n: i for i, n in enumerate(names)}
            block = np.fromiter((index[s.block] for s in steps), np.int64, len(steps))
            mb = np.fromiter((s.microbatch for s in steps), np.int64, len(steps))
        rep = int(cls.ranks[0])
        blocks, shapes = zip(*(lw.block(ci, rep, cls.program.blocks[n].lean) for n in names))
        programs.append(Program(names, block, mb, blocks, shapes))
    return programs, lw.streams, lw.choices


class _Lowering:
    """Caches of one resolution: group rows of representative ranks, resolved ops."""

    def __init__(self, workload: Workload, cost: CostModel):
        self.workload, self.cost = workload, cost
        self.class_of = workload.class_of()
        self.streams: dict[str, int] = {"compute": 0}
        self.choices: dict[str, str] = {}
        self._inverse: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._sets: dict[str, dict[int, frozenset]] = {}
        self._groups: dict[int, tuple[str, ...]] = {}
        self._blocks: dict[tuple, tuple] = {}
        self._ops: dict[tuple, Instr] = {}
        self._peers: dict[tuple, int] = {}
        self._parts: dict[tuple, tuple] = {}
        self._transfers: dict[tuple, float] = {}
        self._cross: dict[tuple, tuple] = {}
        self._by_kind: dict[tuple, float] = {}

    def inverse(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, its group's row in family ``group`` and its index there (0 and 0 for a
        rank outside the family), once per family."""
        hit = self._inverse.get(group)
        if hit is None:
            members = self.workload.groups[group].members
            g_of = np.zeros(self.workload.world_size, dtype=np.int64)   # (outside: 0)
            i_of = np.zeros(self.workload.world_size, dtype=np.int64)
            n_g, size = members.shape
            g_of[members.ravel()] = np.repeat(np.arange(n_g), size)
            i_of[members.ravel()] = np.tile(np.arange(size), n_g)
            hit = self._inverse[group] = (g_of, i_of)
        return hit

    def partners(self, group: str, rep: int) -> frozenset | None:
        """The classes of ``rep``'s group of family ``group`` when there are several: found
        for every class's representative at once, once per family (None for a group within
        one class, most of them: a stage's TP groups, without a set built)."""
        sets = self._sets.get(group)
        if sets is None:
            reps = [int(c.ranks[0]) for c in self.workload.classes]
            sets = self._sets[group] = self._partner_sets(group, reps)
        if rep not in sets:   # (a rank not a class's representative: never asked by lower)
            sets.update(self._partner_sets(group, [rep]))
        return sets[rep]

    def _partner_sets(self, group: str, reps: list[int]) -> dict[int, frozenset | None]:
        """Per rank of ``reps``, the classes of its group of family ``group``, or None when
        they are one."""
        rows = self.class_of[self.workload.groups[group].members[self.inverse(group)[0][reps]]]
        alone = (rows == rows[:, :1]).all(axis=1).tolist()
        return {r: None if one else frozenset(row)
                for r, one, row in zip(reps, alone, rows.tolist())}

    def block(self, ci: int, rep: int, block) -> tuple[tuple[Instr, ...], int]:
        """``block``'s instructions as class ``ci`` (representative rank ``rep``) runs it,
        and the number of its shape: resolved once per set of collective partners,
        point-to-point ops filled per class."""
        groups = self._groups.get(id(block))
        if groups is None:
            groups = self._groups[id(block)] = tuple(sorted(
                {op.payload.group for op in block.ops if isinstance(op.payload, Collective)}))
        parts = self._parts.get((groups, rep))
        if parts is None:
            parts = self._parts[(groups, rep)] = tuple(self.partners(g, rep) for g in groups)
        key = (id(block), parts)
        tmpl = self._blocks.get(key)
        if tmpl is None:
            tmpl = self._blocks[key] = self._template(block, dict(zip(groups, parts)))
        instrs, p2p = tmpl
        if not p2p:
            return instrs, id(instrs)
        out = list(instrs)
        peers, transfers = self._peers, self._transfers
        for i, (code, sid, deps, _, label, flops, nbytes), p in p2p:   # peer, seconds
            peer = peers.get((p.group, rep, p.peer))
            if peer is None:
                peer = self.peer(rep, p)
            dur = 0.0
            if code == SEND:
                dur = transfers.get((ci, p.group, p.peer, p.bytes))
                if dur is None:
                    dur = self.transfer(ci, p)
            out[i] = _new_instr((code, sid, deps, dur, label, flops, nbytes, (peer, p.tag),
                                 None, -1))
        return tuple(out), id(instrs)

    def peer(self, rep: int, p: P2P) -> int:
        """The class of rank ``rep``'s peer in point-to-point op ``p`` (cached; every rank's
        peer at that offset from :meth:`_crossing`)."""
        peer = self._peers.get((p.group, rep, p.peer))
        if peer is None:
            peer_of = self._crossing(p.group, p.peer)[0]
            peer = self._peers[(p.group, rep, p.peer)] = int(self.class_of[peer_of[rep]])
        return peer

    def transfer(self, ci: int, p: P2P) -> float:
        """Seconds of send ``p`` for class ``ci``: the slowest of its ranks' transfers
        (:meth:`CostModel.p2p_slowest`), as the discrete-event engine ends a class's send
        when the last of its ranks' flows lands (class lockstep, docs/engines.md). A ring
        over 4 nodes has one rank per node sending across (resnet50_ring's proxy): its first
        rank's intra-node hop alone would time the class 11× too fast. Once per class,
        family, peer offset and size (what the transfer depends on)."""
        key = (ci, p.group, p.peer, p.bytes)
        hit = self._transfers.get(key)
        if hit is None:
            hit = self._transfer(ci, p)
            if self.cost.copies:   # the class's transfers at once share a node's memory
                ranks = np.asarray(self.workload.classes[ci].ranks, dtype=np.int64)
                peer_of = self._crossing(p.group, p.peer)[0]
                hit = self.cost.p2p_together(p, ranks, peer_of[ranks], hit)
            self._transfers[key] = hit
        return hit

    def _transfer(self, ci: int, p: P2P) -> float:
        """:meth:`CostModel.p2p_slowest` of class ``ci``'s transfers, once per family, size
        and kinds present (it times every transfer of a kind, node-crossing or node-local,
        alike), given the first transfer of each kind (the pairs it would pick: same
        seconds)."""
        peer_of, crosses, kinds = self._crossing(p.group, p.peer)
        key = (p.group, p.bytes, kinds[ci])
        hit = self._by_kind.get(key)
        if hit is None:
            ranks = np.asarray(self.workload.classes[ci].ranks, dtype=np.int64)
            mine = crosses[ranks]
            src = ranks[sorted({int(mine.argmax()), int(mine.argmin())})]
            hit = self._by_kind[key] = self.cost.p2p_slowest(p, src, peer_of[src])
        return hit

    def _crossing(self, group: str, peer: int) -> tuple:
        """(every rank's peer at offset ``peer`` in its group of family ``group``, whether it
        is on another node, per class whether (some of its ranks' peers are, some are
        not)), once per family and offset for all classes."""
        hit = self._cross.get((group, peer))
        if hit is None:
            members = self.workload.groups[group].members
            g_of, i_of = self.inverse(group)
            peer_of = members[g_of, (i_of + peer) % members.shape[1]]
            node = self.cost.node_of_rank
            crosses = node != node[peer_of]
            inside = self.class_of >= 0
            C = len(self.workload.classes)
            cls = self.class_of[inside]
            n_cross = np.bincount(cls, weights=crosses[inside], minlength=C)
            n_all = np.bincount(cls, minlength=C)
            kinds = list(zip((n_cross > 0).tolist(), (n_cross < n_all).tolist()))
            hit = self._cross[(group, peer)] = (peer_of, crosses, kinds)
        return hit

    def _template(self, block, parts: dict) -> tuple[tuple, list[tuple]]:
        """(instructions with None for point-to-point ops; per such op, its position, its
        instruction's fields but the transfer seconds and the peer, and its payload)."""
        streams, cache = self.streams, self._ops
        out: list = []
        p2p = []
        for i, op in enumerate(block.ops):
            streams.setdefault(op.stream, len(streams))   # numbered in order of first use
            p = op.payload
            kind = type(p)
            if kind is P2P:   # filled per class (:meth:`block`)
                out.append(None)
                send = p.kind == "send"
                p2p.append((i, (SEND if send else RECV, streams[op.stream], op.deps, 0.0,
                                self.cost.kind[p.group], 0.0, p.bytes if send else 0.0), p))
                continue
            # by payload, not op: an unrolled Loop repeats its body's payloads with new deps
            key = (id(p), op.stream, op.repeat, parts[p.group] if kind is Collective else None)
            hit = cache.get(key)
            if hit is None:
                hit = cache[key] = self.op(op, key[3])
            if hit[2] != op.deps:
                hit = _new_instr((hit[0], hit[1], op.deps) + hit[3:])
            out.append(hit)
        return _share_concurrent(out, block.ops), p2p

    def op(self, op, parts: frozenset | None) -> Instr:
        """A compute op, wait, or collective (``parts``: the classes of its group, when
        several)."""
        p, k = op.payload, op.repeat
        sid = self.streams[op.stream]
        if isinstance(p, Collective):
            choice = self.cost.choice(p)
            dur = 0.0
            if choice is not None:
                self.choices.setdefault(choice.key, choice.label)
                dur = k * choice.time_s
            return Instr(COLL, sid, op.deps, dur, self.cost.kind[p.group], nbytes=k * p.bytes,
                         group=None if parts is None else (p.group, parts))
        if isinstance(p, Compute):
            label = ("optimizer" if p.kind == "optimizer" else HOST if op.stream == HOST
                     else "compute")
            return Instr(COMPUTE, sid, op.deps, k * self.cost.compute(p), label,
                         flops=k * p.flops)
        target = self.streams.setdefault(p.stream, len(self.streams))
        return Instr(WAIT, sid, op.deps, 0.0, "", target=target)


def _share_concurrent(instrs: list[Instr], ops) -> tuple[Instr, ...]:
    """Collectives of one group family issued together (same deps) on separate communication
    streams share the same links: each takes k times as long when k run at once (fair
    sharing). The analytical engine cannot see which links they really share; the DES can."""
    together: dict[tuple, list[int]] = defaultdict(list)
    for i, (ins, op) in enumerate(zip(instrs, ops)):
        if ins is not None and ins.code == COLL and ins.stream != 0:
            together[(op.payload.group, op.deps)].append(i)
    if not together:
        return tuple(instrs)
    for members in together.values():
        k = len({instrs[i].stream for i in members})  # ops on one stream run one after another
        if k > 1:
            for i in members:
                instrs[i] = instrs[i]._replace(dur=instrs[i].dur * k)
    return tuple(instrs)

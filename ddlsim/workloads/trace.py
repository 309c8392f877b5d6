"""The per-iteration workload trace: what each class of identical ranks does, in issue order.

The format is documented in ``docs/trace.md``. In short:

* A :class:`Workload` has process-group families (``tp``, ``dp``, ``pp``, ``ep``, …; each a
  2-D array of ranks, one row per group) and rank classes. All ranks of a :class:`RankClass`
  run the same :class:`Program`; group and peer references are relative (``group="tp"`` means
  *the* tp group that contains this rank, ``peer=+1`` the next member of it), so one
  description serves every rank of the class and a 10,000-GPU trace stays small.
* A :class:`Program` is a table of reusable :class:`Block` s and the :class:`Step` s that issue
  them, so repeated blocks (layers × micro-batches) are not materialised op by op.
* A block is a short list of :class:`Op` s. Each op runs on a named *stream*; ops on one stream
  run in issue order (like CUDA streams / NCCL communicators), an op also waits for its
  ``deps`` (indices of earlier ops of the same block), a :class:`Wait` waits for everything
  issued so far on another stream, a collective waits for every member of its group to reach
  it, and a ``recv`` for the matching ``send``. ``repeat=k`` runs the op k times back to back.
* The ops and their payloads are :mod:`ddlsim.workloads.payloads`' (re-exported here, as the
  steps of :mod:`ddlsim.workloads.steps` are).
* A :class:`Loop` op issues its body ``count`` times (per-layer overlap: layer l+1's
  all-gather or all-to-all on a communication stream while layer l computes); engines time
  the unrolled ops of :attr:`Block.flat`.

Sizes follow the nccl-tests convention (``bytes`` is the buffer each rank passes in: for
``all_gather`` the gathered output, for ``reduce_scatter`` the full input, for ``all_to_all``
the total each rank sends, its own share included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from .payloads import (Collective, CollectiveOp, Compute, Contention, GroupKind, Kernel, Loop,
                       Op, P2P, Payload, Wait)
from .steps import Step, StepTable

__all__ = ["Compute", "Contention", "Kernel", "Collective", "P2P", "Wait", "Loop", "Op", "Payload",
           "Block", "Step", "StepTable", "Program", "GroupFamily", "RankClass", "Workload",
           "WorkloadMeta", "CollectiveOp", "GroupKind", "Phase", "insert_op",
           "insert_before"]

Phase = Literal["forward", "backward", "optimizer", "sync", "other"]


@dataclass(frozen=True, slots=True)
class Block:
    """A reusable sequence of ops (one layer chunk's forward, a backward, the optimizer step…);
    :attr:`flat`, what the engines time, is it with its :class:`Loop` s unrolled, built once."""

    name: str
    phase: Phase
    ops: tuple[Op, ...]
    _flat: "Block | None" = field(default=None, init=False, repr=False, compare=False)
    _lean: "Block | None" = field(default=None, init=False, repr=False, compare=False)

    @property
    def lean(self) -> "Block":
        """:attr:`flat`, except that a self-contained loop is written once with its ops
        repeated (:func:`_unrolled` with ``lean``): what the analytical engine times, whose
        closed-form durations scale with the repeat."""
        if self._lean is None:
            ops = _unrolled(self.ops, lean=True)
            object.__setattr__(self, "_lean", self if ops is self.ops
                               else Block(self.name, self.phase, ops))
        return self._lean

    @property
    def flat(self) -> "Block":
        if self._flat is None:
            ops = _unrolled(self.ops)
            object.__setattr__(self, "_flat", self if ops is self.ops
                               else Block(self.name, self.phase, ops))
        return self._flat


def _self_contained(body: tuple[Op, ...]) -> bool:
    """Whether every iteration of a loop with this body runs alone: no point-to-point ops or
    nested loops, each communication stream's first op in the body waits for a compute-stream
    op of the body (or for the compute stream itself), and a compute-stream wait for the
    stream follows its last op. Each iteration then starts with every stream free and ends
    with them drained, so ``count`` iterations take ``count`` times one, op for op."""
    pending: set[str] = set()
    anchored: set[str] = set()
    for b in body:
        kind = type(b.payload)
        if kind is P2P or kind is Loop:
            return False
        if b.stream == "compute":
            if kind is Wait:
                pending.discard(b.payload.stream)
            continue
        if b.stream not in anchored:
            if not ((kind is Wait and b.payload.stream == "compute")
                    or any(body[d].stream == "compute" for d in b.deps)):
                return False
            anchored.add(b.stream)
        pending.add(b.stream)
    return not pending


def _unrolled(ops: tuple[Op, ...], lean: bool = False) -> tuple[Op, ...]:
    """``ops`` with every :class:`Loop` written out (``ops`` itself when there is none);
    ``lean``: a self-contained loop (:func:`_self_contained`) written once instead, each body
    op repeated ``count × repeat`` times."""
    if not any(type(op.payload) is Loop for op in ops):
        return ops
    out: list[Op] = []
    ends: list[tuple[int, ...]] = []  # per original op: the flat ops a dependant waits for
    for op in ops:
        deps = tuple(sorted({d for i in op.deps for d in ends[i]}))
        p = op.payload
        if type(p) is not Loop:
            out.append(op if deps == op.deps else Op(p, op.stream, deps, op.repeat))
            ends.append((len(out) - 1,))
            continue
        once = lean and _self_contained(p.body)
        body = p.body if once else _unrolled(p.body)
        k = p.count * op.repeat if once else 1
        last: tuple[int, ...] = ()
        for it in range(1 if once else p.count * op.repeat):
            base = len(out)
            out += [Op(b.payload, b.stream, tuple(base + d for d in b.deps)
                       + (deps if it == 0 else ()), b.repeat * k) for b in body]
            last = tuple(range(base, len(out)))
        ends.append(last)
    return tuple(out)


@dataclass(frozen=True)
class Program:
    """What each rank of a class issues in one iteration: ``steps`` is a tuple of
    :class:`Step` or a :class:`StepTable`."""

    blocks: Mapping[str, Block]
    steps: tuple[Step, ...] | StepTable

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", MappingProxyType(dict(self.blocks)))
        if isinstance(self.steps, StepTable):
            used = set(self.steps.names)
        else:
            used = {s.block for s in self.steps}
        missing = used - set(self.blocks)
        if missing:
            raise ValueError(f"program steps name unknown blocks: {sorted(missing)}")


@dataclass(frozen=True)
class GroupFamily:
    """A family of disjoint process groups of equal size: ``members[g]`` are group g's ranks."""

    name: str
    kind: GroupKind
    members: np.ndarray  # shape (n_groups, group_size), int

    def __post_init__(self) -> None:
        m = np.asarray(self.members, dtype=np.int64)
        if m.ndim != 2:
            raise ValueError(f"group family {self.name!r}: members must be 2-D")
        m.setflags(write=False)
        object.__setattr__(self, "members", m)

    @property
    def size(self) -> int:
        return int(self.members.shape[1])

    def group_of(self, rank: int) -> np.ndarray:
        """The ranks of the group that contains ``rank``."""
        g, _ = np.argwhere(self.members == rank)[0]
        return self.members[g]


@dataclass(frozen=True)
class RankClass:
    """Ranks that run one identical program (e.g. every rank of one pipeline stage)."""

    name: str
    ranks: tuple[int, ...]
    program: Program


@dataclass(frozen=True, slots=True)
class WorkloadMeta:
    """What a result reports about a workload and the engines do not time.

    Parameters
    ----------
    model : the model's name (a preset name or the config's ``model.name``).
    architecture : the workload family that built the trace (``"gpt"``, …).
    samples, tokens : samples and tokens of one iteration (global batch, × sequence length).
    model_flops : FLOPs of one iteration without recomputation (PaLM's MFU numerator).
    dtype : arithmetic precision, a key of the device's ``peak_flops`` (MFU's denominator).
    parameter_count : parameters of the model.
    microbatches : micro-batches per iteration and pipeline.
    """

    model: str = ""
    architecture: str = ""
    samples: int = 0
    tokens: int = 0
    model_flops: float = 0.0
    dtype: str = "bf16"
    parameter_count: int = 0
    microbatches: int = 1


@dataclass(frozen=True)
class Workload:
    """One training iteration of every rank, compactly, with its :class:`WorkloadMeta`
    (what reports need and engines don't) and ``memory``: the memory of one rank of each
    rank class that differs (e.g. per pipeline stage), as the family computes it
    (:class:`ddlsim.workloads.memory.MemoryBreakdown`; :attr:`peak_memory` is the largest)."""

    name: str
    world_size: int
    groups: Mapping[str, GroupFamily]
    classes: tuple[RankClass, ...]
    meta: WorkloadMeta = field(default_factory=WorkloadMeta)
    memory: tuple = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "memory", tuple(self.memory))
        if not isinstance(self.meta, WorkloadMeta):
            raise TypeError(f"workload {self.name!r}: meta must be a WorkloadMeta, "
                            f"not {type(self.meta).__name__}")

    @property
    def peak_memory(self):
        """The memory of the most loaded rank (largest ``total``), or None when unknown."""
        return max(self.memory, key=lambda m: m.total) if self.memory else None

    def class_of(self) -> np.ndarray:
        """Array mapping each rank to the index of its class."""
        out = np.full(self.world_size, -1, dtype=np.int64)
        for i, c in enumerate(self.classes):
            out[list(c.ranks)] = i
        return out

    def validate(self) -> None:
        """Check that every rank is in exactly one class and every group reference resolves."""
        seen = np.zeros(self.world_size, dtype=np.int64)
        for c in self.classes:
            np.add.at(seen, np.asarray(c.ranks, dtype=np.int64), 1)
            for block in c.program.blocks.values():
                _check_deps(block.ops, f"block {block.name!r}")
                for op in block.flat.ops:
                    p = op.payload
                    if isinstance(p, (Collective, P2P)) and p.group not in self.groups:
                        raise ValueError(f"class {c.name!r} block {block.name!r} op {p.name!r} "
                                         f"names unknown group {p.group!r}")
                    if isinstance(p, Collective) and p.split_bytes is not None \
                            and len(p.split_bytes) != self.groups[p.group].size:
                        raise ValueError(f"op {p.name!r} in block {block.name!r}: split_bytes has "
                                         f"{len(p.split_bytes)} entries but group {p.group!r} "
                                         f"has {self.groups[p.group].size} members")
        if not (seen == 1).all():
            bad = int(np.flatnonzero(seen != 1)[0])
            raise ValueError(f"rank {bad} is in {int(seen[bad])} rank classes; it must be in one")


def _check_deps(ops: tuple[Op, ...], where: str) -> None:
    """Every op's ``deps`` name earlier ops of its block (or of its loop body)."""
    for i, op in enumerate(ops):
        if any(not 0 <= d < i for d in op.deps):
            raise ValueError(f"op {op.payload.name!r} in {where} depends on a later op "
                             f"(deps {op.deps} at position {i})")
        if type(op.payload) is Loop:
            _check_deps(op.payload.body, f"loop {op.payload.name!r} of {where}")


def insert_op(ops: tuple[Op, ...], at: int, op: Op) -> tuple[Op, ...]:
    """``ops`` with ``op`` inserted at index ``at`` and the later ops' ``deps`` on ops at or
    after ``at`` shifted by one (a loop's body keeps its own indices)."""
    def shifted(o: Op) -> Op:
        deps = tuple(d + (d >= at) for d in o.deps)
        return o if deps == o.deps else Op(o.payload, o.stream, deps, o.repeat)

    return (*ops[:at], op, *(shifted(o) for o in ops[at:]))


def insert_before(block: Block, names: tuple[str, ...], ops: list[Op] | tuple[Op, ...]) -> Block:
    """``block`` with ``ops`` inserted, in order, before its op named by the first of
    ``names`` it has (:func:`insert_op`, dependencies shifted); ``block`` itself when it has
    none of them or ``ops`` is empty."""
    present = [getattr(op.payload, "name", None) for op in block.ops]
    at = next((present.index(n) for n in names if n in present), None)
    if not ops or at is None:
        return block
    out = block.ops
    for i, op in enumerate(ops):
        out = insert_op(out, at + i, op)
    return Block(block.name, block.phase, out)

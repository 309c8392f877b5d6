"""The steps of a :class:`~ddlsim.workloads.trace.Program`: :class:`Step` and its array form
:class:`StepTable` (re-exported by :mod:`ddlsim.workloads.trace`, where the format is documented).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["Step", "StepTable"]


class Step(NamedTuple):
    """One issue of a block, for micro-batch ``microbatch`` of model chunk ``chunk``.

    A named tuple: programs hold one per (micro-batch, chunk, pass), so they must be cheap."""

    block: str
    microbatch: int = 0
    chunk: int = 0


class StepTable(Sequence):
    """Steps stored as arrays: step ``i`` issues block ``names[block[i]]`` for micro-batch
    ``microbatch[i]`` of chunk ``chunk[i]``. Behaves as a sequence of :class:`Step`; engines
    that know it read the arrays directly, so a schedule of 100,000 steps costs a few arrays,
    not 100,000 objects.

    ``steady`` is an optional hint ``(start, stop, period, shift)``: for ``start <= i <
    stop - period``, step ``i + period`` issues the same block and chunk as step ``i`` for
    micro-batch ``microbatch[i] + shift`` (a pipeline schedule's steady state). Engines verify
    a hint before they use it.
    """

    __slots__ = ("names", "block", "microbatch", "chunk", "steady")

    def __init__(self, names: Sequence[str], block, microbatch, chunk=None,
                 steady: tuple[int, int, int, int] | None = None):
        self.names = tuple(names)
        self.block = _frozen(block)
        self.microbatch = _frozen(microbatch)
        self.chunk = _frozen(np.zeros_like(self.block) if chunk is None else chunk)
        if not (len(self.block) == len(self.microbatch) == len(self.chunk)):
            raise ValueError("StepTable: block, microbatch and chunk must have equal lengths")
        if len(self.block) and not 0 <= int(self.block.min()) <= int(self.block.max()) < len(self.names):
            raise ValueError("StepTable: block indices must index names")
        self.steady = steady

    @classmethod
    def trusted(cls, names: tuple[str, ...] | list[str], block: np.ndarray,
                microbatch: np.ndarray, chunk: np.ndarray,
                steady: tuple[int, int, int, int] | None = None) -> "StepTable":
        """A table from read-only int64 rows a generator has already checked (no copies, no
        checks: for workload generators that build many tables at once)."""
        self = object.__new__(cls)
        self.names = tuple(names)
        self.block, self.microbatch, self.chunk, self.steady = block, microbatch, chunk, steady
        return self

    def __len__(self) -> int:
        return len(self.block)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return Step(self.names[self.block[i]], int(self.microbatch[i]), int(self.chunk[i]))

    def __iter__(self):
        names = self.names
        for b, mb, c in zip(self.block.tolist(), self.microbatch.tolist(), self.chunk.tolist()):
            yield Step(names[b], mb, c)

    def __repr__(self) -> str:
        return f"StepTable({len(self)} steps over blocks {list(self.names)})"


def _frozen(a) -> np.ndarray:
    arr = np.asarray(a, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError("StepTable arrays must be 1-D")
    if arr.flags.writeable:
        arr = arr.copy() if arr.base is not None else arr
        arr.setflags(write=False)
    return arr

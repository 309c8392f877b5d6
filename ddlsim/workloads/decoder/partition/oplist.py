"""A block body under construction (:class:`OpList`), as a layer partitioner and the decoder's
builders append ops to it."""

from __future__ import annotations

from ...trace import Op, Payload

__all__ = ["OpList"]


class OpList:
    """A block body under construction: :meth:`add` returns the new op's index (for deps)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, payload: Payload, stream: str = "compute", deps: tuple[int, ...] = ()) -> int:
        self.ops.append(Op(payload, stream, tuple(sorted(set(deps)))))
        return len(self.ops) - 1

    def extend(self, ops: list[Op]) -> None:
        """Append ``ops`` (a body of their own), shifting their deps."""
        base = len(self.ops)
        self.ops += [Op(o.payload, o.stream, tuple(d + base for d in o.deps), o.repeat)
                     for o in ops]

    def last_compute(self) -> int | None:
        """Index of the latest op on the compute stream (the operands of what comes next)."""
        return next((i for i in range(len(self.ops) - 1, -1, -1)
                     if self.ops[i].stream == "compute"), None)

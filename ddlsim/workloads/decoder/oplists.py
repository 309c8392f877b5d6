"""Small helpers that splice trace ops into a block body (ZeRO-3 / FSDP passes, .zero3)."""

from __future__ import annotations

from ..trace import Op

__all__ = ["comm_stream", "placed", "extend_ops"]


def comm_stream(group: str) -> str:
    """The stream of a group's ZeRO-3 collectives: ``dp`` for ``dp_cp`` and HSDP's
    ``dp_shard`` (one NIC queue with the update's wait on ``dp``), else the group's own."""
    return "dp" if group in ("dp_cp", "dp_shard") else group


def placed(x, deps: tuple[int, ...]) -> Op:
    """A unit's op (a payload, or a self-contained op: a layer's loop) with ``deps``."""
    if isinstance(x, Op):
        return Op(x.payload, x.stream, tuple(deps) + x.deps, x.repeat)
    return Op(x, deps=deps)


def extend_ops(ops: list[Op], items: list) -> None:
    """Append ``items`` to ``ops``: payloads on the compute stream, or ops whose deps index
    ``items`` (a partitioner's body), shifted."""
    base = len(ops)
    ops.extend(Op(x.payload, x.stream, tuple(d + base for d in x.deps), x.repeat)
               if isinstance(x, Op) else Op(x) for x in items)

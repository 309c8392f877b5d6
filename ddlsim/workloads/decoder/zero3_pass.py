"""One ZeRO-3 / FSDP pass (forward or backward) over its units, as ops: the prefetch limit,
the gathers and reduce-scatters sharing the ``dp`` stream in issue order, the host's issue
under per-tensor gathers and the gradients' memory passes (the rules in :mod:`.zero3`'s
docstring; :mod:`.zero3` cuts the units, :mod:`.zero3_edges` and :mod:`.fsdp_edges` add the
edge units)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..smcontention import issued_since as _beside
from ..trace import Collective, Compute, Op, Wait
from .oplists import comm_stream as _stream, extend_ops as _extend, placed as _placed

if TYPE_CHECKING:
    from .builder import StageBuilder
    from .zero3 import _Unit

__all__ = ["zero3_pass"]


def zero3_pass(b: StageBuilder, head: list, units: list[_Unit], prefetch: int) -> list[Op]:
    """One pass (forward or backward) over ``units`` (in pass order) after the ``head`` ops:
    unit ``j``'s gathers start once unit ``j − prefetch − 1`` has ended, its reduce-scatters
    follow it, all on the ``dp`` stream in issue order. Under ``per_tensor`` (DeepSpeed
    2021) every fetch synchronises the device, so a unit also waits for the reduce-scatters
    before it, and the gradients' passes run on the compute stream; otherwise on ``dp``.

    Parameters
    ----------
    b : StageBuilder
        The stage's builder (stack, data types, data-parallel size).
    head : list
        Ops run before the first unit (the embedding's forward, the head's backward).
    units : list of _Unit
        The pass's units in pass order (:func:`.zero3._units`).
    prefetch : int
        Units gathered ahead of the unit computing (:func:`.zero3.zero3_prefetch`).

    Returns
    -------
    list of Op
        The pass's ops; dependencies index this list.
    """
    ops: list[Op] = [Op(Wait("zero3.start", "compute"))]
    pending: dict[int, tuple[int, ...]] = {}
    synced = b.sw.zero3_gather == "per_tensor"
    issued: tuple[int, ...] = ()   # the host's issue of the gathers the next unit waits for

    def host(name: str, seconds: float, deps: tuple[int, ...]) -> tuple[int, ...]:
        if not seconds:
            return deps
        ops.append(Op(Compute(name, 0.0, kind="elementwise", dtype=b.dtype, seconds=seconds),
                      "host", deps=deps))
        return (len(ops) - 1,)

    def gather(j: int, deps: tuple[int, ...]) -> tuple[int, ...]:
        idx = []
        if units[j].fill:   # the zero-filled buffers, waited for before the issue
            ops.append(Op(Compute("zero3.zero_fill", 0.0, units[j].fill, kind="elementwise",
                                  dtype=b.dtype), "host", deps=deps))
            deps = (len(ops) - 1,)
        deps = host("zero3.host_gather", units[j].host_gather, deps)
        if units[j].pre_gather is not None:     # the casts before a float8 all-gather
            ops.extend(units[j].pre_gather(deps))
            deps = (len(ops) - 1,)
        for group, n in units[j].gathers:
            ops.append(Op(Collective(f"param.all_gather{units[j].label}", "all_gather",
                                     group, n),
                          _stream(group), deps=deps))
            idx.append(len(ops) - 1)
        if units[j].gather_passes:
            ops.append(Op(Compute("zero3.fetch_passes", 0.0, units[j].gather_passes,
                                  kind="elementwise", dtype=b.dtype), "dp", deps=deps))
            idx.append(len(ops) - 1)
        pending[j] = tuple(idx)
        # the copy-out launches follow the NCCL launch, beside the all-gather on the device
        deps = host("zero3.host_copy_out", units[j].host_copy_out, deps)
        return deps if units[j].host_gather or units[j].fill else ()

    cap = b.sw.zero3_max_live_parameters if b.sw.zero3_gather != "per_layer" else 0

    def blocked(t: int) -> bool:
        """Whether the prefetch of unit ``t`` is refused: the unit whose pre-hook would
        issue it holds ``cap`` or more gathered elements (then ``t`` is gathered on demand,
        from its own pre-hook)."""
        return bool(cap and prefetch) and t >= prefetch and units[t - prefetch].live >= cap

    deferred: set[int] = set()
    for j in range(min(prefetch + 1, len(units))):
        if j and blocked(j):
            deferred.add(j)
        else:
            issued = gather(j, (0,)) or issued
    _extend(ops, head)
    before: tuple[int, ...] = ()
    seen = 0    # the collectives issued before ops[seen] ran beside earlier compute
    for j, unit in enumerate(units):
        own = pending.pop(j)
        waits = own + before + issued
        if unit.copy_out and unit.gathers:
            ops.append(Op(Compute("zero3.copy_out", 0.0, unit.copy_out, kind="elementwise",
                                  dtype=b.dtype), deps=waits))
            waits = (len(ops) - 1,)
        beside_colls = _beside(ops, seen, own)
        ops += _unit_ops(unit.ops, len(ops), waits)
        if b.sw.zero3_gather == "per_layer":   # not yet under DeepSpeed's module hooks
            ops += _sm_contention(f"zero3.unit{j}", beside_colls, unit.ops, b.dtype)
        seen = len(ops)
        last = dep = len(ops) - 1
        if unit.reduce_passes:
            ops.append(Op(Compute("zero3.reduce_passes", 0.0, unit.reduce_passes,
                                  kind="elementwise", dtype=b.dtype),
                          "compute" if synced else "dp", deps=(last,)))
            dep = len(ops) - 1
            last = dep if synced else last
        # the host issues the reduce-scatters from the gradient hooks while the unit computes
        # (once it has launched it: after its gathers and the reduce-scatters before it)
        rs_deps = (dep,)
        if unit.host_reduce:
            rs_deps += host("zero3.host_reduce", unit.host_reduce, waits + before)
        rs = []
        for group, n in unit.reduces:
            ops.append(Op(Collective(f"grad.reduce_scatter{unit.label}", "reduce_scatter",
                                     group, n),
                          _stream(group), deps=rs_deps))
            rs.append(len(ops) - 1)
        if unit.replica_reduces:
            from .hsdp import replica_ops
            ops += replica_ops([n for _, n in unit.replica_reduces], tuple(rs))
        before = tuple(rs) if synced else ()
        issued, after = (), (last,) + before
        if j + 1 in deferred:   # gathered on demand from the next unit's pre-hook
            deferred.discard(j + 1)
            issued = gather(j + 1, after)
            after += pending[j + 1]   # then its prefetch, once that gather has ended
        if j + prefetch + 1 < len(units):
            # under per_tensor the fetch synchronises the device first: the host issues the
            # next gather once the unit and its reduce-scatters have ended
            if blocked(j + prefetch + 1):
                deferred.add(j + prefetch + 1)
            else:
                issued = gather(j + prefetch + 1, after) + issued
    return ops


def _unit_ops(items: list, base: int, waits: tuple[int, ...]) -> list[Op]:
    """A unit's ops placed from index ``base``, the first after ``waits``: payloads, or ops
    whose deps index ``items`` (a partitioner's head, :func:`.oplists.extend_ops`), shifted;
    a layer's ops carry none."""
    return [_placed(x if not isinstance(x, Op) or not x.deps else
                    Op(x.payload, x.stream, tuple(d + base for d in x.deps), x.repeat),
                    waits if i == 0 else ()) for i, x in enumerate(items)]


def _sm_contention(name: str, colls: list, unit_ops: list, dtype: str) -> list[Op]:
    """The contention op of a unit's GEMMs beside the collectives ``colls``
    (:mod:`ddlsim.workloads.smcontention`), in a list (empty when nothing overlaps)."""
    from ..smcontention import beside
    extra = beside(name, unit_ops, colls, dtype)
    return [extra] if extra is not None else []

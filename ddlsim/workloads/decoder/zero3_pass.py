"""One ZeRO-3 / FSDP pass (forward or backward) over its units, as ops: the prefetch limit,
the gathers and reduce-scatters sharing the ``dp`` stream in issue order, the host's issue
under per-tensor gathers, FSDP2's hooks on the host (:func:`.fsdp2_host.hook_seconds`;
on a GPU the host runs ahead of the device, an eager block's own ops on it too,
:mod:`.eager_host`) and the gradients' memory passes (the rules in :mod:`.zero3`'s
docstring; FSDP1's on its post-backward stream, :mod:`.fsdp1_passes`; :mod:`.zero3` cuts
the units, :mod:`.zero3_edges` and :mod:`.fsdp_edges` add the edge units)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..smcontention import issued_since as _beside
from ..trace import Collective, Compute, Kernel, Op, Wait
from .oplists import comm_stream as _stream, extend_ops as _extend, placed as _placed

if TYPE_CHECKING:
    from .builder import StageBuilder
    from .zero3 import _Unit

__all__ = ["zero3_pass", "COPY_IN_STREAM"]

#: FSDP2's all-gather copy-in stream, beside the compute and the collectives (``FSDPCommContext
#: .all_gather_copy_in_stream``: pytorch ``torch/distributed/fsdp/_fully_shard/
#: _fsdp_param_group.py``, used by the forward's and the backward's unshards alike)
COPY_IN_STREAM = "fsdp_copy_in"


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
    p = _Pass(b, units, prefetch)
    issued: tuple[int, ...] = ()   # the host's issue of the gathers the next unit waits for
    for j in range(min(prefetch + 1, len(units))):
        if j and p.blocked(j):
            p.deferred.add(j)
        else:
            issued = p.gather(j, (0,)) or issued
    _extend(p.ops, head)
    before: tuple[int, ...] = ()
    seen = 0    # the collectives issued before ops[seen] ran beside earlier compute
    for j in range(len(units)):
        own = p.pending.pop(j)
        waits = p.compute(j, own, own + before + issued, seen)
        seen = len(p.ops)
        last, rs, device = p.reduce(j, waits + before)
        before = rs if p.synced else ()
        issued = p.next_gathers(j, (last,) + before, device)
    if p.posted:   # FSDP1's final callback: the compute stream waits for its passes
        p.ops.append(Op(Wait("fsdp1.post_backward", p.pass_stream)))
    return p.ops


class _Pass:
    """The ops of one pass as :func:`zero3_pass` writes them, with the gathers issued and not
    yet waited for (``pending``: unit → op indices) and the units whose prefetch was refused
    (``deferred``: gathered on demand from their own pre-hook)."""

    def __init__(self, b: StageBuilder, units: list[_Unit], prefetch: int):
        self.b, self.units, self.prefetch = b, units, prefetch
        self.ops: list[Op] = [Op(Wait("zero3.start", "compute"))]
        self.pending: dict[int, tuple[int, ...]] = {}
        self.deferred: set[int] = set()
        self.synced = b.sw.zero3_gather == "per_tensor"
        #: the stream of the gradients' memory passes around the reduce-scatters: FSDP1's
        #: post-backward stream (:data:`.fsdp1_passes.POST_BACKWARD_STREAM`), else ``dp``
        from .fsdp1_passes import POST_BACKWARD_STREAM
        self.pass_stream = (POST_BACKWARD_STREAM if b.sw.zero3_implementation == "torch_fsdp"
                            else "dp")
        #: whether a pass was laid on :attr:`pass_stream` apart from ``dp``
        self.posted = False
        #: elements a unit may hold gathered before its pre-hook refuses a prefetch (0: none)
        self.cap = b.sw.zero3_max_live_parameters if b.sw.zero3_gather != "per_layer" else 0
        #: FSDP2's hooks run Python on the host per unit (:func:`.fsdp2_host.hook_seconds`)
        self.hooked = (b.sw.zero3_implementation == "torch_fsdp2"
                       and b.sw.zero3_gather == "per_layer"
                       and b.sw.host_dispatch != "cuda_graphs")
        from .fsdp2_host import host_is_device
        #: the host runs ahead of the device (a GPU's): a post-hook follows the host's issue
        #: of its unit (the unit's pre-hook), not the unit's end on the device; on a CPU
        #: device the two are one processor and the post-hook waits for the unit
        self.ahead = self.hooked and not host_is_device(b.plan.device.launch)
        #: unit → its pre-hook's op (under :attr:`ahead`)
        self.pre_hooks: dict[int, int] = {}
        #: seconds of a tiny op of the block's eager host work on the host stream (0: none)
        from .eager_host import unit_s
        self.op_host = unit_s(b.plan.device.launch, b.sw.host_dispatch,
                              b.sw.zero3_implementation) if self.ahead else 0.0

    def hook(self, u: _Unit, post: bool) -> float:
        """Host seconds of FSDP2's pre-hook (``post`` false: ``pre_forward``,
        ``pre_backward``) or post-hook (``post_forward``, ``post_backward``) on unit ``u`` in
        this pass (:func:`.fsdp2_host.hook_seconds`); 0 under another ZeRO-3."""
        if not self.hooked:
            return 0.0
        from .fsdp2_host import edge_tensors, hook_seconds, layer_tensors
        b = self.b
        tensors = (edge_tensors(b.shape, u.label) if u.label
                   else layer_tensors(b.shape, bool(b.sw.separate_projections)))
        sharded = bool(u.gathers or u.reduces)    # else FSDP2's one-rank branch
        return hook_seconds(b.plan.device.launch, 2 if sharded else 1, self.backward(u),
                            tensors, post)

    @staticmethod
    def backward(u: _Unit) -> bool:
        """Whether ``u`` is a backward pass's unit (it reduces its gradients)."""
        return bool(u.reduces or u.chunk_cat or u.after_reduce)

    def host(self, name: str, seconds: float, deps: tuple[int, ...]) -> tuple[int, ...]:
        """``seconds`` of the host's issue after ``deps``, on the ``host`` stream: the op's
        index, or ``deps`` when it takes no time."""
        if not seconds:
            return deps
        self.ops.append(Op(Compute(name, 0.0, kind="elementwise", dtype=self.b.dtype,
                                   seconds=seconds), "host", deps=deps))
        return (len(self.ops) - 1,)

    def _elementwise(self, name: str, nbytes: float, stream: str,
                     deps: tuple[int, ...], variant: str = "") -> int:
        """A memory pass of ``nbytes`` bytes on ``stream`` after ``deps``: its index; with a
        ``variant``, one kernel of that class (``device.elementwise_efficiency``: the
        streaming bandwidth where the device has no figure for it)."""
        dtype = self.b.dtype
        kernels = (Kernel("memory", bytes=nbytes, dtype=dtype, variant=variant),) \
            if variant else None
        self.ops.append(Op(Compute(name, 0.0, nbytes, kind="elementwise", dtype=dtype,
                                   kernels=kernels), stream, deps=deps))
        return len(self.ops) - 1

    def gather(self, j: int, deps: tuple[int, ...],
               device: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Issue unit ``j``'s gathers after ``deps`` (kept in ``pending``), on the device also
        after ``device`` (what the host does not wait for, :attr:`ahead`); returns the host's
        issue the next unit waits for (empty when the host does not wait)."""
        u, ops, idx = self.units[j], self.ops, []
        if u.fill:   # the zero-filled buffers, waited for before the issue
            deps = (self._elementwise("zero3.zero_fill", u.fill, "host", deps),)
        # FSDP2's pre-hook on the host: the unit's compute waits for it, the gathers follow
        hooked = self.host("fsdp2.pre_hook", self.hook(u, False), deps)
        idx += [i for i in hooked if i not in deps]
        if self.ahead and hooked != deps:
            self.pre_hooks[j] = hooked[0]
        deps = self.host("zero3.host_gather", u.host_gather, hooked)
        host = deps
        deps += tuple(d for d in device if d not in deps)
        if u.pre_gather is not None:     # the casts before a float8 all-gather
            ops.extend(u.pre_gather(deps))
            deps = (len(ops) - 1,)
        if u.copy_in and u.gathers:      # FSDP2's cast and copy-in of the shard, on its
            from .fsdp2_passes import COPY_IN
            deps = (self._elementwise("zero3.copy_in", u.copy_in, COPY_IN_STREAM, deps,
                                      COPY_IN),)
        for group, n in u.gathers:
            ops.append(Op(Collective(f"param.all_gather{u.label}", "all_gather", group, n),
                          _stream(group), deps=deps))
            idx.append(len(ops) - 1)
        if u.gather_passes:
            idx.append(self._elementwise("zero3.fetch_passes", u.gather_passes, "dp", deps))
        self.pending[j] = tuple(idx)
        # the copy-out launches follow the NCCL launch, beside the all-gather on the device
        deps = self.host("zero3.host_copy_out", u.host_copy_out, host if self.ahead else deps)
        return deps if u.host_gather or u.fill else ()

    def _issued(self, items: list, waits: tuple[int, ...]) -> None:
        """Append a unit's ops with the host's work before each layer op
        (:func:`.eager_host.issued_by_host`), its first device op after ``waits``."""
        from .eager_host import issued_by_host
        laid, _ = issued_by_host(items, self.op_host)
        base, first = len(self.ops), True
        for op in laid:
            deps = tuple(d + base for d in op.deps)
            if first and op.stream != "host":
                deps, first = tuple(waits) + deps, False
            self.ops.append(Op(op.payload, op.stream, deps, op.repeat))

    def blocked(self, t: int) -> bool:
        """Whether the prefetch of unit ``t`` is refused: the unit whose pre-hook would
        issue it holds ``cap`` or more gathered elements (then ``t`` is gathered on demand,
        from its own pre-hook)."""
        k = self.prefetch
        return bool(self.cap and k) and t >= k and self.units[t - k].live >= self.cap

    def compute(self, j: int, own: tuple[int, ...], waits: tuple[int, ...],
                seen: int) -> tuple[int, ...]:
        """Unit ``j``'s compute after ``waits`` (FSDP2's copy-out first), and under per-layer
        gathers its GEMMs' contention with the collectives issued since ``ops[seen]``;
        returns what its first op waited for."""
        unit, ops = self.units[j], self.ops
        if unit.cast:         # FSDP2 at one rank: the cast, then the copy, no gather
            waits = (self._elementwise("zero3.cast", unit.cast, "compute", waits),)
        if unit.copy_out:     # after its gathers, or in their place at one rank
            from .fsdp2_passes import COPY_OUT
            waits = (self._elementwise("zero3.copy_out", unit.copy_out, "compute", waits,
                                       COPY_OUT),)
        beside_colls = _beside(ops, seen, own)
        if self.op_host:      # the block's eager ops on the host (.eager_host)
            self._issued(unit.ops, waits)
        else:
            ops += _unit_ops(unit.ops, len(ops), waits)
        if self.b.sw.zero3_gather == "per_layer":   # not yet under DeepSpeed's module hooks
            ops += _sm_contention(f"zero3.unit{j}", beside_colls, unit.ops, self.b.dtype)
        return waits

    def reduce(self, j: int, host_deps: tuple[int, ...]
               ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """Unit ``j``'s gradient passes and reduce-scatters after its compute (the host's
        issue after ``host_deps``); returns (the op the next gathers follow, the
        reduce-scatters, what the next gathers follow on the device only)."""
        ops, unit = self.ops, self.units[j]
        if self.ahead:
            return self._reduce_ahead(j)
        if unit.chunk_cat:    # FSDP2's, next on the compute stream after the backward
            from .fsdp2_passes import chunk_cat_op
            ops.append(Op(chunk_cat_op(unit.chunk_cat, self.b.dtype), "compute"))
        # FSDP2's post-hook on the host once the unit has run (post_backward issues the
        # reduce-scatters): the next unit's gathers follow it
        last = dep = self.host("fsdp2.post_hook", self.hook(unit, True), (len(ops) - 1,))[0]
        if unit.reduce_passes:
            dep = self._elementwise("zero3.reduce_passes", unit.reduce_passes,
                                    "compute" if self.synced else self._passes(), (last,))
            last = dep if self.synced else last
        # the host issues the reduce-scatters from the gradient hooks while the unit computes
        # (once it has launched it: after its gathers and the reduce-scatters before it);
        # DeepSpeed 2021's oversized gradients once the unit has ended (its release)
        rs_deps = (dep,)
        hosted = self.host("zero3.host_reduce", unit.host_reduce, host_deps) \
            if unit.host_reduce else ()
        if unit.host_reduce_after:
            hosted = self.host("zero3.host_reduce_after", unit.host_reduce_after,
                               (dep,) + hosted)
        rs_deps += hosted
        return last, self._reduce_scatters(unit, rs_deps, dep), ()

    def _reduce_scatters(self, unit, deps: tuple[int, ...], dep: int) -> tuple[int, ...]:
        """``unit``'s reduce-scatters after ``deps`` (HSDP's replica all-reduces after them),
        then FSDP2's copy, cast and add on the reduce-scatter stream (after ``dep`` where
        there is no reduce-scatter); returns the reduce-scatters."""
        ops, rs = self.ops, []
        for group, n in unit.reduces:
            ops.append(Op(Collective(f"grad.reduce_scatter{unit.label}", "reduce_scatter",
                                     group, n), _stream(group), deps=deps))
            rs.append(len(ops) - 1)
        if unit.replica_reduces:
            from .hsdp import replica_ops
            ops += replica_ops([n for _, n in unit.replica_reduces], tuple(rs))
        if unit.after_reduce:
            self._elementwise("zero3.after_reduce", unit.after_reduce, self._passes(),
                              tuple(rs) or (dep,))
        return tuple(rs)

    def _passes(self) -> str:
        """The stream of a gradients' memory pass (:attr:`pass_stream`), noting its use."""
        self.posted = self.posted or self.pass_stream != "dp"
        return self.pass_stream

    def _reduce_ahead(self, j: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """:meth:`reduce` where the host runs ahead (FSDP2 on a GPU): the post-hook once the
        host has issued the unit (after its pre-hook), with ``_chunk_cat``'s host work
        (:func:`.fsdp2_host.chunk_cat_host_seconds`) in it, since ``post_backward``
        launches the ``chunk_cat`` and issues the reduce-scatters; the ``chunk_cat`` after
        the unit on the compute stream and after the post-hook; the next gathers after the
        post-hook on the host and after the unit on the device."""
        from .fsdp2_host import chunk_cat_host_seconds
        from .fsdp2_passes import chunk_cat_op
        ops, unit, b = self.ops, self.units[j], self.b
        end = len(ops) - 1                      # the unit's last op on the device
        cat = unit.chunk_cat * b.gdt / (b.dt + b.gdt)    # its output: the reduce dtype's
        pre = (self.pre_hooks[j],) if j in self.pre_hooks else ()
        post = self.host("fsdp2.post_hook", self.hook(unit, True)
                         + chunk_cat_host_seconds(b.plan.device.launch, cat), pre)
        if unit.chunk_cat:
            ops.append(Op(chunk_cat_op(unit.chunk_cat, b.dtype), "compute",
                          deps=post if post != pre else ()))
            end = len(ops) - 1
        dep = end
        if unit.reduce_passes:
            dep = self._elementwise("zero3.reduce_passes", unit.reduce_passes, "dp", (end,))
        rs = self._reduce_scatters(unit, (dep,), dep)
        host = post[0] if post != pre else (pre[0] if pre else end)
        return host, rs, (end,)

    def next_gathers(self, j: int, after: tuple[int, ...],
                     device: tuple[int, ...] = ()) -> tuple[int, ...]:
        """The gathers issued once unit ``j`` has ended (``after``; on the device also after
        ``device``): the next unit's if its prefetch was refused, then the prefetch
        ``prefetch + 1`` units ahead; returns the host's issue the next unit waits for."""
        issued: tuple[int, ...] = ()
        if j + 1 in self.deferred:   # gathered on demand from the next unit's pre-hook
            self.deferred.discard(j + 1)
            issued = self.gather(j + 1, after, device)
            after += self.pending[j + 1]   # then its prefetch, once that gather has ended
        t = j + self.prefetch + 1
        if t < len(self.units):
            # under per_tensor the fetch synchronises the device first: the host issues the
            # next gather once the unit and its reduce-scatters have ended
            if self.blocked(t):
                self.deferred.add(t)
            else:
                issued = self.gather(t, after, device) + issued
        return issued


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

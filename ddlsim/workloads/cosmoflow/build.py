"""The CosmoFlow trace: spatially split convolutions with halo exchanges, model-parallel dense
layers, and the gradient all-reduces issued non-blocking as layers finish.

One iteration, per micro-batch (cosmoflow.cpp:50-124 for the proxy's order):

* forward: per conv layer the halo isends/irecvs to the grid neighbours, then the conv (after
  the receives: MPI_Waitall), then LeakyReLU and MaxPool; per dense layer a blocking
  all-gather of its input over the spatial group ``sp``, then the layer's share of outputs;
* backward: per dense layer (last first) its gradients, then a blocking reduce-scatter of its
  input gradient over ``sp``; the dense gradients' all-reduce over ``dp`` (non-blocking, stream
  ``grad.dense``); per conv layer (last first) the halo of its output gradient (not for the
  first conv, which needs no input gradient), its gradients, and its weight gradients'
  all-reduce over ``world`` (non-blocking, stream ``grad.conv``; or over ``sp`` then ``dp`` with
  ``conv_grad_allreduce: spatial_then_data``); both streams joined at the end
  (MPI_Waitall, cosmoflow.cpp:122). Gradients are reduced in the last micro-batch only.
  Under a collective library without asynchronous progress (Open MPI, MPICH:
  :func:`ddlsim.config_system.progress_stall`) the non-blocking all-reduces move only inside
  MPI calls, so they are laid after the backward, where the final MPI_Waitall runs them.
* the optimizer step.

Per-rank sizes (dtype bytes ``B``, micro-batch ``b``, spatial group of ``S`` ranks): halo faces
from :func:`~.grid.halo_ops`; all-gather of dense layer j: ``b·n_in·B`` (gathered output,
``b·n_in/S`` elements sent); its reduce-scatter: ``b·n_in·B`` (full input); dense gradients
``Σ params / S · B``; conv layer i's gradients ``params_i · B``. Collectives on groups of one
rank are left out (they move no data).
"""

from __future__ import annotations

import math

from ...config import DTYPE_BYTES
from ...config_system import progress_stall
from ..memory import MemoryBreakdown, model_state_bytes
from ..proxytime import usleep_s
from ..trace import (Block, Collective, Compute, Op, Program, RankClass, Step, Wait, Workload,
                     WorkloadMeta)
from .grid import Position, grid_families, halo_ops, positions
from .shapes import conv_layers, dense_layers, halo_widths, local_side

__all__ = ["build_cosmoflow", "cosmoflow_memory", "layer_costs"]

#: Element-wise optimizer update per parameter: (FLOPs, fp32 words read + written).
#: SGD with momentum (MLPerf HPC CosmoFlow, configs/cosmo.yaml): w, g, m read; w, m written.
#: Adam: w, g, m, v read; w, m, v written.
_OPTIMIZER = {"sgd": (4.0, 5), "adam": (10.0, 7)}


class _Ops:
    """A block's op list under construction; :meth:`add` returns the new op's index."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, payload, stream: str = "compute", deps: tuple[int, ...] = ()) -> int:
        self.ops.append(Op(payload, stream, tuple(deps)))
        return len(self.ops) - 1

    def extend(self, ops: list[Op]) -> tuple[int, ...]:
        start = len(self.ops)
        self.ops += ops
        return tuple(range(start, len(self.ops)))


class _Builder:
    """The blocks of one rank class (one grid position)."""

    def __init__(self, cfg, pos: Position):
        m, t = cfg.model, cfg.train
        self.m, self.pos, self.dtype = m, pos, t.dtype
        self.b, self.B = t.micro_batch_size, DTYPE_BYTES[t.dtype]
        self.grid, self.S = m.spatial_grid, math.prod(m.spatial_grid)
        self.convs, self.denses = conv_layers(m), dense_layers(m)
        self.dp, self.world = cfg.dp, cfg.dp * self.S
        # the dense all-reduce is called on one replica too when its buffers are separate
        # (MPI then copies: ddlsim.workloads.onerankcopy)
        self.dense_sync = self.dp > 1 or cfg.parallel.collective_buffers == "separate"
        self.timings = m.proxy_timings if m.compute == "proxy" else None
        self.optimizer = t.optimizer
        # a library without asynchronous progress moves the non-blocking all-reduces only
        # inside MPI calls: laid after the backward, where MPI_Waitall runs them
        # (ddlsim.config_system.progress_stall)
        self.stalled = progress_stall(cfg.system.collectives) is not None

    # ------------------------------------------------------------------ compute
    def _compute(self, name: str, key: str, flops: float, nbytes: float,
                 share: float = 1.0, wakes: bool = True) -> Compute:
        """One layer's compute op (``share`` of it); with ``compute: proxy`` the share of
        its usleep, plus the sleep's timer slack on the part that ends it (``wakes``)."""
        sec = None if self.timings is None else share * self.timings[key]
        sec = usleep_s(sec) if wakes else sec
        return Compute(name, share * flops, share * nbytes, "gemm", self.dtype, sec)

    def _layer(self, ops: _Ops, name: str, key: str, flops: float, nbytes: float,
               front: tuple[int, ...], halo: tuple[int, ...], interior: float) -> int:
        """The layer's compute after ``front`` and its halo; with ``halo_overlap`` its
        halo-free part (share ``interior``) first, without waiting for the halo. Returns the
        index of the last op."""
        if halo and self.m.halo_overlap and interior > 0:
            ops.add(self._compute(f"{name}.interior", key, flops, nbytes, interior, False),
                    deps=front)
            return ops.add(self._compute(f"{name}.boundary", key, flops, nbytes, 1 - interior),
                           deps=halo)
        return ops.add(self._compute(name, key, flops, nbytes), deps=front + halo)

    def _elementwise(self, ops: _Ops, name: str, conv, front: tuple[int, ...]) -> int:
        """LeakyReLU and MaxPool (model mode): one pass over the conv output each, the pool
        writing 1/pool³ of it."""
        n = self.b * math.prod(local_side(conv.side, self.grid)) * conv.c_out
        return ops.add(Compute(name, 2.0 * n, self.B * n * (3 + conv.pool ** -3), "elementwise",
                               self.dtype), deps=front)

    def _halo(self, ops: _Ops, name: str, local, channels: int, backward: bool,
              after: tuple[int, ...]) -> tuple[int, ...]:
        return ops.extend(halo_ops(self.pos, name, local, channels, self.b, self.m.kernel_size,
                                   self.B, backward, after))

    # ------------------------------------------------------------------ blocks
    def forward(self) -> Block:
        ops, m = _Ops(), self.m
        front: tuple[int, ...] = ()
        widths = halo_widths(m.kernel_size)
        for c in self.convs:
            local = local_side(c.side, self.grid)
            halo: tuple[int, ...] = ()
            if c.index > 0 or m.input_halo == "exchange":
                src = self.convs[c.index - 1] if c.index and m.forward_halo == "previous_output" \
                    else c
                tensor = local_side(src.side, self.grid)
                channels = src.c_out if src is not c else c.c_in
                halo = self._halo(ops, f"fwd.{c.name}.halo", tensor, channels, False, front)
            flops = self.b * math.prod(local) * c.flops_per_voxel()
            nbytes = self.B * (self.b * math.prod(local) * (c.c_in + c.c_out) + c.params)
            front = (self._layer(ops, f"fwd.{c.name}", f"forward.{c.name}", flops, nbytes, front,
                                 halo, self.pos.interior_fraction(local, widths)),)
            if self.timings is None:
                front = (self._elementwise(ops, f"fwd.{c.name}.act_pool", c, front),)
        for d in self.denses:
            if self.S > 1:
                front = (ops.add(Collective(f"fwd.{d.name}.allgather", "all_gather", "sp",
                                            self.b * d.n_in * self.B), deps=front),)
            front = (ops.add(self._compute(f"fwd.{d.name}", f"forward.{d.name}",
                                           *self._dense(d)), deps=front),)
        return Block("F", "forward", tuple(ops.ops))

    def _dense(self, d, factor: float = 1.0) -> tuple[float, float]:
        """FLOPs and bytes of this rank's n_out/S outputs of dense layer ``d``."""
        flops = 2.0 * self.b * d.n_in * d.n_out / self.S
        nbytes = self.B * (self.b * d.n_in + d.params / self.S + self.b * d.n_out / self.S)
        return factor * flops, factor * nbytes

    def backward(self, sync: bool) -> Block:
        ops, m = _Ops(), self.m
        front: tuple[int, ...] = ()   # what the next op waits for (blocking MPI calls)
        pending: list[tuple] = []     # non-blocking collectives kept for the end (stalled)
        for d in reversed(self.denses):
            front = (ops.add(self._compute(f"bwd.{d.name}", f"backward.{d.name}",
                                           *self._dense(d, 2.0)), deps=front),)
            if self.S > 1:
                front = (ops.add(Collective(f"bwd.{d.name}.reduce_scatter", "reduce_scatter",
                                            "sp", self.b * d.n_in * self.B), deps=front),)
        if sync and self.dense_sync:
            dense = sum(d.params for d in self.denses) / self.S * self.B
            self._nonblocking(ops, pending, Collective("grad.dense.iallreduce", "all_reduce", "dp",
                                              dense), "grad.dense", front)
        widths = halo_widths(m.kernel_size)[::-1]
        for c in reversed(self.convs):
            local = local_side(c.side, self.grid)
            if self.timings is None:
                front = (self._elementwise(ops, f"bwd.{c.name}.act_pool", c, front),)
            flops = self.b * math.prod(local) * c.flops_per_voxel() * (2 if c.index else 1)
            nbytes = self.B * (self.b * math.prod(local) * (c.c_in + c.c_out) + c.params) * 2
            name, key = f"bwd.{c.name}", f"backward.{c.name}"
            if c.index == 0:
                front = (ops.add(self._compute(name, key, flops, nbytes), deps=front),)
            elif m.backward_halo == "before_compute":
                halo = self._halo(ops, f"bwd.{c.name}.halo", local, c.c_out, True, front)
                # only the data gradient (half the FLOPs) needs the output gradient's halo
                free = 0.5 + 0.5 * self.pos.interior_fraction(local, widths)
                front = (self._layer(ops, name, key, flops, nbytes, front, halo, free),)
            else:
                done = ops.add(self._compute(name, key, flops, nbytes), deps=front)
                front = self._halo(ops, f"bwd.{c.name}.halo", local, c.c_out, True,
                                   (done,)) or (done,)
            if sync:
                self._conv_grads(ops, pending, c, front)
        if sync:
            for coll, stream in pending:   # stalled: each after the backward, in order
                ops.add(coll, stream=stream, deps=front)
            ops.add(Wait("waitall.grad.dense", "grad.dense"), deps=front)
            ops.add(Wait("waitall.grad.conv", "grad.conv"))
        return Block("B_sync" if sync else "B", "backward", tuple(ops.ops))

    def _nonblocking(self, ops: _Ops, pending: list, coll: Collective, stream: str,
                     front: tuple[int, ...]) -> tuple[int, ...]:
        """Issue the non-blocking ``coll`` on ``stream`` after ``front``; where the library
        has no asynchronous progress, keep it for the backward's end (:meth:`backward`).
        Returns what a collective chained after it waits for."""
        if self.stalled:
            pending.append((coll, stream))
            return front
        return (ops.add(coll, stream=stream, deps=front),)

    def _conv_grads(self, ops: _Ops, pending: list, conv, front: tuple[int, ...]) -> None:
        """The conv layer's weight-gradient all-reduce, non-blocking: each rank holds the
        partial sum over its sub-volume, so the sum runs over the spatial group and the
        replicas, at once (``world``) or in two steps."""
        nbytes = conv.params * self.B
        groups = [("world", self.world)] if self.m.conv_grad_allreduce == "world" \
            else [("sp", self.S), ("dp", self.dp)]
        for group, size in groups:
            if size > 1:
                front = self._nonblocking(ops, pending, Collective(
                    f"grad.{conv.name}.iallreduce.{group}", "all_reduce", group, nbytes),
                    "grad.conv", front)

    def update(self) -> Block:
        params = self.local_params()
        if self.timings is not None:
            op = Compute("optimizer", 0.0, 0.0, "optimizer", "fp32", self.timings["optimizer"])
        else:
            flops, words = _OPTIMIZER[self.optimizer]
            op = Compute("optimizer", flops * params, 4.0 * words * params, "optimizer", "fp32")
        return Block("update", "optimizer", (Op(op),))

    def local_params(self) -> float:
        return sum(c.params for c in self.convs) + sum(d.params for d in self.denses) / self.S


def build_cosmoflow(cfg) -> Workload:
    """The trace of one training iteration of a ``cosmoflow`` run config.

    Parameters
    ----------
    cfg : RunConfig
        With a :class:`~.schema.CosmoFlowModel` model section (checked by the family).

    Returns
    -------
    Workload
        One rank class per grid coordinate; group families ``sp``, ``sx``/``sy``/``sz``,
        ``dp``, ``world`` (:func:`~.grid.grid_families`); sizes in bytes, FLOPs, seconds.
    """
    m, t, mesh = cfg.model, cfg.train, cfg.mesh
    mb = cfg.num_microbatches
    steps = tuple(Step(s, i) for i in range(mb) for s in ("F", "B" if i < mb - 1 else "B_sync"))
    programs: dict[Position, Program] = {}   # classes with the same neighbours share one
    classes = []
    for name, pos, ranks in positions(mesh, m.spatial_grid):
        if pos not in programs:
            b = _Builder(cfg, pos)
            blocks = {"F": b.forward(), "B_sync": b.backward(True), "update": b.update()}
            if mb > 1:
                blocks["B"] = b.backward(False)
            programs[pos] = Program(blocks, steps + (Step("update"),))
        classes.append(RankClass(name, ranks, programs[pos]))
    px, py, pz = m.spatial_grid
    meta = WorkloadMeta(model=m.name, architecture="cosmoflow", samples=t.global_batch_size,
                        tokens=t.global_batch_size, model_flops=_model_flops(m) * t.global_batch_size,
                        dtype=t.dtype, parameter_count=_params(m), microbatches=mb)
    return Workload(f"{m.name}-grid{px}x{py}x{pz}-dp{cfg.dp}", mesh.world_size,
                    grid_families(mesh, m.spatial_grid), tuple(classes), meta)


def _params(m) -> int:
    from .shapes import parameter_count
    return parameter_count(m)


def _model_flops(m) -> float:
    """Forward + backward FLOPs of one sample (the first conv without a data gradient)."""
    total = 0.0
    for c in conv_layers(m):
        total += math.prod(c.side) * c.flops_per_voxel() * (3 if c.index else 2)
    return total + sum(6.0 * d.n_in * d.n_out for d in dense_layers(m))


def layer_costs(cfg) -> list[dict]:
    """Per layer, for one rank of the spatial group and one micro-batch: FLOPs and the
    activations kept for the backward.

    Parameters
    ----------
    cfg : RunConfig
        A ``cosmoflow`` run config.

    Returns
    -------
    list of dict
        In layer order: ``layer``, ``params``, ``forward_flops`` and ``backward_flops``
        (FLOPs), ``activation_bytes`` (bytes: a conv's input with halo planes on both sides
        of every split axis, an upper bound for ranks at the grid's ends, plus its output
        before pooling; a dense layer's gathered input and its share of outputs).
    """
    m, t = cfg.model, cfg.train
    b, B, grid = t.micro_batch_size, DTYPE_BYTES[t.dtype], m.spatial_grid
    S = math.prod(grid)
    lo, hi = halo_widths(m.kernel_size)
    rows = []
    for c in conv_layers(m):
        local = local_side(c.side, grid)
        padded = math.prod(n + (lo + hi) * (p > 1) for n, p in zip(local, grid))
        fwd = b * math.prod(local) * c.flops_per_voxel()
        rows.append({"layer": c.name, "params": c.params, "forward_flops": fwd,
                     "backward_flops": fwd * (2 if c.index else 1),
                     "activation_bytes": B * b * (padded * c.c_in + math.prod(local) * c.c_out)})
    for d in dense_layers(m):
        fwd = 2.0 * b * d.n_in * d.n_out / S
        rows.append({"layer": d.name, "params": d.params, "forward_flops": fwd,
                     "backward_flops": 2 * fwd,
                     "activation_bytes": B * b * (d.n_in + d.n_out / S)})
    return rows


def cosmoflow_memory(cfg) -> list[MemoryBreakdown]:
    """Memory of one rank: replicated conv weights, 1/S of the dense weights, their
    gradients and optimizer states (:func:`~ddlsim.workloads.memory.model_state_bytes`), and
    one micro-batch's activations (:func:`layer_costs`; a micro-batch's forward and backward
    run back to back).

    Parameters
    ----------
    cfg : RunConfig
        A ``cosmoflow`` run config.

    Returns
    -------
    list of MemoryBreakdown
        One entry (bytes), the same for every rank class up to the halo planes.
    """
    t = cfg.train
    params = _Builder(cfg, Position(((False, False),) * 3)).local_params()
    w, g, o = model_state_bytes(params, cfg.dp, cfg.parallel.zero_stage, t.dtype, t.optimizer)
    acts = sum(r["activation_bytes"] for r in layer_costs(cfg))
    return [MemoryBreakdown(w, g, o, acts, 0.0, cfg.system.device.memory_bytes)]

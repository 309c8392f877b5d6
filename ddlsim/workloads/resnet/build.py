"""The trace of one data-parallel ResNet iteration, and its memory.

Per micro-batch a forward block (one op per layer, or the proxy's whole-forward ``usleep``)
and a backward block. The last micro-batch's backward all-reduces the DDP gradient buckets on
the ``dp`` stream as they fill (:func:`~ddlsim.workloads.buckets.backward_with_buckets`),
earlier ones accumulate locally (DDP's ``no_sync``). With ``parallel.overlap_grad_reduce:
false`` the all-reduces run blocking after the backward, as a comm-only proxy calls
``MPI_Allreduce`` in a loop. An SGD/Adam update closes the iteration (``compute: model`` only:
a proxy has no optimizer step). Under eager dispatch each layer op (and the GradScaler) is
issued by a host op on the ``host`` stream, the host time measured per op (:mod:`.host`).
With a ``model.data_loader`` worker pool, each forward block starts the next batch's
preparation on the ``data_loader`` stream (:mod:`.dataloader`).
"""

from __future__ import annotations

from dataclasses import replace

from ...config import DTYPE_BYTES, RunConfig
from ...simulator.kernels.host import eager_unit_s
from ..buckets import BackwardUnit, backward_with_buckets, buckets_by_count, ddp_buckets
from ..memory import MemoryBreakdown, model_state_bytes
from ..proxytime import usleep_s
from ..trace import (P2P, Block, Collective, Compute, Op, Program, RankClass, Step, Workload,
                     WorkloadMeta)
from .dataloader import loader_op
from .host import issued_by_host, layer_host_s
from .kernels import (TENSOR_CORE_DTYPES, autocast_casts, conv_kernels, ddp_copies,
                      pointwise_kernels, sgd_kernels, stem_kernels)
from .layers import Layer
from .step import (accumulate_kernels, bn_buffers, flatten_kernels, grad_scaler_kernels,
                   input_kernels, unflatten_kernels, zero_grad_kernels)

__all__ = ["build_resnet", "resnet_memory", "grad_bucket_ranges", "ready_grad_bytes",
           "grad_dtype_bytes", "model_flops"]

#: Optimizer FLOPs and bytes per parameter (an element-wise update; the GEMMs dominate).
_OPT_FLOPS = {"sgd": 4.0, "adam": 10.0}
_OPT_BYTES = {"sgd": 16.0, "adam": 32.0}


def grad_dtype_bytes(cfg: RunConfig) -> int:
    """Bytes of a gradient element: 4 for a modelled run in fp16/bf16 (``torch.autocast``
    keeps the fp32 parameters, so their ``.grad`` and DDP's buckets are fp32), else the
    dtype's (a proxy's message dtype)."""
    t = cfg.train
    if cfg.model.compute == "model" and t.dtype in ("fp16", "bf16"):
        return 4
    return DTYPE_BYTES[t.dtype]


def ready_grad_bytes(cfg: RunConfig) -> list[float]:
    """Gradient bytes per tensor in gradient-ready order (reverse registration order)."""
    w = grad_dtype_bytes(cfg)
    return [w * t.numel for t in reversed(cfg.model.tensors)]


def grad_bucket_ranges(cfg: RunConfig) -> list[range]:
    """The gradient buckets as index ranges over :func:`ready_grad_bytes`."""
    m = cfg.model
    grads = ready_grad_bytes(cfg)
    if m.grad_buckets == "ddp":
        return ddp_buckets(grads, cfg.parallel.grad_bucket_size, m.first_bucket_size)
    return buckets_by_count(m.grad_buckets, len(grads), "model.grad_buckets")


def _compute(layer: Layer, cfg: RunConfig, backward: bool, first: bool = False) -> Compute:
    """One layer's forward (or backward: 2× the FLOPs, 2× the traffic) on a micro-batch, with
    the kernels PyTorch runs for it (:mod:`.kernels`); the first layer computes no data
    gradient. With ``zero_grad: zero`` a backward also adds each new gradient into its
    zeroed ``.grad`` (:func:`.step.accumulate_kernels`)."""
    mb, dtype = cfg.train.micro_batch_size, cfg.train.dtype
    w = DTYPE_BYTES[dtype]
    k = 2.0 if backward else 1.0
    traffic = w * (mb * (layer.inp + layer.out) + sum(t.numel for t in layer.params))
    if layer.gemm and dtype not in TENSOR_CORE_DTYPES:
        kernels = None      # CUDA-core convolutions: the roofline at η_max (resnet.md)
    elif layer.gemm:
        nhwc = cfg.model.memory_format == "channels_last"
        kernels = stem_kernels(layer, mb, dtype, backward, nhwc) \
            + conv_kernels(layer, mb, dtype, backward, nhwc, not first) \
            + autocast_casts(layer, dtype, backward)
    else:
        kernels = pointwise_kernels(layer, mb, dtype, backward,
                                    cfg.model.memory_format == "channels_last")
    if backward and first:
        k = 1.0
    if backward and kernels is not None and cfg.model.zero_grad == "zero":
        kernels += accumulate_kernels(layer.params)     # AccumulateGrad into a zeroed .grad
    return Compute(f"{'bwd' if backward else 'fwd'}.{layer.name}", k * mb * layer.flops,
                   k * traffic, kind="gemm" if layer.gemm else "elementwise", dtype=dtype,
                   kernels=kernels)


def _unit_s(cfg: RunConfig) -> float:
    """The host's time per tiny op for :mod:`.host`'s measured host work (0 off eager)."""
    return eager_unit_s(cfg.system.device.launch, cfg.software.host_dispatch)


def _host_seconds(cfg: RunConfig) -> dict[str, float]:
    """The host's seconds for each layer op and the GradScaler (:mod:`.host`: measured units
    times the device's tiny op), laid on the ``host`` stream by :func:`.host.issued_by_host`;
    none off eager dispatch or without launch facts."""
    unit_s, autocast = _unit_s(cfg), cfg.train.dtype in ("fp16", "bf16")
    if unit_s == 0.0 or cfg.model.compute != "model":
        return {}
    out = {f"{pss}.{layer.name}": layer_host_s(pss, layer.kind, 0, unit_s, autocast)
           for layer in cfg.model.layers for pss in ("fwd", "bwd")}
    out["grad_scaler"] = layer_host_s("update", "grad_scaler", 0, unit_s)
    return out


def _units(cfg: RunConfig, buckets: list[range], copies: bool = False) -> list[BackwardUnit]:
    """Backward compute in gradient-ready order: one unit per layer, or with ``compute:
    proxy`` one ``backward_per_bucket`` sleep per bucket (resnet152.cpp:44-51). ``copies``:
    each layer's gradients are then copied into DDP's buckets (the synchronised micro-batch;
    ``no_sync`` ones accumulate in ``.grad`` alone)."""
    m, t = cfg.model, cfg.train
    mb = t.micro_batch_size
    if m.compute == "proxy":
        s = m.proxy_timings["backward_per_bucket"]
        flops = 2.0 * mb * m.forward_flops / len(buckets) if s > 0 else 0.0
        return [BackwardUnit((Compute(f"bwd.bucket{k}", flops, dtype=t.dtype,
                                      seconds=usleep_s(s)),),
                             len(r)) for k, r in enumerate(buckets)]
    gb = grad_dtype_bytes(cfg)
    units = []
    for i, layer in reversed(list(enumerate(m.layers))):
        ops = (_compute(layer, cfg, True, first=i == 0),)
        if m.zero_grad == "zero" and layer.params and ops[0].kernels is None:
            # a roofline op (an fp32 convolution) cannot carry kernels: its own op
            ops += (_step_op(f"bwd.{layer.name}.accumulate", accumulate_kernels(layer.params)),)
        if copies and layer.params:
            ops += (_copies(f"bwd.{layer.name}.to_bucket", layer.params, gb),)
        units.append(BackwardUnit(ops, len(layer.params)))
    return units


def _copies(name: str, tensors, grad_bytes: int) -> Compute:
    """DDP's per-tensor gradient copies into or out of the buckets (:func:`.kernels.ddp_copies`)."""
    kernels = ddp_copies(tuple(tensors), grad_bytes)
    return Compute(name, 0.0, sum(k.bytes for k in kernels), kind="elementwise", dtype="fp32",
                   kernels=kernels)


def _step_op(name: str, kernels: tuple, kind: str = "elementwise",
             host_s: float = 0.0) -> Compute:
    """An op of the training step's own memory kernels (:mod:`.step`), fp32; ``kind``
    ``optimizer`` for those around the update (the breakdown's optimizer time); ``host_s``
    its host work beyond the launches (:mod:`.host`)."""
    return Compute(name, 0.0, sum(k.bytes for k in kernels), kind=kind, dtype="fp32",
                   kernels=kernels, host_s=host_s)


def _buffer_broadcast(layers) -> tuple[Op, ...]:
    """DDP's broadcast of the module buffers before the forward (:mod:`.step`): the dtype
    groups flattened, each broadcast from rank 0 on the ``dp`` stream, then copied back
    (a non-root rank's work, the slower one) once both have arrived."""
    buffers = bn_buffers(layers)
    groups = [(dtype, sum(b)) for dtype, b in buffers.items() if b]
    ops = [Op(_step_op("fwd.ddp.buffers.flatten", flatten_kernels(buffers)))]
    ops += [Op(Collective(f"ddp.buffers.{dtype}", "broadcast", "dp", nbytes), stream="dp",
               deps=(0,)) for dtype, nbytes in groups]
    ops.append(Op(_step_op("fwd.ddp.buffers.copy", unflatten_kernels(buffers)),
                  deps=tuple(range(1, len(ops)))))
    return tuple(ops)


def _update(cfg: RunConfig) -> tuple[Op, ...]:
    """The update block: GradScaler's unscale and update where set, the optimizer step, then
    ``zero_grad`` where it zeroes (:mod:`.step`; DLE ``training.py`` ``train_step`` order)."""
    m, unit_s = cfg.model, _unit_s(cfg)
    ops = [Op(_step_op("grad_scaler", grad_scaler_kernels(m.tensors), "optimizer"))] \
        if m.grad_scaler else []
    ops.append(Op(_optimizer(cfg)))
    if m.zero_grad == "zero":
        kernels = zero_grad_kernels(m.tensors)
        ops.append(Op(_step_op("zero_grad", kernels, "optimizer",
                               layer_host_s("update", "zero_grad", len(kernels), unit_s))))
    return tuple(ops)


def _optimizer(cfg: RunConfig) -> Compute:
    """The update: SGD one tensor at a time with its kernels (:func:`.kernels.sgd_kernels`),
    Adam as one element-wise pass."""
    m, t = cfg.model, cfg.train
    n = m.params
    kernels = None
    if t.optimizer == "sgd":
        decayed = tuple(m.weight_decay == "all" or (m.weight_decay == "no_bn"
                                                    and layer.kind != "bn")
                        for layer in m.layers for _ in layer.params)
        kernels = sgd_kernels(m.tensors, decayed)
    return Compute("optimizer", _OPT_FLOPS[t.optimizer] * n, _OPT_BYTES[t.optimizer] * n,
                   kind="optimizer", dtype="fp32", kernels=kernels)


def _ring_sync(buckets: list[range], grads: list[float], base: int) -> tuple[Op, ...]:
    """comm_only/resnet50.cpp ``run_ring`` (lines 223-237): per bucket, ``MPI_Irecv`` from the
    previous rank, blocking ``MPI_Send`` to the next, ``MPI_Wait`` on the receive; the next
    bucket starts when the receive is complete. ``base``: the index in the block of the first
    op returned.

    The ``MPI_Wait`` is a zero-length compute op that depends on the receive (a trace's send
    is done when posted and a ``Wait`` on a stream does not wait for point-to-point
    transfers: only ops that depend on a receive do, docs/trace.md).
    """
    ops: list[Op] = []
    for k, r in enumerate(buckets):
        nbytes = float(sum(grads[i] for i in r))
        at = base + len(ops)
        after = (at - 1,) if at else ()
        # MPI_Irecv posted, then a blocking MPI_Send (on the compute stream: ddlsim comm names
        # it `send`, the receive `irecv`); the send is listed first so that engines that issue
        # a class's ops in order never wait at the receive before every send of the ring is out
        ops += [Op(P2P(f"grad.ring{k}.send", "send", "dp", +1, nbytes, f"ring{k}"),
                   stream="compute", deps=after),
                Op(P2P(f"grad.ring{k}.recv", "recv", "dp", -1, nbytes, f"ring{k}"),
                   stream="dp.recv", deps=after),
                Op(Compute(f"grad.ring{k}.wait", 0.0, kind="elementwise", seconds=0.0),
                   deps=(at, at + 1))]
    return tuple(ops)


def _blocks(cfg: RunConfig) -> dict[str, Block]:
    m, t = cfg.model, cfg.train
    mb = t.micro_batch_size
    buckets = grad_bucket_ranges(cfg)
    grads = ready_grad_bytes(cfg)
    units = _units(cfg, buckets)
    if m.compute == "proxy":
        s = m.proxy_timings["forward"]
        fwd = (Op(Compute("fwd.model", mb * m.forward_flops if s > 0 else 0.0, dtype=t.dtype,
                          seconds=usleep_s(s))),)
    else:
        fwd = tuple(Op(_compute(layer, cfg, False)) for layer in m.layers)
        if m.input_pipeline != "none":
            fwd = (Op(_step_op("fwd.input", input_kernels(
                m.input_pipeline, mb, m.image_size, m.num_classes))),) + fwd
        if m.broadcast_buffers and cfg.dp > 1:
            fwd = _buffer_broadcast(m.layers) + fwd
        loader = loader_op(cfg)
        if loader is not None:      # the next batch's preparation, beside the whole step
            fwd = (loader,) + tuple(replace(op, deps=tuple(d + 1 for d in op.deps))
                                    for op in fwd)
    plain = tuple(Op(c) for u in units for c in u.ops)
    if cfg.dp == 1 and cfg.parallel.collective_buffers == "in_place":
        # nothing to synchronise (an all-reduce over one rank moves nothing; with separate
        # buffers MPI still copies, so the calls stay: ddlsim.workloads.onerankcopy)
        sync = plain
    elif m.grad_sync == "ring_sendrecv":
        sync = plain + _ring_sync(buckets, grads, len(plain))
    else:
        synced = _units(cfg, buckets, copies=m.compute == "model")
        sync = backward_with_buckets(synced, buckets, grads, "dp", cfg.software.overlap_grad_reduce)
        if m.compute == "model":    # the all-reduced buckets copied back into each .grad
            sync += (Op(_copies("grad.from_bucket", m.tensors, grad_dtype_bytes(cfg))),)
    host = _host_seconds(cfg)
    blocks = {"F": Block("F", "forward", issued_by_host(fwd, host)),
              "B": Block("B", "backward", issued_by_host(plain, host)),
              "B.sync": Block("B.sync", "backward", issued_by_host(sync, host))}
    if m.compute == "model":
        blocks["update"] = Block("update", "optimizer", issued_by_host(_update(cfg), host))
    return blocks


def build_resnet(cfg: RunConfig) -> Workload:
    """The trace of one data-parallel iteration of ``cfg`` (every rank in one class)."""
    m, t, mesh = cfg.model, cfg.train, cfg.mesh
    blocks = _blocks(cfg)
    n_mb = cfg.num_microbatches
    steps = [Step(name, i) for i in range(n_mb)
             for name in ("F", "B.sync" if i == n_mb - 1 else "B")]
    if "update" in blocks:
        steps.append(Step("update"))
    program = Program(blocks, tuple(steps))
    meta = WorkloadMeta(model=m.name, architecture="resnet", samples=t.global_batch_size,
                        tokens=t.global_batch_size,
                        model_flops=model_flops(m, 3.0 * m.forward_flops * t.global_batch_size),
                        dtype=t.dtype, parameter_count=m.params, microbatches=n_mb)
    return Workload(f"{m.name}-dp{cfg.dp}", mesh.world_size, mesh.families(),
                    (RankClass("all", tuple(range(mesh.world_size)), program),), meta)


def model_flops(model, flops: float) -> float:
    """``flops``, or 0 for a comm-only proxy (``compute: proxy`` with every timing 0 s: it
    does none of the model's work, so its FLOPs, MFU and FLOP/s are 0, not infinite)."""
    if model.compute == "proxy" and not any(model.proxy_timings.values()):
        return 0.0
    return flops


def resnet_memory(cfg: RunConfig) -> list[MemoryBreakdown]:
    """Model states (:func:`model_state_bytes`) and the activations one micro-batch keeps for
    the backward: the input image and the outputs of every convolution, batch norm, residual
    add and pooling layer (torchvision's ReLUs are in place and keep nothing new)."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    w, g, o = model_state_bytes(m.params, cfg.dp, p.zero_stage, t.dtype, t.optimizer)
    kept = 3 * m.image_size ** 2 + sum(layer.out for layer in m.layers if layer.kind != "relu")
    acts = DTYPE_BYTES[t.dtype] * t.micro_batch_size * kept
    return [MemoryBreakdown(w, g, o, acts, 0.0, cfg.system.device.memory_bytes)]

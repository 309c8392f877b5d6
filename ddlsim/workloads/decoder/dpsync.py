"""Data-parallel gradient buckets of a decoder stage (a mixin of
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`): the bucketed all-reduce or
reduce-scatter of one model chunk, issued on the ``dp`` stream after each run of backward
layers (``overlap_grad_reduce``) or all at once after the backward.

Overlapped, a run's buckets hold NCCL's channels beside the next run of layers: that run
gets a contention op (:func:`~ddlsim.workloads.smcontention.beside`, docs/overlap.md "SMs
taken by communication"), its GEMMs' extra time ``(k/S)·min(C, G_k)``, ``C`` the buckets'.
The last run's buckets run beside what follows the backward (the next chunk's or
micro-batch's work, the optimizer), which is not charged.

The stack's DDP may also pass over the gradient buffer on the compute stream
(``ddp.bucket_passes`` and ``ddp.grad_zero_passes`` in software.yaml, :func:`bucket_passes`):
over each bucket before its collective, with the host's wait for the bucket's NaN check
(:mod:`.host_sync`), after each run of overlapped layers (:meth:`GradSyncOps.bucket_pass_ops`),
or in the update block (:meth:`GradSyncOps.ddp_pass_ops`: the buffer's ``zero_()``, and the
buckets' passes where they are not overlapped)."""

from __future__ import annotations

import functools
import math

import numpy as np

from ...software import _stack_table
from ..smcontention import beside
from ..trace import Collective, Compute, Kernel, Op
from .stage import StageBase

__all__ = ["GradSyncOps", "buckets", "bucket_passes", "bucket_run_times", "bucket_runs",
           "ddp_pass_times", "grad_bucket_bytes", "whole_gradient_passes", "MEGATRON_BUCKET"]

#: Megatron-Core's default bucket, in parameters: ``max(40000000, 1000000 · dp)``
#: (NVIDIA/Megatron-LM 900f1b76 and 9c1a5351, megatron/core/distributed/
#: distributed_data_parallel.py, lines 51-54 and 62-65: "if using very large dp_sizes, make
#: buckets larger to ensure that chunks used in NCCL ring-reduce implementations are large
#: enough to remain bandwidth-bound rather than latency-bound")
MEGATRON_BUCKET = (40_000_000, 1_000_000)


def _stack_rule(cfg) -> str:
    """The stack's ``ddp.grad_buckets`` rule (software.yaml): ``megatron_core``, or
    ``pytorch_ddp`` (``parallel.grad_bucket_size``, PyTorch DDP's bucket_cap_mb) when the
    stack does not name one."""
    entry = (_stack_table()[cfg.software.name].get("ddp") or {}).get("grad_buckets")
    return entry["value"] if entry else "pytorch_ddp"


@functools.lru_cache(maxsize=None)
def bucket_cap_mb(stack: str) -> float | None:
    """The ``bucket_cap_mb`` stack ``stack`` hands PyTorch DDP (its ``ddp.bucket_cap_mb``
    entry in software.yaml, source beside it; torch caps a bucket at ``bucket_cap_mb · 2²⁰``
    bytes), None where it names none (``parallel.grad_bucket_size``'s default, DDP's 25)."""
    entry = (_stack_table()[stack].get("ddp") or {}).get("bucket_cap_mb")
    return None if entry is None else float(entry["value"])


@functools.lru_cache(maxsize=None)
def bucket_passes(stack: str, key: str = "bucket_passes") -> int:
    """Memory passes over gradient bytes that stack ``stack``'s DDP runs on the compute
    stream, outside the backward's kernels and the optimizer step: the ``ddp.<key>`` entry of
    software.yaml (its source beside it), 0 where the stack names none. ``bucket_passes``:
    over each bucket as it is issued (Megatron-Core 2024: the NaN check's norm, read, and the
    scaling by 1/DP, read + write; torch DDP: the gradient copied into its bucket, read +
    write); ``grad_zero_passes``: over the whole gradient buffer once an iteration
    (Megatron-Core 2024: ``zero_()``, write); ``grad_copy_passes``: over the whole gradient
    after its all-reduce (torch DDP without ``gradient_as_bucket_view``: the bucket copied
    back into the gradients, read + write)."""
    entry = (_stack_table()[stack].get("ddp") or {}).get(key)
    return int(entry["value"]) if entry else 0


def whole_gradient_passes(stack: str) -> int:
    """Passes over the whole gradient buffer that stack ``stack``'s DDP runs once an
    iteration in the update block: ``ddp.grad_zero_passes`` + ``ddp.grad_copy_passes``
    (:func:`bucket_passes`)."""
    return bucket_passes(stack, "grad_zero_passes") + bucket_passes(stack, "grad_copy_passes")


def _pass_seconds_per_byte(dev) -> float:
    """Seconds per byte of one fp32 memory pass on kernel device ``dev`` (a memory kernel's
    time is linear in its bytes: :func:`~ddlsim.simulator.kernels.kernel_time`)."""
    from ...simulator.kernels import kernel_time
    gib = float(2 ** 30)
    return kernel_time(Kernel("memory", bytes=gib, dtype="fp32"), dev) / gib


def ddp_pass_times(stack: str, dev, grad_bytes, bucket_bytes=None):
    """``(device seconds, kernels)`` of stack ``stack``'s DDP passes in the update block
    (:meth:`GradSyncOps.ddp_pass_ops`: the zero pass over ``grad_bytes``, the bucket passes
    over ``bucket_bytes``, default the same) on kernel device ``dev``, for
    :func:`~ddlsim.simulator.kernels.host.stream_times`: the vectorised search tier's form of
    the same op. Element-wise on arrays."""
    z, n = whole_gradient_passes(stack), bucket_passes(stack)
    grad_bytes = np.asarray(grad_bytes, dtype=float)
    bucket_bytes = grad_bytes if bucket_bytes is None else np.asarray(bucket_bytes, dtype=float)
    if not z + n:
        return 0.0 * grad_bytes, 0.0 * grad_bytes
    seconds = (z * grad_bytes + n * bucket_bytes) * _pass_seconds_per_byte(dev)
    return seconds, z * (grad_bytes > 0) + n * (bucket_bytes > 0.0)


def bucket_run_times(stack: str, dev, launch_spec, bucket_bytes, count):
    """Seconds of :meth:`GradSyncOps.bucket_pass_ops` before ``count`` buckets of
    ``bucket_bytes`` each on kernel device ``dev`` (its passes, one kernel a pass and bucket,
    timed by :func:`~ddlsim.simulator.kernels.host.stream_times`, and ``count`` of the host's
    bucket waits, :func:`.host_sync.site_seconds`): the search tier's form. Element-wise on
    arrays.

    Parameters
    ----------
    stack : str
        the software stack's name.
    dev : KernelDevice
        the kernel model's device.
    launch_spec : LaunchSpec or None
        ``system.device.launch``.
    bucket_bytes, count : array
        bytes of one bucket, and the buckets of the run.

    Returns
    -------
    array of seconds
    """
    from ...simulator.kernels.host import stream_times
    from .host_sync import site_seconds
    n = bucket_passes(stack)
    size, count = np.asarray(bucket_bytes, dtype=float), np.asarray(count, dtype=float)
    passes = stream_times(n * count * size * _pass_seconds_per_byte(dev),
                          np.where(size > 0, n * count, 0.0), dev.launch) if n else 0.0
    return passes + count * site_seconds(stack, dev.launch, launch_spec, "bucket")


def grad_bucket_bytes(cfg, dp, grad_dtype_bytes, stage=0, chunk=0):
    """Bytes of one gradient bucket of model chunk ``chunk`` on pipeline ``stage``.

    ``parallel.grad_bucket_size`` when the config sets it; else the stack's rule: PyTorch
    DDP's ``bucket_cap_mb`` (the stack's ``ddp.bucket_cap_mb``, else the field's default,
    25 MiB), or Megatron-Core's
    ``max(40e6, 1e6 · dp)`` parameters of ``grad_dtype_bytes`` each, and one bucket (infinite
    size) where Megatron-Core turns bucketing off: without ``overlap_grad_reduce``, on
    pipeline ranks after the first (``pp_rank > 0``, the same file lines 186-187 at 9c1a5351)
    and for model chunks after the first (``disable_bucketing=(model_chunk_idx > 0)``,
    megatron/training/training.py line 1138 at 9c1a5351, line 431 at 900f1b76). ``dp`` may
    be an array of plans (the search tier's).
    """
    p = cfg.parallel
    if "grad_bucket_size" in p.model_fields_set:
        return p.grad_bucket_size
    if _stack_rule(cfg) != "megatron_core":
        cap = bucket_cap_mb(cfg.software.name)
        return p.grad_bucket_size if cap is None else cap * 2**20
    if not cfg.software.overlap_grad_reduce or stage > 0 or chunk > 0:
        return math.inf
    floor, per_rank = MEGATRON_BUCKET
    if isinstance(dp, (int, float)) and isinstance(grad_dtype_bytes, (int, float)):
        # one plan (the builder's, 3 a plan): the same float numpy gives, without numpy
        return max(float(floor), per_rank * float(dp)) * grad_dtype_bytes
    return np.maximum(floor, per_rank * np.asarray(dp, dtype=float)) * grad_dtype_bytes


def buckets(grad_bytes, bucket_bytes):
    """Buckets of at most ``bucket_bytes`` the gradients fill (at least one); element-wise on
    arrays of plans (the search tier's)."""
    if np.ndim(grad_bytes) == 0:
        return max(1, math.ceil(grad_bytes / bucket_bytes))
    return np.maximum(1, np.ceil(grad_bytes / bucket_bytes))


def bucket_runs(grad_bytes, bucket_bytes, runs):
    """(segments, buckets per segment) of a chunk whose gradients are issued after runs of
    backward layers: one segment per run, at most one per bucket, the buckets spread evenly
    (the last segments may be a bucket short: each issues ``per_seg`` buckets of
    ``grad_bytes / (segments·per_seg)``). Element-wise on arrays of plans."""
    n = buckets(grad_bytes, bucket_bytes)
    if np.ndim(n) == 0 and np.ndim(runs) == 0:
        n_seg = min(n, runs)
        return n_seg, math.ceil(n / n_seg)
    n_seg = np.minimum(n, runs)
    return n_seg, np.ceil(n / n_seg)


class GradSyncOps(StageBase):
    """Gradient-bucket ops; reads the plan and the builder's ``layer_ops``, ``stage_params``
    and ``stage_expert_params`` (declared in :class:`.stage.StageBase`)."""

    def bucket_bytes(self, stage: int = 0, chunk: int = 0) -> float:
        """This plan's gradient bucket on ``stage``'s ``chunk`` (:func:`grad_bucket_bytes`,
        resolved in the plan)."""
        return self.plan.bucket_bytes(stage, chunk)

    def _overlapped_layers(self, sync_ops: list[Op], start: int, layers: int,
                           offset: int = 0, passes: bool = False,
                           after: tuple[Op, ...] = ()) -> list[Op]:
        """The chunk's ``layers`` backward layers split into bucket segments; after each
        segment its gradients' collective is issued on the dp stream (PyTorch DDP buckets,
        overlap with backward). ``offset``: the rank's layers before the chunk; ``passes``:
        each segment's buckets' passes and host waits before it (:meth:`bucket_pass_ops`);
        ``after``: compute ops whose gradients the last bucket holds too, run after the last
        segment's layers and before its collective (the input embedding's backward: the
        first parameter is in the last bucket, buckets being filled in reverse order)."""
        key = ("overlapped", tuple((o.payload, o.repeat) for o in set(sync_ops)), len(sync_ops),
               start, layers, offset, passes, after)
        return self.cached(key, lambda: self._segments(sync_ops, start, layers, offset, passes,
                                                       after))

    def _segments(self, sync_ops: list[Op], start: int, layers: int, offset: int,
                  passes: bool, after: tuple[Op, ...] = ()) -> list[Op]:
        w = max(1, len({o.stream for o in sync_ops}))   # per segment: dense [and expert]
        f, n_seg = self.period, len(sync_ops) // w
        periods = layers // f
        ops: list[Op] = []
        done = 0                     # layers of the chunk behind, in backward order
        for seg in range(n_seg):
            n = f * (periods // n_seg + (1 if seg < periods % n_seg else 0))
            done += n
            run = self.layer_ops(True, n, first=offset + layers - done)
            ops += run
            if seg:                  # the previous run's buckets hold SMs beside this run
                prev = sync_ops[w * (seg - 1):w * seg]
                extra = beside(f"dp.run{seg}", run,
                               [(o.payload, o.repeat) for o in prev], self.dtype)
                ops += [extra] if extra is not None else []
            if seg == n_seg - 1:
                ops += after
            if passes:   # each bucket's passes and the host's NaN check before it
                ops += self.bucket_pass_ops(sync_ops[w * seg:w * seg + w])
            last = start + len(ops) - 1
            for s in sync_ops[w * seg:w * seg + w]:
                ops.append(Op(s.payload, stream=s.stream, deps=(last,), repeat=s.repeat))
        return ops

    def bucket_pass_ops(self, bucket_ops: list[Op]) -> list[Op]:
        """What the stack runs on the compute stream before the collectives ``bucket_ops``
        of one run (each op ``repeat`` buckets of its ``bytes``): the ``ddp.bucket_passes``
        over each bucket (one memory kernel a pass and bucket) and the host's wait of each
        bucket's NaN check (:meth:`.host_sync.HostSyncOps.step_sync_ops`, site ``bucket``);
        none under ZeRO-3 or where the stack names none."""
        if self.plan.zero_stage == 3:
            return []
        n = bucket_passes(self.sw.name)
        count = sum(o.repeat for o in bucket_ops)
        nbytes = sum(o.payload.bytes * o.repeat for o in bucket_ops)
        ops: list[Op] = []
        if n and nbytes:
            _refuse_kernel_flood(n * count, nbytes / max(count, 1))
            kernels = tuple(Kernel("memory", bytes=o.payload.bytes, dtype="fp32")
                            for o in bucket_ops for _ in range(n * o.repeat))
            ops.append(Op(Compute("grad.bucket_passes", 0.0, n * nbytes, kind="elementwise",
                                  dtype="fp32", kernels=kernels)))
        return ops + self.host_wait_ops("bucket", count)

    def ddp_pass_ops(self, grad_bytes: float, bucket_bytes: float | None = None) -> list[Op]:
        """The stack's DDP passes in the update block, one memory kernel a pass, on the
        compute stream: the buffer's ``zero_()`` over the stage's ``grad_bytes``
        (``ddp.grad_zero_passes``; Megatron-Core runs it before the next forward, the same
        place on the compute stream), torch DDP's copy of the reduced buckets back into the
        gradients (``ddp.grad_copy_passes``; torch runs it at the backward's end, before the
        step, on the same compute stream, after the last bucket's all-reduce as here) and the
        ``ddp.bucket_passes`` over ``bucket_bytes`` (default: all of them). Megatron-Core
        runs those, the NaN check's norm and the 1/DP scaling (torch DDP: the copy into the
        bucket), as each bucket is issued: the first stage's first chunk's overlapped buckets
        get them before each run's collectives (:meth:`bucket_pass_ops`); every other
        chunk's one bucket gets them at the end of its last backward, before its gradient's
        send on a later pipeline stage, which this placement leaves out of the pipeline's
        flush. None where the stack names none."""
        bucket_bytes = grad_bytes if bucket_bytes is None else bucket_bytes
        kernels = (*(Kernel("memory", bytes=grad_bytes, dtype="fp32"),)
                   * whole_gradient_passes(self.sw.name),
                   *(Kernel("memory", bytes=bucket_bytes, dtype="fp32"),)
                   * bucket_passes(self.sw.name))
        kernels = tuple(k for k in kernels if k.bytes)
        if not kernels:
            return []
        return [Op(Compute("grad.ddp_passes", 0.0, sum(k.bytes for k in kernels),
                           kind="elementwise", dtype="fp32", kernels=kernels))]

    def grad_sync_ops(self, stage: int, chunk: int = 0) -> list[Op]:
        """Bucketed gradient collectives of one model chunk (all-reduce, or reduce-scatter
        under ZeRO-1/2), one per segment of layers, on the ``dp`` stream. The chunk's share of
        the stage's parameters is its share of the stage's layers (1/VPP when even)."""
        edp = self.plan.edp if self.split_experts else self.gdp
        if self.gdp == 1 and edp == 1:
            return []
        layers = self.split[stage][chunk]
        if layers == 0:   # the embedding's or the loss's chunk alone (.split): the stage's
            return []     # parameters are shared by its chunks' layers, none to this one
        share = layers / sum(self.split[stage])
        grad_bytes = self.stage_params(stage) * share * self.gdt
        n_seg, per_seg = bucket_runs(grad_bytes, self.bucket_bytes(stage, chunk),
                                     layers // self.period)
        op = "reduce_scatter" if self.plan.zero_stage in (1, 2) else "all_reduce"
        if self.split_experts:  # dense gradients over dp (× cp), expert gradients over edp
            e_bytes = self.stage_expert_params(stage) * share * self.gdt
            size = (grad_bytes - e_bytes) / (n_seg * per_seg)
            dense = [Op(Collective(f"grad.{op}", op, self.grad_group, size), stream="dp",
                        repeat=per_seg)] if self.gdp > 1 else []
            expert = [Op(Collective(f"grad.expert.{op}", op, "edp", e_bytes / (n_seg * per_seg)),
                         stream="edp", repeat=per_seg)] if edp > 1 else []
            return [*dense, *expert] * n_seg
        size = grad_bytes / (n_seg * per_seg)
        return [Op(Collective(f"grad.{op}", op, self.grad_group, size), stream="dp",
                   repeat=per_seg)] * n_seg

    def grad_sync_ops_flat(self, grad_bytes: float, op: str, group: str = "dp",
                           stage: int = 0) -> list[Op]:
        """The stage's gradients reduced after the backward, bucket by bucket, on ``group``
        (none on a group of one rank)."""
        size = self.plan.edp if group == "edp" else self.gdp
        if size == 1:
            return []
        n = buckets(grad_bytes, self.bucket_bytes(stage))
        name = f"grad.expert.{op}" if group == "edp" else f"grad.{op}"
        stream = "dp" if group == "dp_cp" else group
        return [Op(Collective(name, op, group, grad_bytes / n), stream=stream, repeat=n)]


def _refuse_kernel_flood(kernels: int, bucket_bytes: float) -> None:
    """Refuse a run whose buckets' passes would list more kernels than a trace holds ops
    (:attr:`ddlsim.limits.Limits.trace_ops`): each pass over each bucket is one kernel, so a
    tiny ``parallel.grad_bucket_size`` on a large model would fill the memory before the
    work budget sees the trace."""
    from ...errors import WorkTooLargeError
    from ...limits import Limits
    cap = Limits().trace_ops
    if kernels > cap:
        raise WorkTooLargeError(
            f"parallel.grad_bucket_size: buckets of {bucket_bytes:,.0f} B make {kernels:,} bucket "
            f"pass kernels a run, over the {cap:,} ops a trace may hold; use larger buckets "
            f"(PyTorch DDP's default is 25 MiB)")

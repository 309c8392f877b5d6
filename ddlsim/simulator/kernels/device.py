"""The device facts of the kernel model and the time of a compute op made of kernels.

From ``system.device`` (ddlsim/data/systems.yaml cites each preset's values):

* ``peak_flops[dtype]`` — datasheet dense peak;
* ``matmul_efficiency[dtype]`` — ``η_max``, the maximum achievable matmul FLOP/s as a fraction
  of peak, measured by a microbenchmark (MAMF) with the library ``matmul_library``; a stack
  whose GEMM library (``software.kernels.gemm_library``) has its own measured figures in
  ``matmul_efficiency_by_library`` uses those (:func:`matmul_ceilings`);
  ``system.compute_efficiency``, when the user sets it, overrides it for every dtype (an
  explicit override, e.g. a calibrated figure);
* ``sm_count`` — for the wave quantisation of GEMMs;
* ``gemm_epilogue`` — ``serialized`` where a GEMM kernel runs each tile's epilogue after its
  main loop, one tile per SM: a GEMM accumulating into a wider buffer then pays the extra
  epilogue bytes per wave (:mod:`.gemm`); ``overlapped`` or unset: in its memory roofline only;
* ``memory_efficiency`` — achieved / datasheet memory bandwidth of streaming kernels;
* ``elementwise_efficiency[class]`` — the same for the element-wise kernels of a class that
  published kernel tables or a microbenchmark time apart
  (:data:`.elementwise.ELEMENTWISE_CLASSES`; the optimizer step, a roofline op, by its class
  ``optimizer``);
* ``attention_measured`` — the GPU whose published attention-kernel measurements time the
  fused attention kernels by kernel, pass, mask, head dim and length
  (:mod:`.attention_measured`);
* ``attention_efficiency[flash2|flash3|cudnn]`` — a fused attention kernel's fraction of
  peak where the table has no curve for it;
* ``launch`` — host and launch time per kernel, under the stack's ``host_dispatch``
  (:mod:`.host`): an op's time is ``max(Σ kernel time + n·gap, n·host)``;
* ``power_limits[power_limit_W]`` — the rate dense GEMMs sustain at the board's limit once
  it is saturated, a ceiling on every GEMM over the burst ``η_max`` (at
  ``matmul_power_limit_W`` itself: MSMF against MAMF), and at another limit the attention
  kernels' rate there (:mod:`.power`).

A device without a fact falls back, each time in the same documented way (docs/compute.md):
no ``sm_count``: no quantisation; no ``matmul_efficiency``: 0.75, the former default of
``compute_efficiency``; a dtype without its own figure: the device's best one; no
``memory_efficiency``: the datasheet bandwidth; no attention figure: ``η_max``, except
that ``cudnn`` with neither a curve nor its own figure takes ``flash2``'s (TransformerEngine
prefers cuDNN's kernel on Hopper only and runs FlashAttention-2 elsewhere, docs/compute.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from ...config_types import DTYPE_BYTES
from ...workloads.trace import Compute, Kernel
from .attention import DROPOUT_SLOWDOWN, parse_flash_variant
from .attention_measured import measured_efficiency
from .fp8recipe import fp8_gemm_efficiency, fp8_pass_efficiency
from .gemm import GemmOverhead, epilogue_increment_bytes, gemm_time
from .host import NO_LAUNCH, Launch, launch_costs, stream_time
from .power import attention_scale, sustained_rates

__all__ = ["KernelDevice", "kernel_device", "kernel_time", "kernel_times", "op_time",
           "DEFAULT_CEILING", "matmul_ceilings"]

#: matmul ceiling of a device with no measured figure: ``system.compute_efficiency``'s former
#: default (0.75, "achieved/peak of large bf16 GEMMs on A100")
DEFAULT_CEILING = 0.75
#: ``variant`` of the non-flash attention core's s² memory kernels (.attention): its softmax
#: forward and backward (element-wise classes of their own) and the rest (dropout)
SCORE_VARIANTS = ("scores", "softmax", "softmax_backward")


@dataclass(frozen=True)
class KernelDevice:
    """What the kernel model knows of one device (:func:`kernel_device`)."""

    peak: dict[str, float]
    memory_Bps: float
    sm_count: int | None
    matmul: dict[str, float]
    attention: dict[str, float]
    override: float | None = None
    #: the fused attention kernels' rate at the device's power limit over their rate at the
    #: limit its attention figures were measured at (:mod:`.power`)
    attention_scale: float = 1.0
    #: dtype → the fraction of peak a dense GEMM sustains at the device's power limit, where
    #: it is not the limit of the ceilings (:mod:`.power`); None: no such cap
    sustained: dict[str, float] | None = None
    #: achieved bandwidth of the non-flash attention core's s² kernels (``variant`` in
    #: :data:`SCORE_VARIANTS`) whose class the device did not measure
    scores_Bps: float | None = None
    #: host time and device gap per kernel under the stack's dispatch mode (:mod:`.host`)
    launch: Launch = NO_LAUNCH
    #: a GEMM kernel's fixed device time, where measured (``device.gemm_overhead``)
    gemm_overhead: GemmOverhead | None = None
    #: the GPU of the measured attention table timing the fused attention kernels
    attention_gpu: str | None = None
    #: (class, achieved B/s) of the element-wise kernel classes the device measured
    #: (``device.elementwise_efficiency``, :data:`.elementwise.ELEMENTWISE_CLASSES`)
    elementwise_Bps: tuple[tuple[str, float], ...] = ()
    #: whether a GEMM kernel's epilogue follows its main loop unoverlapped, one tile per SM
    #: (``device.gemm_epilogue == "serialized"``, :mod:`.gemm`)
    gemm_epilogue_serialized: bool = False

    def pass_Bps(self, variant: str) -> float:
        """Achieved bandwidth of a memory pass of kernel ``variant``, B/s: the element-wise
        classes the device measured at their own, the non-flash attention core's other s²
        kernels (:data:`SCORE_VARIANTS`) at the score-pass bandwidth, any other at the
        streaming bandwidth."""
        for name, bw in self.elementwise_Bps:
            if name == variant:
                return bw
        if variant in SCORE_VARIANTS and self.scores_Bps:
            return self.scores_Bps
        return self.memory_Bps

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s at ``dtype`` (the device's best when it lists no such dtype)."""
        return self.peak.get(dtype) or max(self.peak.values())

    def ceiling(self, dtype: str) -> float:
        """``η_max`` at ``dtype``: the user's ``compute_efficiency``, else the device's
        measured figure (its best for an unlisted dtype), else :data:`DEFAULT_CEILING`."""
        if self.override is not None:
            return self.override
        if dtype in self.matmul:
            return self.matmul[dtype]
        return max(self.matmul.values()) if self.matmul else DEFAULT_CEILING

    def sustained_rate(self, dtype: str) -> float | None:
        """The fraction of peak a dense GEMM at ``dtype`` sustains at the device's power
        limit (the device's best for an unlisted dtype), or None where the limit is the one
        its ceilings were measured at."""
        if not self.sustained:
            return None
        return self.sustained.get(dtype) or max(self.sustained.values())

    def flash(self, variant: str, dtype: str, shape: tuple[float, float, float] = (0, 0, 0),
              pairs: float | None = None) -> float:
        """A fused attention kernel's fraction of peak: the measured curve of its kernel, pass
        and mask at its head dim and length (``shape = (s, s_k, d)``) where the device has a
        table — with ``pairs`` (sequence, head) pairs in the launch, scaled by the share of
        the SMs its tiles keep busy over that of the curve's own launch
        (:mod:`.attention_tiles`) — else the device's figure for the kernel (``cudnn``: else
        ``flash2``'s), else ``η_max``; with attention dropout, divided by the measured
        slowdown of the kernel that figure times (:data:`.attention.DROPOUT_SLOWDOWN`;
        none: 1)."""
        v = parse_flash_variant(variant)
        kernel, eta = v.kernel, None
        if self.attention_gpu is not None and shape[0] > 0:
            eta = measured_efficiency(self.attention_gpu, v.kernel, v.pass_, v.causal,
                                      shape[2], shape[0], pairs, self.sm_count, shape[1])
        if eta is None:
            eta = self.attention.get(kernel)
            if eta is None and kernel == "cudnn":     # TE runs FlashAttention-2 off Hopper
                kernel, eta = "flash2", self.attention.get("flash2")
            eta = eta or self.ceiling(dtype)
        slowdown = DROPOUT_SLOWDOWN.get(kernel, 1.0) if v.dropout else 1.0
        return eta * self.attention_scale / slowdown


def matmul_ceilings(system: Any) -> dict[str, float]:
    """dtype → matmul ceiling of ``system``'s device under its software stack: the figures
    the device measured with the stack's GEMM library (``software.kernels.gemm_library``,
    ``device.matmul_efficiency_by_library``), else its ``matmul_efficiency``. When the device
    says which library that figure comes from and has none for the stack's, the figure is
    used with a :class:`~ddlsim.errors.DDLSimWarning` naming both."""
    from ...software import resolve_software
    dev = system.device
    software = resolve_software(system.software)
    library = software.gemm_library
    table = dev.matmul_efficiency_by_library or {}
    if library in table:
        return dict(table[library])
    if dev.matmul_library and library != dev.matmul_library \
            and system.compute_efficiency is None:
        import warnings

        from ...errors import DDLSimWarning
        warnings.warn(f"system.device {dev.name!r} has no matmul ceiling measured with "
                      f"{library} (the GEMM library of software stack {software.name!r}); its "
                      f"{dev.matmul_library} figure is used "
                      f"(device.matmul_efficiency_by_library adds one)",
                      DDLSimWarning, stacklevel=3)
    return dict(dev.matmul_efficiency or {})


def _gemm_overhead(dev: Any) -> GemmOverhead | None:
    spec = dev.gemm_overhead
    return None if spec is None else GemmOverhead(spec.floor_s, spec.wave_s)


def kernel_device(system: Any) -> KernelDevice:
    """The :class:`KernelDevice` of ``system`` (a :class:`~ddlsim.config.SystemConfig`)."""
    from ...software import resolve_software
    dev = system.device
    scores = dev.score_pass_efficiency or dev.memory_efficiency or 1.0
    launch = launch_costs(dev.launch, resolve_software(system.software).host_dispatch)
    ceilings = matmul_ceilings(system)
    own = system.compute_efficiency is None     # a user's figure is taken as it is
    return KernelDevice(dict(dev.peak_flops),
                        dev.memory_bandwidth_Bps * (dev.memory_efficiency or 1.0),
                        dev.sm_count, ceilings,
                        dict(dev.attention_efficiency or {}), system.compute_efficiency,
                        attention_scale(dev) if own else 1.0,
                        sustained_rates(dev, ceilings) if own else None,
                        dev.memory_bandwidth_Bps * scores, launch,
                        gemm_overhead=_gemm_overhead(dev),
                        attention_gpu=dev.attention_measured,
                        elementwise_Bps=tuple(
                            (c, dev.memory_bandwidth_Bps * f)
                            for c, f in sorted((dev.elementwise_efficiency or {}).items())),
                        gemm_epilogue_serialized=dev.gemm_epilogue == "serialized")


def kernel_time(k: Kernel, dev: KernelDevice, efficiency: float | None = None) -> float:
    """Seconds of one kernel. ``efficiency``: a calibration profile's measured GEMM efficiency,
    which replaces the shape model (ceiling × quantisation) for a GEMM. The non-flash
    attention core's s² kernels (``variant="scores"``) move their bytes at the device's
    score-pass bandwidth, an element-wise kernel of a measured class
    (``device.elementwise_efficiency``) at its class's. A GEMM with ``bytes`` set moves those
    in its memory roofline instead of its operands' (an implicit-GEMM convolution)."""
    bw = dev.pass_Bps(k.variant) if k.variant else dev.memory_Bps
    if k.kind == "memory":      # an FP8 cast pass may name its slower kernel (.fp8recipe)
        return k.bytes / (bw * fp8_pass_efficiency(k.variant) if k.variant else bw)
    peak = dev.peak_flops(k.dtype)
    if k.kind == "flash":
        return max(k.flops / (peak * dev.flash(k.variant, k.dtype, k.shape, k.batch)),
                   k.bytes / bw)
    M, N, K = k.shape
    if efficiency is not None:
        return max(2.0 * M * N * K * k.batch / (peak * efficiency),
                   (k.bytes or (M * K + K * N + M * N) * k.batch * DTYPE_BYTES.get(k.dtype, 2))
                   / bw)
    ceiling, b, epilogue = _gemm_setting(k.dtype, k.variant, k.accumulate_bytes, dev)
    t = gemm_time(M, N, K, k.batch, b, peak, ceiling, dev.sm_count, bw, dev.gemm_overhead,
                  k.bytes or None, epilogue)  # bytes: a GEMM's own
    return _power_capped(t, M, N, K, k.batch, peak, dev.sustained_rate(k.dtype))


def _gemm_setting(dtype: str, variant: str, accumulate_bytes: float, dev: KernelDevice
                  ) -> tuple[float, float, float]:
    """(matmul ceiling, bytes per element, epilogue bytes per output element) of a GEMM
    kernel of ``dtype``, ``variant`` and accumulation on ``dev`` (:func:`kernel_time`)."""
    ceiling = dev.ceiling(dtype)
    if variant:       # an FP8 recipe's GEMM kernel (.fp8recipe: its share of the ceiling)
        ceiling *= fp8_gemm_efficiency(variant)
    b = DTYPE_BYTES.get(dtype, 2)
    epilogue = (epilogue_increment_bytes(b, accumulate_bytes)
                if dev.gemm_epilogue_serialized else 0.0)
    return ceiling, b, epilogue


def _power_capped(t: float, M: float, N: float, K: float, batch: float, peak: float,
                  rate: float | None) -> float:
    """A GEMM's seconds ``t`` no shorter than its FLOPs at the power limit's sustained
    ``rate`` (fraction of ``peak``; None: no such cap) (.power)."""
    return t if rate is None else max(t, 2.0 * M * N * K * batch / (peak * rate))


def kernel_times(kernels: Sequence[Kernel], dev: KernelDevice) -> list[float]:
    """:func:`kernel_time` of each of ``kernels`` (no calibration profile), the GEMMs of one
    dtype, variant and accumulation (moving their operands' bytes, or bytes of their own)
    timed in one array call of :func:`~.gemm.gemm_time`, whose arithmetic is element by
    element: each the float :func:`kernel_time` gives (``tests/search/test_kernel_batch.py``),
    where each GEMM alone took a few dozen numpy operations on one value (a search grid
    times a few hundred)."""
    out: list = [None] * len(kernels)
    alike: dict[tuple, list[int]] = {}
    for i, k in enumerate(kernels):
        if k.kind == "gemm":
            alike.setdefault((k.dtype, k.variant, k.accumulate_bytes, not k.bytes),
                             []).append(i)
        else:
            out[i] = kernel_time(k, dev)
    for (dtype, variant, accumulate, operands), at in alike.items():
        peak = dev.peak_flops(dtype)
        ceiling, b, epilogue = _gemm_setting(dtype, variant, accumulate, dev)
        shapes = [kernels[i].shape for i in at]
        batch = [kernels[i].batch for i in at]
        M, N, K = (np.array(x, dtype=float) for x in zip(*shapes))
        t = gemm_time(M, N, K, np.array(batch, dtype=float), b, peak, ceiling, dev.sm_count,
                      dev.pass_Bps(variant) if variant else dev.memory_Bps, dev.gemm_overhead,
                      None if operands else np.array([kernels[i].bytes for i in at]),
                      epilogue).tolist()
        rate = dev.sustained_rate(dtype)
        for i, (rows, cols, depth), nb, ti in zip(at, shapes, batch, t):
            out[i] = _power_capped(ti, rows, cols, depth, nb, peak, rate)
    return out


def op_time(op: Compute, dev: KernelDevice,
            measured: Callable[..., float | None] | None = None,
            memo: dict | None = None, kernel_s: dict[int, float] | None = None) -> float:
    """Seconds of one compute op: its kernels one after another on the stream, or — an op
    with no kernels — one kernel timed by the roofline ``max(FLOPs / (peak · η_max),
    bytes / achieved bandwidth)`` (element-wise and optimizer ops: ``max(bytes / bandwidth,
    FLOPs / peak)``; an op with neither FLOPs nor bytes launches nothing); with their host
    and launch time, ``max(Σ kernel time + n·gap, n·host + op.host_s)``
    (:func:`.host.stream_time`).
    ``measured(flops, dtype[, shape, batch])``: a calibration profile's GEMM efficiency (of
    that very GEMM shape where the profile measured it), or None where it has none.
    ``memo``: a dict kept by a caller that times many ops on one device, so a kernel met
    again (the same GEMM in several plans) is timed once. ``kernel_s``: seconds of kernels
    the caller timed already (:func:`kernel_times`), by the kernel object's ``id`` (the caller
    keeps those kernels alive): a kernel found there is neither hashed nor timed again (a
    search grid's ops hold ~1,000 kernels, each found there ~once; hashing one by value reads
    all its fields). A contention op with a fixed SM
    margin takes its GEMMs' extra time (:mod:`.contention`); one whose time follows its
    collectives' is timed by :meth:`~ddlsim.simulator.costs.CostModel.compute`."""
    if op.contention is not None:
        if op.contention.collectives:
            raise ValueError(f"compute op {op.name!r}: its time follows its collectives' "
                             "(CostModel.compute times it)")
        from .contention import contention_seconds
        return contention_seconds(op, dev, 0)
    if op.kernels is not None:
        total = 0.0
        for k in op.kernels:
            eff = None
            if measured is not None and k.kind == "gemm":
                eff = measured(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch, k.dtype,
                               k.shape, k.batch)   # a shape the profile measured: its time
            elif kernel_s is not None:
                t = kernel_s.get(id(k))
                if t is not None:
                    total += t
                    continue
            if memo is None:
                total += kernel_time(k, dev, eff)
                continue
            t = memo.get((k, eff))
            if t is None:
                t = memo[(k, eff)] = kernel_time(k, dev, eff)
            total += t
        return stream_time(total, len(op.kernels), dev.launch, op.host_s)
    return stream_time(_roofline(op, dev, measured), 1 if op.flops or op.bytes else 0,
                       dev.launch, op.host_s)


def _roofline(op: Compute, dev: KernelDevice,
              measured: Callable[..., float | None] | None) -> float:
    """Device seconds of an op given by its FLOPs and bytes alone (:func:`op_time`)."""
    peak = dev.peak_flops(op.dtype)
    # the optimizer step at its class's measured bandwidth, where the device has one
    t_mem = op.bytes / (dev.pass_Bps("optimizer") if op.kind == "optimizer" else dev.memory_Bps)
    if op.kind in ("elementwise", "optimizer"):
        return max(t_mem, op.flops / peak)
    eff = measured(op.flops, op.dtype) if measured is not None else None
    rate = dev.sustained_rate(op.dtype)
    ceiling = dev.ceiling(op.dtype) if rate is None else min(dev.ceiling(op.dtype), rate)
    return max(op.flops / (peak * (eff or ceiling)), t_mem)

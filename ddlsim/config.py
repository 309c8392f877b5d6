"""Run configuration: *what* (model) × *how* (parallel, train) × *where* (system).

A run config is one YAML/JSON document with four sections. Each section is either a mapping
or the name of a preset (``model: gpt3-175b``); a mapping may name a preset and override some
of its fields (``system: {preset: dgx-a100, nodes: 128}``). Field names follow the sources
users already have: HuggingFace ``config.json`` for the model, Megatron-LM's arguments for the
parallel plan. Unknown keys are rejected; cross-field rules are checked with messages that name
the fields and values.

Everything inside is SI: seconds, bytes, bytes/s, FLOP/s. Strings with units
(``"200 Gb/s"``, ``"80 GiB"``, ``"2 us"``) are converted here, at the boundary.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (BeforeValidator, Field, SerializeAsAny, StrictBool, StrictStr,
                      field_validator, model_validator)

# The shared field types and the system section live in their own modules; every name stays
# importable from here.
from .config_system import (  # noqa: F401  (re-exported)
    CollectivesSpec, DeviceSpec, IntraNodeSpec, LinkSpec, NetworkSpec, SystemConfig, check_shape)
from .config_types import (  # noqa: F401  (re-exported)
    DTYPE_BYTES, Bandwidth, BucketBytes, Bytes, DeviceId, Dtype, Flops, ModelBase, Real, Seconds,
    _bounded, _quantity, _Strict, count_type, reject_bool)
from ._lazy import lazy_exports
from .errors import ConfigError, did_you_mean
from .limits import check_bound
from .software import TPCommOverlap
from .config_moe import MoESpec
from .registered import algorithms, collective_ops, registered, schedules, tensor_parallel_modes
from .registered import recompute_modules as recompute_module_names

__all__ = [
    "ModelConfig", "ModelBase", "validate_model", "ParallelConfig", "TrainConfig",
    "SystemConfig", "DeviceSpec", "LinkSpec", "NetworkSpec", "RunConfig", "load_config",
    "build_config", "apply_overrides", "DTYPE_BYTES",
    "COLLECTIVE_OPS", "ALGORITHMS", "resolve_section", "format_validation_error", "read_document",
    "Bandwidth", "Bytes", "Seconds", "Flops", "count_type", "check_shape", "reject_bool",
]


#: Names re-exported from the modules that read and validate a config (which import this
#: module), resolved by name on first use so that either module can be imported first: a
#: re-export for the callers' convenience, not a dependency of the config.
_reexported = lazy_exports(__name__, {
    **dict.fromkeys(("apply_overrides", "build_config", "format_validation_error",
                     "load_config", "read_document", "resolve_section"), "ddlsim.configload"),
    "validate_model": "ddlsim.workloads.registry"})


def __getattr__(name: str) -> Any:
    if name == "ModelConfig":  # the GPT family's schema, under its historical name
        from .workloads.registry import get_family
        return get_family("gpt").schema
    if name == "COLLECTIVE_OPS":
        return collective_ops()
    if name == "ALGORITHMS":
        return algorithms()
    return _reexported(name)


# ------------------------------------------------------------------------------------- parallel
DPStrategy = Literal["ddp", "reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter"]


class TensorParallelSpec(_Strict):
    """A tensor-parallel scheme and its grid, e.g. ``{mode: 2.5d, q: 4, d: 4}``.

    ``mode`` is a key of the layer-partitioner registry
    (:func:`ddlsim.registered.tensor_parallel_modes`: ``1d``, ``2d``, ``2.5d``,
    ``3d``); each mode says which grid fields it takes (``size`` for 1d, ``q`` for 2d and 3d,
    ``q`` and ``d`` for 2.5d) and how many ranks its grid has (docs/tensor_parallel.md).
    """

    mode: StrictStr
    size: count_type("parallel_size") | None = None
    q: count_type("parallel_size") | None = None
    d: count_type("parallel_size") | None = None

    @field_validator("mode")
    @classmethod
    def _known(cls, v: str) -> str:
        known = tensor_parallel_modes()
        if v not in known:
            raise ValueError(f"tensor_parallel.mode = {v!r} is not a tensor-parallel scheme"
                             f"{did_you_mean(v, known)}; allowed: {', '.join(known)}")
        return v

    @model_validator(mode="after")
    def _grid(self) -> "TensorParallelSpec":
        tensor_parallel_modes()[self.mode].check_grid(self)
        return self

    @property
    def grid_size(self) -> int:
        """Ranks of the grid (the size of the ``tp`` mesh axis)."""
        return tensor_parallel_modes()[self.mode].grid_size(self)


class ParallelConfig(_Strict):
    """The parallel plan, with Megatron-LM argument names."""

    tensor_model_parallel_size: count_type("parallel_size") = 1
    pipeline_model_parallel_size: count_type("parallel_size") = 1
    virtual_pipeline_model_parallel_size: count_type("layers") | None = None
    # --- uneven pipeline splits (Megatron-Core's names; workloads/decoder/split.py) ---------
    account_for_embedding_in_pipeline_split: StrictBool = Field(
        default=False, description="the input embedding counts as one layer of the pipeline "
                                   "split: the first chunk holds one transformer layer fewer")
    account_for_loss_in_pipeline_split: StrictBool = Field(
        default=False, description="the loss counts as one layer of the pipeline split: the "
                                   "last chunk holds one transformer layer fewer")
    num_layers_in_first_pipeline_stage: count_type("layers") | None = Field(
        default=None, description="layers of the first pipeline stage (the rest split evenly)")
    num_layers_in_last_pipeline_stage: count_type("layers") | None = Field(
        default=None, description="layers of the last pipeline stage (the rest split evenly)")
    layers_per_virtual_stage: list[count_type("layers")] | None = Field(
        default=None, description="transformer layers of each virtual pipeline stage, in "
                                  "stage order (PP·VPP numbers; virtual stage k on rank k mod "
                                  "PP): torchtitan's split of its model into stages")
    sequence_parallel: StrictBool = False
    expert_model_parallel_size: count_type("parallel_size") = Field(
        default=1, description="EP: experts split over this many ranks, carved out of "
                               "TP·CP·DP (Megatron-Core's MoE parallel folding)")
    expert_tensor_parallel_size: count_type("parallel_size") | None = Field(
        default=None, description="expert TP: each expert's GEMMs split over this many "
                                  "ranks; default (null): tensor_model_parallel_size, as "
                                  "Megatron-LM's arguments.py sets it")
    moe: MoESpec | None = Field(
        default=None, description="Megatron-Core's --moe-* options (docs/moe.md); unset "
                                  "fields: the software stack's")
    data_parallel_size: count_type("parallel_size") | None = Field(
        default=None, description="default: devices // (TP·PP)")
    data_parallel_replicate_size: count_type("parallel_size") = Field(
        default=1, description="HSDP (torchtitan's data_parallel_replicate_degree): the data-"
                               "parallel ranks are this many replicas of FSDP shards over "
                               "data_parallel_size / this (× CP); gradients reduce-scattered "
                               "in a shard group, then all-reduced across the replicas")
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(reject_bool)] = 0
    schedule: registered(schedules) = "1f1b"
    dp_strategy: DPStrategy = "ddp"
    # --- overlap options (Megatron-Core's names); unset: the software stack's value -------
    overlap_grad_reduce: StrictBool | None = Field(
        default=None, description="gradient reduction during the backward; default: "
                                  "system.software's")
    overlap_param_gather: StrictBool | None = Field(
        default=None, description="ZeRO/distributed-optimizer parameter all-gathers during "
                                  "the forward; default: system.software's")
    tp_comm_overlap: TPCommOverlap | None = Field(
        default=None, description="TP communication hidden behind GEMMs (bulk/pipelined: TE "
                                  "userbuffers; torch_async: PyTorch's micro-pipelined TP); "
                                  "default: system.software's")
    overlap_p2p_comm: StrictBool | None = Field(
        default=None, description="pipeline sends/receives overlapped with compute; default: "
                                  "system.software's")
    grad_bucket_size: BucketBytes = Field(default=25 * 2**20,
                                    description="PyTorch DDP's default bucket_cap_mb=25")
    collective_algorithm: dict[str, str] = Field(default_factory=dict,
                                                 description="op → algorithm, or 'auto'")
    rank_order: StrictStr = Field(
        default="tp-cp-ep-dp-pp",
        description="mesh axes innermost first (Megatron-Core's initialize_model_parallel "
                    "`order`); ranks are placed on devices in rank order")
    # --- tensor-parallel schemes and context parallelism (docs/tensor_parallel.md) ---------
    # `tensor_parallel` names a layer partitioner and its grid; its size is the tp axis and
    # fills in tensor_model_parallel_size (which alone still means Megatron's 1-D scheme).
    # `context_parallel_size` splits the sequence over the cp axis; `cp_comm_type` is how
    # attention exchanges K/V (Megatron-Core's names: p2p = ring attention, all_gather).
    tensor_parallel: TensorParallelSpec | None = Field(
        default=None, description="scheme and grid, e.g. {mode: 2.5d, q: 4, d: 4}")
    context_parallel_size: count_type("parallel_size") = Field(
        default=1, description="CP: the sequence split over this many ranks (Megatron-LM)")
    cp_comm_type: Literal["p2p", "all_gather"] = Field(
        default="p2p", description="CP's K/V exchange: ring (p2p) or all-gather (Megatron-Core)")

    @model_validator(mode="after")
    def _check(self) -> "ParallelConfig":
        self._resolve_tensor_parallel()
        ALGORITHMS = algorithms() if self.collective_algorithm else {}  # built per call: skip
        for op, algo in self.collective_algorithm.items():
            if op not in ALGORITHMS:
                raise ValueError(f"collective_algorithm has unknown collective {op!r}"
                                 f"{did_you_mean(op, ALGORITHMS)}; allowed: {', '.join(ALGORITHMS)}")
            if algo != "auto" and algo not in ALGORITHMS[op]:
                raise ValueError(f"collective_algorithm.{op} = {algo!r} is not an algorithm for "
                                 f"{op}{did_you_mean(algo, ALGORITHMS[op])}; allowed: auto, "
                                 f"{', '.join(ALGORITHMS[op])}")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("sequence_parallel = true needs tensor_model_parallel_size > 1 "
                             "(got 1): sequence parallelism splits activations across the TP group")
        vpp = self.virtual_pipeline_model_parallel_size
        if self.schedule == "interleaved":
            if vpp is None or vpp < 2:
                raise ValueError(f"schedule = 'interleaved' needs "
                                 f"virtual_pipeline_model_parallel_size >= 2 (got {vpp})")
            if self.pipeline_model_parallel_size < 2:
                raise ValueError("schedule = 'interleaved' needs pipeline_model_parallel_size >= 2 "
                                 f"(got {self.pipeline_model_parallel_size})")
        elif vpp not in (None, 1):
            raise ValueError(f"virtual_pipeline_model_parallel_size = {vpp} needs schedule = "
                             f"'interleaved' (got {self.schedule!r})")
        # ZeRO-3 with pipelining: the stacks that cannot run it say so in their rules
        # (software.yaml: pipeline_zero, zero3_pipeline); torchtitan runs FSDP in its stages
        if self.dp_strategy != "ddp" and self.zero_stage != 0:
            raise ValueError(f"dp_strategy = {self.dp_strategy!r} is a plain data-parallel update "
                             f"and cannot combine with zero_stage = {self.zero_stage}; "
                             "use dp_strategy = 'ddp' with ZeRO")
        return self

    def _resolve_tensor_parallel(self) -> None:
        """``tensor_parallel``'s grid size becomes ``tensor_model_parallel_size`` (checked
        against it when both are given); 2-D and up partition activations themselves, so
        sequence parallelism (a 1-D device) does not apply to them."""
        spec = self.tensor_parallel
        if spec is None:
            return
        n = spec.grid_size
        given = self.tensor_model_parallel_size
        if "tensor_model_parallel_size" in self.model_fields_set and given != n:
            raise ValueError(f"tensor_model_parallel_size = {given} contradicts tensor_parallel "
                             f"= {spec.model_dump(exclude_none=True)}, whose grid has {n} ranks; "
                             "give one of them, or the same size in both")
        if spec.mode != "1d" and self.sequence_parallel:
            raise ValueError(f"sequence_parallel = true applies to the 1-D (Megatron) scheme "
                             f"only; tensor_parallel.mode = {spec.mode!r} already splits every "
                             "activation over its grid; remove sequence_parallel")
        object.__setattr__(self, "tensor_model_parallel_size", n)  # still inside validation

    @property
    def tp_mode(self) -> str:
        """The tensor-parallel scheme: ``1d`` (Megatron) unless ``tensor_parallel`` says."""
        return "1d" if self.tensor_parallel is None else self.tensor_parallel.mode

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """Expert tensor-parallel size: ``expert_tensor_parallel_size``, or TP when unset
        (Megatron-LM 9c1a5351 megatron/training/arguments.py lines 403-404)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1


# ---------------------------------------------------------------------------------------- train
class TrainConfig(_Strict):
    """What one iteration processes."""

    micro_batch_size: count_type("micro_batch_size")
    global_batch_size: count_type("global_batch_size")
    seq_length: count_type("seq_length")
    dtype: Dtype = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_every_n_layers: count_type("layers") = Field(
        default=1, description="with recompute: full, only every n-th transformer layer of a "
                               "rank is checkpointed (torchtitan's selective_ac_option = 'n': "
                               "the rank's n-th, 2n-th, … layer); 1: every layer")
    recompute_modules: tuple[registered(recompute_module_names), ...] | None = Field(
        default=None, description="with recompute: selective, Megatron-Core's "
                                  "--recompute-modules (core_attn, layernorm, moe_act, …: "
                                  "ddlsim/workloads/decoder/recompute_modules.py); unset: the "
                                  "stack's selective recomputation")
    optimizer: Literal["adam", "sgd"] = "adam"

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        mods = self.recompute_modules
        if mods is not None and (self.recompute != "selective" or not mods
                                 or len(set(mods)) != len(mods)):
            raise ValueError(f"recompute_modules = {list(mods)!r} names the modules of "
                             "Megatron-Core's selective recomputation: it needs recompute = "
                             f"'selective' (got {self.recompute!r}) and a non-empty list "
                             f"without repeats of {', '.join(recompute_module_names())}")
        n = self.recompute_every_n_layers
        if n != 1 and self.recompute != "full":
            raise ValueError(f"recompute_every_n_layers = {n} checkpoints one layer in {n} "
                             f"fully and needs recompute = 'full' (got {self.recompute!r}); "
                             "set recompute: full, or recompute_every_n_layers: 1")
        return self


# ------------------------------------------------------------------------------------------ run
#: :attr:`RunConfig.software`'s and :attr:`RunConfig.mesh`'s caches (:func:`_by_identity`)
_SOFTWARE: dict[tuple[int, ...], tuple] = {}
_MESHES: dict[tuple[int, ...], tuple] = {}
_CACHE_SIZE = 256


def _by_identity(cache: dict, frozen: tuple, make: Any) -> Any:
    """``make()``, cached in ``cache`` by the ids of the ``frozen`` objects it derives from,
    kept alive in the entry (so that no other object can take their ids while it is there);
    the oldest entries leave first past ``_CACHE_SIZE``."""
    key = tuple(map(id, frozen))
    hit = cache.get(key)
    if hit is None:
        hit = (frozen, make())
        cache[key] = hit
        if len(cache) > _CACHE_SIZE:
            del cache[next(iter(cache))]
    return hit[1]


class RunConfig(_Strict):
    """model × parallel × train × system, checked together."""

    model: SerializeAsAny[ModelBase]
    parallel: ParallelConfig = ParallelConfig()
    train: TrainConfig
    system: SystemConfig

    @property
    def dp(self) -> int:
        assert self.parallel.data_parallel_size is not None  # set by the validator below
        return self.parallel.data_parallel_size

    @property
    def mesh(self) -> Any:
        """The plan as a :class:`~ddlsim.workloads.mesh.DeviceMesh` in ``parallel.rank_order``
        (Megatron-LM's by default). Built once per (frozen) ``parallel`` object, which holds
        every field it reads: the search builds a config per plan signature, and the stage
        builder's plan, the validation and the memory each ask for it."""
        return _by_identity(_MESHES, (self.parallel,), self._build_mesh)

    def _build_mesh(self) -> Any:
        from .workloads.mesh import DeviceMesh
        p = self.parallel
        return DeviceMesh.from_megatron(
            tensor_model_parallel_size=p.tp, context_parallel_size=p.cp,
            pipeline_model_parallel_size=p.pp, data_parallel_size=self.dp,
            expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.etp,
            order=p.rank_order)

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def software(self) -> Any:
        """The resolved :class:`~ddlsim.software.Software`: ``system.software``'s stack, its
        overrides, then the plan's overlap options. Resolved once per pair of (frozen)
        ``system`` and ``parallel`` objects: a copy with either replaced resolves again."""
        return _by_identity(_SOFTWARE, (self.system, self.parallel), self._resolve_software)

    def _resolve_software(self) -> Any:
        from .software import resolve_software
        return resolve_software(self.system.software, self.parallel)

    @property
    def num_microbatches(self) -> int:
        return self.train.global_batch_size // (self.train.micro_batch_size * self.dp)

    @property
    def family(self) -> Any:
        """The :class:`~ddlsim.workloads.registry.WorkloadFamily` of ``model.architecture``."""
        from .workloads.registry import get_family
        return get_family(self.model.architecture)

    @field_validator("model", mode="before")
    @classmethod
    def _dispatch(cls, value: Any) -> Any:
        from .workloads.registry import validate_model
        try:
            return validate_model(value)
        except ConfigError as exc:  # pydantic reports ValueErrors only
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        p, t, s = self.parallel, self.train, self.system
        tp, pp, cp = p.tp, p.pp, p.cp
        devices = s.num_devices
        from .workloads.registry import check_plan_fields
        check_plan_fields(self, self.family)  # a plan field the family never reads is an error
        self.family.check(self)  # the rules that involve the model (heads, layers, positions)
        if p.data_parallel_size is None:
            if devices % (tp * cp * pp):
                cp_s = ("" if cp == 1 else " × context_parallel_size")
                cp_v = ("" if cp == 1 else f" × {cp}")
                raise ValueError(f"cannot derive data_parallel_size: the system's {devices} devices "
                                 f"are not a multiple of tensor_model_parallel_size{cp_s} × "
                                 f"pipeline_model_parallel_size = {tp}{cp_v} × {pp} = "
                                 f"{tp * cp * pp}; set parallel.data_parallel_size")
            p = p.model_copy(update={"data_parallel_size": devices // (tp * cp * pp)})
            object.__setattr__(self, "parallel", p)  # still inside validation: self is new
        dp = self.dp
        try:
            self.mesh  # the rank order must name the plan's axes (DeviceMesh's messages)
        except ConfigError as exc:
            raise ValueError(f"parallel.rank_order = {p.rank_order!r}: {exc}") from None
        ranks = tp * cp * pp * dp
        if ranks > devices:
            axes = (f"TP·PP·DP = {tp}·{pp}·{dp}" if cp == 1
                    else f"TP·CP·PP·DP = {tp}·{cp}·{pp}·{dp}")
            raise ValueError(f"the plan needs {axes} = {ranks} ranks but the "
                             f"system '{s.name}' has {s.nodes} nodes × {s.devices_per_node} = "
                             f"{devices} devices")
        if isinstance(s.placement, list) and len(s.placement) != ranks:
            raise ValueError(f"system.placement lists {len(s.placement)} devices but the plan "
                             f"has {ranks} ranks")
        if t.global_batch_size % (t.micro_batch_size * dp):
            raise ValueError(f"train.global_batch_size = {t.global_batch_size} is not divisible by "
                             f"train.micro_batch_size × data_parallel_size = "
                             f"{t.micro_batch_size} × {dp} = {t.micro_batch_size * dp}")
        mb = t.global_batch_size // (t.micro_batch_size * dp)
        try:
            check_bound(mb, "microbatches")
        except ValueError as exc:
            raise ValueError(f"the number of micro-batches, global_batch_size / (micro_batch_size "
                             f"· DP) = {t.global_batch_size} / ({t.micro_batch_size} · {dp}): "
                             f"{exc}") from None
        if p.schedule == "interleaved" and mb % pp:
            raise ValueError(f"schedule = 'interleaved' needs the number of micro-batches "
                             f"(global_batch_size / (micro_batch_size · DP) = {mb}) to be a "
                             f"multiple of pipeline_model_parallel_size = {pp}")
        if t.dtype not in s.device.peak_flops:
            raise ValueError(f"train.dtype = {t.dtype!r} has no peak FLOP/s on device "
                             f"'{s.device.name}'; it lists {', '.join(s.device.peak_flops)}")
        from .stackrules import check_stack_rules
        check_stack_rules(self)  # what the software stack cannot run (system.software.what_if)
        return self


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

import importlib
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

# The shared field types and the system and parallel sections live in their own modules;
# every name stays importable from here.
from .config_system import (  # noqa: F401  (re-exported)
    CollectivesSpec, DeviceSpec, IntraNodeSpec, LinkSpec, NetworkSpec, SystemConfig, check_shape)
from .config_types import (  # noqa: F401  (re-exported)
    DTYPE_BYTES, Bandwidth, BucketBytes, Bytes, DeviceId, Dtype, Flops, ModelBase, Real, Seconds,
    _bounded, _quantity, _Strict, count_type, reject_bool)
from ._lazy import lazy_exports
from .errors import ConfigError
from .limits import check_bound
from .config_parallel import (  # noqa: F401  (re-exported)
    DPStrategy, ParallelConfig, TensorParallelSpec)
from .registered import algorithms, collective_ops, registered
from .registered import recompute_modules as recompute_module_names
from .config_system import progress_stall
from .software import plan_defaults, resolve_software

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
        return _workloads("registry").get_family("gpt").schema
    if name == "COLLECTIVE_OPS":
        return collective_ops()
    if name == "ALGORITHMS":
        return algorithms()
    return _reexported(name)


# ---------------------------------------------------------------------------------------- train
class TrainConfig(_Strict):
    """What one iteration processes."""

    micro_batch_size: count_type("micro_batch_size")
    global_batch_size: count_type("global_batch_size")
    seq_length: count_type("seq_length") | None = Field(
        default=None, description="tokens per sample; unset: the model family's (1 where a "
        "sample is an image, a volume or a row of features); a sequence model needs it")
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
@lru_cache(maxsize=None)
def _workloads(module: str) -> Any:
    """The module ``ddlsim.workloads.<module>`` (``registry``, ``schedules``), imported on
    first use (the config imports no workload at module level), then found by one cached
    call rather than an import statement each time: a validation looks the registry up five
    times, and a cold search grid validates ~50 configs and resolves ~80 plans."""
    return importlib.import_module(f"{__package__}.workloads.{module}")


#: :attr:`RunConfig.software`'s and :attr:`RunConfig.mesh`'s caches (:func:`_by_identity`)
_SOFTWARE: dict[tuple[int, ...], tuple] = {}
_MESHES: dict[tuple[int, ...], tuple] = {}
_CACHE_SIZE = 256


@lru_cache(maxsize=_CACHE_SIZE)
def _mesh_of(tp: int, cp: int, pp: int, dp: int, ep: int, etp: int, order: str) -> Any:
    """The :class:`~ddlsim.workloads.mesh.DeviceMesh` (frozen) of these sizes and rank
    order, built once per distinct plan: the search's probes build many configs of a few
    meshes. A mesh that fails raises its ConfigError anew on every call (no cache)."""
    from .workloads.mesh import DeviceMesh
    return DeviceMesh.from_megatron(
        tensor_model_parallel_size=tp, context_parallel_size=cp,
        pipeline_model_parallel_size=pp, data_parallel_size=dp,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, order=order)


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
        p = self.parallel
        return _mesh_of(p.tp, p.cp, p.pp, self.dp, p.ep, p.etp, p.rank_order)

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def software(self) -> Any:
        """The resolved :class:`~ddlsim.software.Software`: ``system.software``'s stack, its
        overrides, then the plan's overlap options. Resolved once per pair of (frozen)
        ``system`` and ``parallel`` objects: a copy with either replaced resolves again."""
        # a hit found without building _by_identity's key and bound method (read ~2,200
        # times a cold search grid: the stage builder's rules each ask it)
        hit = _SOFTWARE.get((id(self.system), id(self.parallel)))
        if hit is not None:
            return hit[1]
        return _by_identity(_SOFTWARE, (self.system, self.parallel), self._resolve_software)

    def _resolve_software(self) -> Any:
        return resolve_software(self.system.software, self.parallel,
                                progress_stall(self.system.collectives))

    @property
    def num_microbatches(self) -> int:
        return self.train.global_batch_size // (self.train.micro_batch_size * self.dp)

    @property
    def family(self) -> Any:
        """The :class:`~ddlsim.workloads.registry.WorkloadFamily` of ``model.architecture``."""
        return _workloads("registry").get_family(self.model.architecture)

    @field_validator("model", mode="before")
    @classmethod
    def _dispatch(cls, value: Any) -> Any:
        try:
            return _workloads("registry").validate_model(value)
        except ConfigError as exc:  # pydantic reports ValueErrors only
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        self._train_from_model()
        self._plan_from_model()
        # a plan field the family never reads is an error
        _workloads("registry").check_plan_fields(self, self.family)
        self.family.check(self)  # the rules that involve the model (heads, layers, positions)
        self._derive_dp()
        self._check_ranks()
        self._check_batches()
        t, s = self.train, self.system
        if t.dtype not in s.device.peak_flops:
            raise ValueError(f"train.dtype = {t.dtype!r} has no peak FLOP/s on device "
                             f"'{s.device.name}'; it lists {', '.join(s.device.peak_flops)}")
        self._plan_from_stack()
        from .stackrules import check_stack_rules
        check_stack_rules(self)  # what the software stack cannot run (system.software.what_if)
        return self

    def _plan_from_stack(self) -> None:
        """The plan fields ``parallel`` leaves unset that the stack's runs have, the config
        validated again with them where any is set (their own rules, the family's):

        * ``zero_stage``, the stack's ``plan`` default in software.yaml (torchtitan's data
          parallelism is FSDP2 unless the run says otherwise: 3), where data-parallel × CP
          ranks are more than one (nothing to shard otherwise) and ``dp_strategy`` is
          ``ddp`` (the seed's updates shard nothing);
        * ``sequence_parallel``: on where TP > 1 and the stack's rules refuse TP without it,
          the one plan its framework runs (torchtitan's TP is always sequence-parallel, rule
          ``tp_needs_sp``; Megatron-Core's MoE layers raise without it,
          ``moe_tp_needs_sp``); off otherwise, Megatron-LM's default.

        A plan that sets a field keeps its value (a false SP under such a stack is
        refused)."""
        p = self.parallel
        update = {}
        zero = plan_defaults(self.software.name).get("zero_stage")
        if (zero is not None and "zero_stage" not in p.model_fields_set
                and p.dp_strategy == "ddp" and self.dp * p.cp > 1):
            update["zero_stage"] = zero
            p = p.model_validate({**p.model_dump(exclude_unset=True),
                                  "data_parallel_size": self.dp, **update})
            object.__setattr__(self, "parallel", p)
        if not (p.sequence_parallel or p.tp == 1 or p.tp_mode != "1d"
                or "sequence_parallel" in p.model_fields_set):
            from .stackrules import sp_rules
            if sp_rules(self):
                update["sequence_parallel"] = True
                object.__setattr__(self, "parallel",
                                   p.model_copy(update={"sequence_parallel": True}))
        if update:
            self.family.check(self)   # its rules of the fields set (the sequence over TP, …)

    def _train_from_model(self) -> None:
        """``train.seq_length`` where the config leaves it out: the family's sample length
        (1 for an image, a volume or a row), or refused for a sequence model."""
        if self.train.seq_length is not None:
            return
        length = self.family.sample_length
        if length is None:
            raise ValueError(f"train.seq_length: Field required: a {self.model.architecture} "
                             "model's samples are sequences; give their length in tokens")
        object.__setattr__(self, "train", self.train.model_copy(update={"seq_length": length}))

    def _plan_from_model(self) -> None:
        """The plan fields the model section determines (``family.plan_from_model``, e.g.
        CosmoFlow's spatial group from its grid), where ``parallel`` leaves them unset."""
        p = self.parallel
        unset = {k: v for k, v in self.family.plan_from_model(self.model).items()
                 if k not in p.model_fields_set}
        if unset:
            p = p.model_copy(update=unset)
            object.__setattr__(self, "parallel", p)  # still inside validation: self is new

    def _derive_dp(self) -> None:
        """Unset ``parallel.data_parallel_size``: the devices left by TP × CP × PP."""
        p, devices = self.parallel, self.system.num_devices
        if p.data_parallel_size is not None:
            return
        tp, pp, cp = p.tp, p.pp, p.cp
        if devices % (tp * cp * pp):
            cp_s = ("" if cp == 1 else " × context_parallel_size")
            cp_v = ("" if cp == 1 else f" × {cp}")
            raise ValueError(f"cannot derive data_parallel_size: the system's {devices} devices "
                             f"are not a multiple of tensor_model_parallel_size{cp_s} × "
                             f"pipeline_model_parallel_size = {tp}{cp_v} × {pp} = "
                             f"{tp * cp * pp}; set parallel.data_parallel_size")
        p = p.model_copy(update={"data_parallel_size": devices // (tp * cp * pp)})
        object.__setattr__(self, "parallel", p)  # still inside validation: self is new

    def _check_ranks(self) -> None:
        """The rank order names the plan's axes; the plan's ranks fit the system (and its
        placement lists one device per rank)."""
        p, s = self.parallel, self.system
        tp, pp, cp, dp = p.tp, p.pp, p.cp, self.dp
        try:
            self.mesh  # the rank order must name the plan's axes (DeviceMesh's messages)
        except ConfigError as exc:
            raise ValueError(f"parallel.rank_order = {p.rank_order!r}: {exc}") from None
        ranks = tp * cp * pp * dp
        if ranks > s.num_devices:
            axes = (f"TP·PP·DP = {tp}·{pp}·{dp}" if cp == 1
                    else f"TP·CP·PP·DP = {tp}·{cp}·{pp}·{dp}")
            raise ValueError(f"the plan needs {axes} = {ranks} ranks but the "
                             f"system '{s.name}' has {s.nodes} nodes × {s.devices_per_node} = "
                             f"{s.num_devices} devices")
        if isinstance(s.placement, list) and len(s.placement) != ranks:
            raise ValueError(f"system.placement lists {len(s.placement)} devices but the plan "
                             f"has {ranks} ranks")

    def _check_batches(self) -> None:
        """The global batch splits into whole micro-batches per DP rank, within the bound,
        and, under the interleaved schedule, into the groups the stack runs
        (:func:`~ddlsim.workloads.schedules.group_refusal`)."""
        p, t, dp = self.parallel, self.train, self.dp
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
        if p.schedule == "interleaved":   # the stack's grouping (workloads/schedules.py)
            from .workloads.schedules import group_refusal
            why = group_refusal(self.software.interleaved_groups, p.pp, mb,
                                p.microbatch_group_size_per_vp_stage)
            if why is not None:
                raise ValueError(f"{why}; the micro-batches are global_batch_size / "
                                 f"(micro_batch_size · DP) = {t.global_batch_size} / "
                                 f"({t.micro_batch_size} · {dp})")

    @property
    def microbatch_group(self) -> int:
        """Micro-batches per group of the interleaved schedule: the plan's
        ``microbatch_group_size_per_vp_stage``, else the stack's rule
        (:func:`~ddlsim.workloads.schedules.microbatch_group`)."""
        p = self.parallel
        return _workloads("schedules").microbatch_group(
            self.software.interleaved_groups, p.pp, self.num_microbatches,
            p.microbatch_group_size_per_vp_stage)

    @property
    def other_microbatch_group(self) -> int | None:
        """The interleaved schedule's :attr:`microbatch_group` where it is not PP (Megatron's),
        which the plan line and the JSON result name; None otherwise."""
        p = self.parallel
        if p.schedule != "interleaved" or self.microbatch_group == p.pp:
            return None
        return self.microbatch_group


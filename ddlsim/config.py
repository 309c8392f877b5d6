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

import copy
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from . import units
from .errors import ConfigError

__all__ = [
    "ModelConfig", "ParallelConfig", "TrainConfig", "SystemConfig", "DeviceSpec", "LinkSpec",
    "NetworkSpec", "RunConfig", "load_config", "build_config", "apply_overrides", "DTYPE_BYTES",
    "COLLECTIVE_OPS", "ALGORITHMS", "resolve_section", "format_validation_error", "read_document",
    "Bandwidth", "Bytes", "Seconds", "Flops",
]

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

COLLECTIVE_OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                  "all_to_all", "gather", "scatter", "barrier")
#: Algorithms the engines know, per collective (``auto`` picks the cheapest).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "double_binary_tree", "recursive_doubling", "rabenseifner",
                   "hierarchical"),
    "reduce": ("binomial", "ring", "direct"),
    "broadcast": ("binomial", "ring", "direct", "scatter_allgather"),
    "all_gather": ("ring", "recursive_doubling", "hierarchical"),
    "reduce_scatter": ("ring", "recursive_halving", "hierarchical"),
    "all_to_all": ("pairwise", "direct"),
    "gather": ("binomial", "direct"),
    "scatter": ("binomial", "direct"),
    "barrier": ("dissemination",),
}


def _unit(kind: str):
    def parse(v: Any) -> Any:
        if v is None:
            return v
        try:
            return units.parse_quantity(v, kind)
        except units.UnitError as exc:
            raise ValueError(str(exc)) from None
    return BeforeValidator(parse)


Bytes = Annotated[float, _unit("bytes"), Field(gt=0)]
Bandwidth = Annotated[float, _unit("bandwidth"), Field(gt=0)]
Seconds = Annotated[float, _unit("time"), Field(ge=0)]
Flops = Annotated[float, _unit("flops"), Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# ---------------------------------------------------------------------------------------- model
class ModelConfig(_Strict):
    """A transformer (or, later, another architecture) with HuggingFace ``config.json`` names."""

    name: str = "custom"
    architecture: Literal["gpt"] = "gpt"
    num_hidden_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    intermediate_size: int | None = Field(default=None, gt=0, description="default 4·hidden_size")
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = True
    source: str | None = None

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size


# ------------------------------------------------------------------------------------- parallel
DPStrategy = Literal["ddp", "reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter"]


class ParallelConfig(_Strict):
    """The parallel plan, with Megatron-LM argument names."""

    tensor_model_parallel_size: int = Field(default=1, gt=0)
    pipeline_model_parallel_size: int = Field(default=1, gt=0)
    virtual_pipeline_model_parallel_size: int | None = Field(default=None, gt=0)
    sequence_parallel: bool = False
    data_parallel_size: int | None = Field(default=None, gt=0,
                                           description="default: devices // (TP·PP)")
    zero_stage: Literal[0, 1, 2, 3] = 0
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    dp_strategy: DPStrategy = "ddp"
    overlap_grad_reduce: bool = True
    grad_bucket_size: Bytes = Field(default=25 * 2**20,
                                    description="PyTorch DDP's default bucket_cap_mb=25")
    collective_algorithm: dict[str, str] = Field(default_factory=dict,
                                                 description="op → algorithm, or 'auto'")

    @model_validator(mode="after")
    def _check(self) -> "ParallelConfig":
        for op, algo in self.collective_algorithm.items():
            if op not in ALGORITHMS:
                raise ValueError(f"collective_algorithm has unknown collective {op!r}; "
                                 f"allowed: {', '.join(ALGORITHMS)}")
            if algo != "auto" and algo not in ALGORITHMS[op]:
                raise ValueError(f"collective_algorithm.{op} = {algo!r} is not an algorithm for "
                                 f"{op}; allowed: auto, {', '.join(ALGORITHMS[op])}")
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
        if self.zero_stage == 3 and self.pipeline_model_parallel_size > 1:
            raise ValueError(f"zero_stage = 3 cannot combine with pipeline_model_parallel_size = "
                             f"{self.pipeline_model_parallel_size}: ZeRO-3 gathers every layer's "
                             "parameters per micro-batch and is not used with pipelining "
                             "(DeepSpeed's pipeline engine supports ZeRO-1 only); use zero_stage "
                             "<= 2, or pipeline_model_parallel_size = 1")
        if self.dp_strategy != "ddp" and self.zero_stage != 0:
            raise ValueError(f"dp_strategy = {self.dp_strategy!r} is a plain data-parallel update "
                             f"and cannot combine with zero_stage = {self.zero_stage}; "
                             "use dp_strategy = 'ddp' with ZeRO")
        return self

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1


# ---------------------------------------------------------------------------------------- train
class TrainConfig(_Strict):
    """What one iteration processes."""

    micro_batch_size: int = Field(gt=0)
    global_batch_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    dtype: Dtype = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    optimizer: Literal["adam", "sgd"] = "adam"


# --------------------------------------------------------------------------------------- system
class DeviceSpec(_Strict):
    """One accelerator (or CPU socket acting as one rank)."""

    name: str
    peak_flops: dict[str, Flops] = Field(description="dtype → dense peak FLOP/s")
    memory_bytes: Bytes
    memory_bandwidth_Bps: Bandwidth
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "DeviceSpec":
        bad = [k for k in self.peak_flops if k not in DTYPE_BYTES]
        if bad:
            raise ValueError(f"peak_flops has unknown dtype {bad[0]!r}; allowed: "
                             f"{', '.join(DTYPE_BYTES)}")
        return self


class LinkSpec(_Strict):
    """A point-to-point link, one direction: bandwidth and per-message latency."""

    bandwidth_Bps: Bandwidth
    latency_s: Seconds = 0.0
    source: str | None = None


class IntraNodeSpec(LinkSpec):
    """How devices of one node talk: NVSwitch (full bandwidth to any peer), NVLink ring, PCIe
    or shared memory. ``bandwidth_Bps`` is per device per direction."""

    kind: Literal["nvswitch", "nvlink_ring", "nvlink_mesh", "pcie", "shared_memory"] = "nvswitch"


class NetworkSpec(_Strict):
    """The fabric between nodes."""

    topology: Literal["single_switch", "fat_tree", "rail_optimized", "torus", "dragonfly"] = "fat_tree"
    oversubscription: float = Field(default=1.0, ge=1.0)
    switch_latency_s: Seconds = 0.0
    nodes_per_leaf: int | None = Field(default=None, gt=0)
    torus_dims: tuple[int, ...] | None = None
    source: str | None = None


class SystemConfig(_Strict):
    """A cluster: ``nodes`` × ``devices_per_node`` devices, NICs and a fabric."""

    name: str = "custom"
    nodes: int = Field(gt=0)
    devices_per_node: int = Field(gt=0)
    device: DeviceSpec
    intra_node: IntraNodeSpec
    nics_per_node: int = Field(default=1, gt=0)
    nic: LinkSpec
    network: NetworkSpec = NetworkSpec()
    compute_efficiency: float = Field(default=0.75, gt=0, le=1,
                                      description="achieved / peak FLOP/s of large GEMMs")
    placement: Literal["consecutive", "round_robin"] | list[int] = "consecutive"
    source: str | None = None

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @model_validator(mode="after")
    def _check(self) -> "SystemConfig":
        if self.devices_per_node % self.nics_per_node and self.nics_per_node % self.devices_per_node:
            raise ValueError(f"nics_per_node = {self.nics_per_node} must divide or be a multiple "
                             f"of devices_per_node = {self.devices_per_node}")
        if isinstance(self.placement, list):
            n = self.num_devices
            bad = [d for d in self.placement if not 0 <= d < n]
            if bad:
                raise ValueError(f"placement names device {bad[0]}, but the system has devices "
                                 f"0..{n - 1}")
            if len(set(self.placement)) != len(self.placement):
                raise ValueError("placement lists a device twice; each rank needs its own device")
        return self


# ------------------------------------------------------------------------------------------ run
class RunConfig(_Strict):
    """model × parallel × train × system, checked together."""

    model: ModelConfig
    parallel: ParallelConfig = ParallelConfig()
    train: TrainConfig
    system: SystemConfig

    @property
    def dp(self) -> int:
        assert self.parallel.data_parallel_size is not None  # set by the validator below
        return self.parallel.data_parallel_size

    @property
    def world_size(self) -> int:
        return self.parallel.tp * self.parallel.pp * self.dp

    @property
    def num_microbatches(self) -> int:
        return self.train.global_batch_size // (self.train.micro_batch_size * self.dp)

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        m, p, t, s = self.model, self.parallel, self.train, self.system
        tp, pp, vpp = p.tp, p.pp, p.vpp
        devices = s.num_devices
        if m.num_attention_heads % tp:
            raise ValueError(f"model.num_attention_heads = {m.num_attention_heads} is not divisible "
                             f"by parallel.tensor_model_parallel_size = {tp}")
        if m.ffn_size % tp:
            raise ValueError(f"model.intermediate_size = {m.ffn_size} is not divisible by "
                             f"parallel.tensor_model_parallel_size = {tp}")
        if m.num_hidden_layers % (pp * vpp):
            raise ValueError(f"model.num_hidden_layers = {m.num_hidden_layers} is not divisible by "
                             f"pipeline_model_parallel_size × virtual_pipeline_model_parallel_size "
                             f"= {pp} × {vpp} = {pp * vpp}")
        if p.data_parallel_size is None:
            if devices % (tp * pp):
                raise ValueError(f"cannot derive data_parallel_size: the system's {devices} devices "
                                 f"are not a multiple of tensor_model_parallel_size × "
                                 f"pipeline_model_parallel_size = {tp} × {pp} = {tp * pp}; "
                                 "set parallel.data_parallel_size")
            p = p.model_copy(update={"data_parallel_size": devices // (tp * pp)})
            object.__setattr__(self, "parallel", p)  # still inside validation: self is new
        dp = self.dp
        ranks = tp * pp * dp
        if ranks > devices:
            raise ValueError(f"the plan needs TP·PP·DP = {tp}·{pp}·{dp} = {ranks} ranks but the "
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
        if p.schedule == "interleaved" and mb % pp:
            raise ValueError(f"schedule = 'interleaved' needs the number of micro-batches "
                             f"(global_batch_size / (micro_batch_size · DP) = {mb}) to be a "
                             f"multiple of pipeline_model_parallel_size = {pp}")
        if t.seq_length > m.max_position_embeddings:
            raise ValueError(f"train.seq_length = {t.seq_length} exceeds "
                             f"model.max_position_embeddings = {m.max_position_embeddings}")
        if t.dtype not in s.device.peak_flops:
            raise ValueError(f"train.dtype = {t.dtype!r} has no peak FLOP/s on device "
                             f"'{s.device.name}'; it lists {', '.join(s.device.peak_flops)}")
        if p.sequence_parallel and t.seq_length % tp:
            raise ValueError(f"sequence_parallel needs train.seq_length = {t.seq_length} divisible "
                             f"by tensor_model_parallel_size = {tp}")
        return self


# ------------------------------------------------------------------------------- loading & errors
_SECTIONS = {"model": ModelConfig, "parallel": ParallelConfig, "train": TrainConfig,
             "system": SystemConfig}


def format_validation_error(exc: ValidationError, where: str, root: Any = None) -> str:
    """One clause per problem, naming the field, the value and what is allowed. ``root`` is the
    model that ``where`` names (default: the config section of that name)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"] if x != "__root__")
        field = f"{where}.{loc}" if loc else where
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parent = ".".join([where, *[str(x) for x in err["loc"][:-1]]])
            allowed = _allowed_keys(root or _SECTIONS.get(where.split(".")[-1])
                                    or (RunConfig if where == "config" else None), err["loc"][:-1])
            msg = (f"unknown key {err['loc'][-1]!r} in {parent}"
                   + (f"; allowed keys: {', '.join(allowed)}" if allowed else ""))
            lines.append(msg)
            continue
        given = err.get("input")
        shown = "" if isinstance(given, dict) or err["type"] == "missing" else f" (got {given!r})"
        lines.append(f"{field}: {msg}{shown}")
    return "; ".join(lines)


def _allowed_keys(model: Any, loc: tuple) -> list[str]:
    for part in loc:
        if model is None or not hasattr(model, "model_fields"):
            return []
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = field.annotation
    if model is None or not hasattr(model, "model_fields"):
        return []
    return sorted(model.model_fields)


def resolve_section(name: str, value: Any) -> dict:
    """A section as a plain mapping: a preset name, a mapping, or ``{preset: …, overrides}``."""
    from .presets import get_preset  # local import: presets import config

    if isinstance(value, str):
        return _named(name, value, copy.deepcopy(get_preset(name, value)))
    if isinstance(value, BaseModel):
        return value.model_dump()
    if not isinstance(value, dict):
        raise ConfigError(f"section {name!r} must be a mapping or a preset name, got {value!r}")
    value = dict(value)
    base = value.pop("preset", None)
    if base is None:
        return value
    merged = _named(name, base, copy.deepcopy(get_preset(name, base)))
    _deep_update(merged, value)
    return merged


def _named(section: str, preset: str, data: dict) -> dict:
    """Models and systems carry their preset's name unless they set one."""
    if section in ("model", "system"):
        data.setdefault("name", preset)
    return data


def _deep_update(base: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def build_config(data: dict, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Validate a run config given as a mapping (sections may be preset names).

    Raises :class:`ConfigError` naming the field, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a run config must be a mapping with sections model, parallel, train, "
                          f"system; got {type(data).__name__}")
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section {unknown[0]!r}; allowed sections: "
                          f"{', '.join(_SECTIONS)}")
    missing = [k for k in ("model", "train", "system") if k not in data]
    if missing:
        raise ConfigError(f"the config has no {missing[0]!r} section; it needs model, train and "
                          "system (parallel is optional)")
    sections = {k: resolve_section(k, v) for k, v in data.items()}
    sections = apply_overrides(sections, overrides)
    parsed = {}
    for name, value in sections.items():
        try:
            parsed[name] = _SECTIONS[name].model_validate(value)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, name)) from None
    try:
        return RunConfig(**parsed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "config")) from None


def apply_overrides(sections: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML: ``4``, ``true``, ``[1,2]``)."""
    import yaml

    out = copy.deepcopy(sections)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value, "
                              "e.g. parallel.tensor_model_parallel_size=4")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if keys[0] not in _SECTIONS or len(keys) < 2:
            raise ConfigError(f"override {item!r}: the path must start with one of "
                              f"{', '.join(_SECTIONS)} and name a key, e.g. train.micro_batch_size=2")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = out.setdefault(keys[0], {})
        for k in keys[1:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a mapping")
        node[keys[-1]] = value
    return out


def read_document(path: str | Path) -> dict:
    """Read a YAML or JSON file into a mapping, with errors that name the file."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                          f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a run config must be a mapping with sections model, parallel, "
                          "train, system")
    return data


def load_config(source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load and validate a run config from a YAML/JSON path or a mapping."""
    data = source if isinstance(source, dict) else read_document(source)
    try:
        return build_config(data, overrides)
    except ConfigError as exc:
        if isinstance(source, (str, Path)):
            raise type(exc)(f"{source}: {exc}") from None
        raise

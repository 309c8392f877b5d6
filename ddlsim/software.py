"""The software stack a run uses: which kernels are fused and which overlaps are on.

``system.software`` names a stack from ``ddlsim/data/software.yaml`` (``megatron-lm-2021``,
``megatron-core-2024``, ``deepspeed``, …) or gives one as a mapping that starts from a named
stack and overrides some of its fields::

    software: megatron-core-2024
    software: {stack: megatron-lm-2021, kernels: {attention: flash2}}

Two parts, each with its defaults cited in the YAML:

* ``kernels`` — how the compute runs: the attention kernel, which element-wise ops are fused,
  the optimizer kernel, FP8 details. Read by the compute cost model and the activation-memory
  formulas.
* ``overlap`` — which communication hides behind compute (Megatron-Core's option names). The
  plan may override each one (``parallel.overlap_grad_reduce`` etc.); a plan field left unset
  takes the stack's value.

:func:`resolve_software` merges the three layers (stack ← ``system.software`` overrides ←
plan options) into a frozen :class:`Software`.

Each stack also lists, under ``rules:``, the plans its framework cannot run, each rule with its
source (:mod:`ddlsim.stackrules`); ``{stack: …, what_if: true}`` predicts such a plan anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, model_validator

from .config_types import Seconds, _Strict, reject_bool
from .errors import ConfigError, did_you_mean

__all__ = ["KernelSpec", "OverlapSpec", "SoftwareSpec", "Software", "stacks",
           "resolve_software", "grad_dtype_bytes", "DEFAULT_STACK"]

#: The stack a system without ``software`` runs: what a user training a decoder today runs.
DEFAULT_STACK = "megatron-core-2024"

Attention = Literal["flash2", "flash3", "cudnn", "fused_softmax", "unfused"]
Zero3Gather = Literal["per_layer", "per_module", "per_tensor"]
#: whose code runs a ZeRO-3 plan (``zero3_implementation``): PyTorch's FSDP (FSDP1) or FSDP2,
#: DeepSpeed's stage 3, or Megatron-Core's Megatron-FSDP (:mod:`ddlsim.workloads.decoder.megatron_fsdp`)
Zero3Implementation = Literal["torch_fsdp", "torch_fsdp2", "deepspeed", "megatron_fsdp"]
#: the one ZeRO-3 implementation a stack may run instead of its own (its rules say where)
ALTERNATIVE_ZERO3 = "megatron_fsdp"
#: when a ZeRO-3/FSDP unit frees its gathered parameters after the forward
#: (:mod:`ddlsim.workloads.decoder.fsdp`): after every forward, never, or torchtitan's
#: defaults (not with pipelining; and, in 2024, never for the last transformer block)
Reshard = Literal["always", "never", "not_with_pp", "not_with_pp_nor_last"]
GradReduceDtype = Literal["param", "fp32", "fp32_if_bf16"]
#: how a checkpointed block is recomputed (:mod:`ddlsim.workloads.decoder.early_stop`)
Checkpoint = Literal["reentrant", "non_reentrant", "non_reentrant_early_stop"]
#: how the stack hands kernels to the device (ddlsim/simulator/kernels/host.py)
HostDispatch = Literal["eager", "compiled", "cuda_graphs"]
def _gemm_library(v: Any) -> Any:
    """A GEMM library's name and major version, lower case (``cublas-12``), or the reason."""
    if not (isinstance(v, str) and len(v) <= 40
            and re.fullmatch(r"[a-z][a-z0-9]*-[0-9]+(\.[0-9]+)*", v)):
        raise ValueError(f"expected a GEMM library and its version, lower case with a dash, "
                         f"as the presets name them: cublas-11, cublas-12; got {v!r}")
    return v


#: a GEMM library and its major version, as the device presets name them (``cublas-12``)
GemmLibrary = Annotated[str, BeforeValidator(_gemm_library)]


def _off_from_false(v: Any) -> Any:
    """YAML 1.1 reads an unquoted ``off`` as false: take false as ``"off"``."""
    return "off" if v is False else v


#: A count of elements: a whole number ≥ 0, also written as DeepSpeed's configs do (``1e5``)
Elements = Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=10**15)]

#: ``tp_comm_overlap``'s values (``off`` also as YAML's false)
#: (``torch_async``: PyTorch's micro-pipelined async TP, :mod:`ddlsim.workloads.decoder.torch_tp`)
TPCommOverlap = Annotated[Literal["off", "bulk", "pipelined", "torch_async"],
                          BeforeValidator(_off_from_false)]


class KernelSpec(_Strict):
    """How the compute runs (every field optional: unset fields come from the stack)."""

    attention: Attention | None = Field(
        default=None, description="flash2/flash3 (FlashAttention: no s² tensors), cudnn "
                                  "(cuDNN fused attention, as TransformerEngine runs it on "
                                  "Hopper), fused_softmax (Megatron's fused "
                                  "scale-mask-softmax), unfused")
    cp_attention: Literal["te", "torch"] | None = Field(
        default=None, description="whose context-parallel attention runs the fused kernels: "
                                  "te (TransformerEngine; cp_comm_type all_gather runs one "
                                  "causal call per query chunk) or torch (torch's ring "
                                  "attention: the all-gather rotation keeps the ring's "
                                  "per-step calls); docs/tensor_parallel.md")
    fused_bias_gelu: StrictBool | None = None
    fused_bias_dropout_add: StrictBool | None = None
    fused_layernorm: StrictBool | None = None
    fused_rope: StrictBool | None = None
    fused_cross_entropy: StrictBool | None = None
    fused_optimizer: StrictBool | None = Field(default=None,
                                               description="multi-tensor Adam (apex/TE)")
    gradient_accumulation_fusion: StrictBool | None = None
    grad_reduce_dtype: GradReduceDtype | None = Field(
        default=None, description="dtype of the gradient buffers and their data-parallel "
                                  "reduction: param (the 16-bit parameter dtype), fp32, or "
                                  "fp32_if_bf16 (Megatron-LM's rule)")
    fp8_recipe: Literal["te_delayed", "te_current", "tensorwise", "rowwise"] | None = Field(
        default=None, description="how FP8 runs (train.dtype fp8) scale and cast the linear "
                                  "layers' GEMM inputs: Transformer Engine's delayed or "
                                  "current scaling (te_current: Megatron-Core's "
                                  "--fp8-recipe tensorwise, Megatron-Bridge's fp8_cs), or "
                                  "torchao's dynamic tensorwise or rowwise scaling "
                                  "(simulator/kernels/fp8recipe.py, fp8_current.py)")
    enable_fsdp_float8_all_gather: StrictBool | None = Field(
        default=None, description="torchao's FSDP2 float8 all-gather (torchtitan's [float8] "
                                  "key): each float8 linear's weight shard is cast to FP8 "
                                  "before FSDP gathers it, so the gather moves one byte per "
                                  "weight; tensorwise recipe under ZeRO-3 only "
                                  "(workloads/decoder/fsdp_float8.py)")
    precompute_float8_dynamic_scale_for_fsdp: StrictBool | None = Field(
        default=None, description="with enable_fsdp_float8_all_gather: the weights' scales "
                                  "come from one amax all-reduce after the optimizer step "
                                  "instead of one per weight and gather (torchtitan's "
                                  "[float8] key)")
    selective_recompute: Literal["attention_core", "every_second_mm"] | None = Field(
        default=None, description="what recompute: selective recomputes: the attention "
                                  "core (Megatron, Korthikanti et al. 2022) or torchtitan's "
                                  "op-level policy (every second mm and the element-wise "
                                  "ops; workloads/decoder/sac.py)")
    activation_checkpoint: Checkpoint | None = Field(
        default=None, description="how a checkpointed block is run again in the backward: "
                                  "reentrant (an autograd Function re-running the whole "
                                  "block: Megatron, DeepSpeed), non_reentrant "
                                  "(torch.utils.checkpoint without early stop: the whole "
                                  "block) or non_reentrant_early_stop (torch's default: it "
                                  "stops once the last tensor the backward saved is rebuilt, "
                                  "so the block's tail after it is not run); under compile: "
                                  "true a non-reentrant block's tail is dead code in the "
                                  "backward graph either way (workloads/decoder/early_stop.py)")
    compile: StrictBool | None = Field(
        default=None, description="torch.compile of each transformer block (torchtitan): "
                                  "Inductor fuses the element-wise ops (COMPILE_FUSIONS)")
    gemm_library: GemmLibrary | None = Field(
        default=None, description="the GEMM library the stack's container ships (cublas-11, "
                                  "cublas-12, …): picks the device's matmul ceiling measured "
                                  "with it (device.matmul_efficiency_by_library; "
                                  "docs/compute.md)")
    softmax_in_fp32: StrictBool | None = Field(
        default=None, description="attention: unfused runs its softmax in fp32 (Megatron's "
                                  "query-key layer scaling: cast, scale, mask, softmax, cast "
                                  "back; docs/compute.md)")
    separate_projections: StrictBool | None = Field(
        default=None, description="the model keeps the projections that read one input as "
                                  "separate modules (torchtitan's wq, wk, wv and w1, w3): one "
                                  "GEMM each, and autograd sums their input gradients "
                                  "(simulator/kernels/autograd.py); false: fused QKV and "
                                  "gated fc1 GEMMs (Megatron)")
    sp_layout_copy: StrictBool | None = Field(
        default=None, description="the stack's sequence-parallel all-gathers and "
                                  "reduce-scatters work on a non-leading dimension (DTensor "
                                  "Shard(1) over batch-first activations: torchtitan), so "
                                  "each re-lays its tensor with one copy "
                                  "(simulator/kernels/dtensor.py); false: sequence-first "
                                  "activations gathered in place (Megatron)")
    sp_saves_gathered_input: StrictBool | None = Field(
        default=None, description="a sequence-parallel column-parallel linear saves its "
                                  "all-gathered input for the weight gradient (autograd under "
                                  "DTensor TP: torchtitan), so the backward gathers it again "
                                  "only where selective checkpointing recomputes the gather; "
                                  "false: the sequence-sharded input is saved and all-gathered "
                                  "again in every backward (Megatron, Korthikanti et al. 2022 "
                                  "§4.2.2)")
    host_dispatch: HostDispatch | None = Field(
        default=None, description="how kernels are dispatched: eager (PyTorch from Python, op "
                                  "by op), compiled (torch.compile: a compiled wrapper "
                                  "launches them) or cuda_graphs (captured graphs); sets the "
                                  "host time per kernel (docs/compute.md)")


class OverlapSpec(_Strict):
    """Which communication hides behind compute (Megatron-Core's names)."""

    overlap_grad_reduce: StrictBool | None = None
    overlap_param_gather: StrictBool | None = None
    tp_comm_overlap: TPCommOverlap | None = None
    overlap_p2p_comm: StrictBool | None = None
    tp_async_backward: StrictBool | None = Field(
        default=None,
        description="Megatron's asynchronous TP communication in the backward without "
                    "tp_comm_overlap: with sequence parallelism the input's re-gather runs "
                    "beside the data-gradient GEMM and the input-gradient reduce-scatter "
                    "beside the weight-gradient GEMM; without it the input-gradient "
                    "all-reduce runs beside the weight-gradient GEMM (docs/overlap.md)")
    zero3_prefetch_layers: StrictInt | None = Field(
        default=None, ge=0, le=64,
        description="ZeRO-3/FSDP: layers whose parameter all-gather may run ahead of the "
                    "layer computing (0: gathered on demand)")
    zero3_prefetch_modules: StrictInt | None = Field(
        default=None, ge=0, le=1024,
        description="ZeRO-3 from module hooks (per_module/per_tensor): modules whose "
                    "parameters may be gathered ahead of the module computing")
    zero3_gather: Zero3Gather | None = Field(
        default=None,
        description="ZeRO-3/FSDP: per_layer (one flat all-gather and reduce-scatter per "
                    "layer, as FSDP units), per_module (DeepSpeed's module hooks, one "
                    "coalesced collective per leaf module) or per_tensor (DeepSpeed 2021: "
                    "one per parameter tensor; docs/overlap.md)")
    zero3_reshard_after_forward: Reshard | None = Field(
        default=None,
        description="per_layer ZeRO-3/FSDP: when a layer's gathered parameters are freed "
                    "after its forward: always (gathered again for the backward), never "
                    "(kept for the backward), not_with_pp (torchtitan 2025: never under "
                    "pipelining, else always), not_with_pp_nor_last (torchtitan 2024: also "
                    "never for the last layer); docs/stacks.md")
    zero3_copy_out: StrictBool | None = Field(
        default=None,
        description="per_layer ZeRO-3/FSDP2: the gathered parameters are copied out of the "
                    "all-gather buffer on the compute stream (read + write), and the "
                    "gradients into the reduce-scatter input on its stream, cast to the "
                    "reduce dtype (PyTorch FSDP2's foreach_all_gather_copy_out, chunk_cat)")
    zero3_persistence_threshold: Elements | None = Field(
        default=None,
        description="per_module/per_tensor ZeRO-3: tensors of fewer elements stay gathered "
                    "(DeepSpeed stage3_param_persistence_threshold)")
    zero3_max_reuse_distance: Elements | None = Field(
        default=None,
        description="per_module/per_tensor ZeRO-3: a module reused within this many elements of "
                    "fetches is kept gathered (DeepSpeed stage3_max_reuse_distance)")
    zero3_max_live_parameters: Elements | None = Field(
        default=None,
        description="per_module/per_tensor ZeRO-3: the next module is prefetched only while fewer "
                    "elements than this are gathered (the module computing and those kept "
                    "for reuse), else gathered on demand (DeepSpeed "
                    "stage3_max_live_parameters); 0: no cap")
    zero3_host_python_op: Seconds | None = Field(
        default=None,
        description="per_tensor ZeRO-3: host time of one Python-level tensor operation, "
                    "e.g. '2 us' (a view per rank in the list-form collectives' loops; "
                    "docs/overlap.md)")
    zero3_host_copy: Seconds | None = Field(
        default=None,
        description="per_tensor ZeRO-3: host time of one copy_ with its kernel launch, "
                    "e.g. '10 us' (one per rank in PyTorch 1.8's list-form "
                    "all_gather/reduce_scatter)")
    zero3_host_gather_call: Seconds | None = Field(
        default=None,
        description="per_tensor ZeRO-3: host time of one parameter gather beyond its "
                    "counted Python ops and copies (hooks, bookkeeping, allocation)")
    zero3_implementation: Zero3Implementation | None = Field(
        default=None,
        description="whose code runs a ZeRO-3 plan: the stack's own (torch_fsdp, "
                    "torch_fsdp2, deepspeed) or megatron_fsdp (Megatron-Core's "
                    "Megatron-FSDP, --use-custom-fsdp --data-parallel-sharding-strategy "
                    "optim_grads_params: experts sharded over the expert data-parallel "
                    "group; megatron-core-2025 only, docs/moe.md)")


class SoftwareSpec(_Strict):
    """``system.software`` as a mapping: a named stack and the fields it overrides."""

    stack: str = DEFAULT_STACK
    kernels: KernelSpec = Field(default_factory=KernelSpec)
    overlap: OverlapSpec = Field(default_factory=OverlapSpec)
    what_if: StrictBool = Field(
        default=False, description="predict a plan the stack cannot run (its rules in "
                                   "software.yaml) anyway, marked as a what-if")
    compile: StrictBool | None = Field(
        default=None, description="short for kernels.compile (torch.compile of each "
                                  "transformer block, torchtitan)")
    source: str | None = None

    @model_validator(mode="after")
    def _known(self) -> "SoftwareSpec":
        if self.compile is not None:
            if self.kernels.compile not in (None, self.compile):
                raise ValueError(f"compile = {self.compile} contradicts kernels.compile = "
                                 f"{self.kernels.compile}; give one of them")
            object.__setattr__(self, "kernels",
                               self.kernels.model_copy(update={"compile": self.compile}))
        known = stacks()
        if self.stack not in known:
            raise ValueError(f"stack {self.stack!r} is not a known software stack"
                             f"{did_you_mean(self.stack, known)}; allowed: {', '.join(known)}")
        return self


@dataclass(frozen=True)
class Software:
    """A resolved stack: every field set. ``kernels``/``overlap`` map field → value,
    ``sources`` field → where its default comes from."""

    name: str
    kernels: dict[str, Any]
    overlap: dict[str, Any]
    sources: dict[str, str]
    #: run plans the stack's rules refuse (:mod:`ddlsim.stackrules`), as a what-if
    what_if: bool = False

    def __getattr__(self, field: str) -> Any:
        for part in (self.kernels, self.overlap):
            if field in part:
                return part[field]
        raise AttributeError(field)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.kernels.items())),
                     tuple(sorted(self.overlap.items())), self.what_if))


@lru_cache(maxsize=1)
def _stack_table() -> dict[str, dict]:
    from importlib import resources

    from .documents import load_bundled_yaml
    return load_bundled_yaml(resources.files("ddlsim.data").joinpath("software.yaml").read_text())


def stacks() -> list[str]:
    """The named stacks, in file order."""
    return list(_stack_table())


def _stack_defaults(name: str) -> tuple[dict, dict, dict]:
    """(kernels, overlap, sources) of a named stack: each YAML field is ``{value, source}``."""
    entry = _stack_table()[name]
    parts: list[dict] = [{}, {}]
    sources: dict[str, str] = {}
    for i, section in enumerate(("kernels", "overlap")):
        for field, item in entry[section].items():
            parts[i][field] = item["value"]
            sources[field] = item["source"]
    return parts[0], parts[1], sources


def resolve_software(spec: SoftwareSpec | str | None, plan: Any = None) -> Software:
    """The stack ``spec`` names, with its overrides and then the plan's overlap options
    (``plan.<field>`` when the plan sets it, i.e. is not None) applied.

    Raises
    ------
    ConfigError
        if ``spec`` names an unknown stack.
    """
    if spec is None:
        spec = SoftwareSpec()
    elif isinstance(spec, str):
        if spec not in stacks():
            raise ConfigError(f"system.software = {spec!r} is not a known software stack"
                              f"{did_you_mean(spec, stacks())}; allowed: {', '.join(stacks())}")
        spec = SoftwareSpec(stack=spec)
    kernels, overlap, sources = _stack_defaults(spec.stack)
    for part, given, where in ((kernels, spec.kernels, "system.software.kernels"),
                               (overlap, spec.overlap, "system.software.overlap")):
        for field, value in given.model_dump(exclude_none=True).items():
            part[field], sources[field] = value, where
    # the plan's own overlap options (a pydantic model's fields: no failed lookups for the
    # stack fields it does not have — this runs for every ``cfg.software``)
    known = getattr(type(plan), "model_fields", None) if plan is not None else None
    for field in list(overlap):
        if plan is None or (known is not None and field not in known):
            continue
        value = getattr(plan, field, None)
        if value is not None:
            overlap[field], sources[field] = value, f"parallel.{field}"
    if kernels["compile"]:
        _compiled(kernels, sources)
    if overlap["zero3_gather"] == "per_layer":
        for field in ("zero3_persistence_threshold", "zero3_max_reuse_distance",
                      "zero3_prefetch_modules", "zero3_max_live_parameters"):
            if overlap[field]:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]} applies to ZeRO-3 "
                    f"gathers from module hooks only, and zero3_gather is 'per_layer' "
                    f"({_where(sources, spec)}); set zero3_gather: per_module or per_tensor, "
                    f"or {field}: 0")
    if overlap["zero3_gather"] != "per_tensor":
        for field in _HOST_FIELDS:
            if overlap[field]:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]:g} s applies to per-tensor "
                    f"ZeRO-3 gathers only (the list-form collectives' per-rank host loops), "
                    f"and zero3_gather is {overlap['zero3_gather']!r} ({_where(sources, spec)}); "
                    f"set zero3_gather: per_tensor, or {field}: 0")
    if overlap["zero3_gather"] != "per_layer":
        for field, plain in (("zero3_reshard_after_forward", "always"), ("zero3_copy_out", False)):
            if overlap[field] != plain:
                raise ConfigError(
                    f"{sources[field]}: {field} = {overlap[field]!r} applies to per-layer "
                    f"ZeRO-3/FSDP units only, and zero3_gather is {overlap['zero3_gather']!r} "
                    f"({_where(sources, spec)}); set zero3_gather: per_layer, or "
                    f"{field}: {plain!r}")
    if overlap["zero3_gather"] != "per_layer" and overlap["zero3_prefetch_layers"]:
        raise ConfigError(
            f"{sources['zero3_prefetch_layers']}: zero3_prefetch_layers = "
            f"{overlap['zero3_prefetch_layers']} applies to per-layer ZeRO-3 gathers, and "
            f"zero3_gather is {overlap['zero3_gather']!r} ({_where(sources, spec)}); gathers "
            f"from module hooks prefetch by module: set zero3_prefetch_modules instead")
    _check_zero3_implementation(spec.stack, overlap, sources)
    return Software(spec.stack, kernels, overlap, sources, spec.what_if)


def _check_zero3_implementation(stack: str, overlap: dict, sources: dict) -> None:
    """Refuse a ``zero3_implementation`` that is neither the stack's own nor
    :data:`ALTERNATIVE_ZERO3` (whether the stack has that one is its rule
    ``no_megatron_fsdp``): another framework's ZeRO-3 is another stack."""
    own = _stack_table()[stack]["overlap"]["zero3_implementation"]["value"]
    value = overlap["zero3_implementation"]
    if value not in (own, ALTERNATIVE_ZERO3):
        raise ConfigError(
            f"{sources['zero3_implementation']}: zero3_implementation = {value!r} is not run "
            f"by the stack {stack!r}, whose ZeRO-3 is {own!r}; allowed: {own!r} or "
            f"{ALTERNATIVE_ZERO3!r} (where the stack has it). For another framework's "
            "ZeRO-3 pick its stack (system.software)")


#: what ``compile: true`` fuses, field -> why: torch.compile's Inductor fuses chains of
#: point-wise ops and reductions into one generated kernel each (Ansel et al., "PyTorch 2",
#: ASPLOS 2024, sec. 5: "horizontal and vertical fusion" of pointwise and reduction ops);
#: torchtitan compiles each transformer block whole (fullgraph=True) and, from 2025, the loss
COMPILE_FUSIONS = {
    "fused_layernorm": "the RMSNorm's pow, mean, rsqrt and mul in one kernel",
    "fused_bias_gelu": "SwiGLU's silu and mul in one kernel",
    "fused_rope": "the rotary embedding's complex multiply in one kernel",
    "fused_bias_dropout_add": "each residual add fused with the op before it",
}


def _compiled(kernels: dict, sources: dict) -> None:
    """Switch on the fusions of :data:`COMPILE_FUSIONS` that ``compile: true`` brings, except
    those the config sets itself (a field given under ``system.software.kernels`` stays)."""
    for field, what in COMPILE_FUSIONS.items():
        if not sources[field].startswith("system.software"):
            kernels[field] = True
            sources[field] = f"compile: true ({sources['compile']}): Inductor fuses {what}"
    if "host_dispatch" in kernels and not sources["host_dispatch"].startswith("system.software"):
        kernels["host_dispatch"] = "compiled"
        sources["host_dispatch"] = (f"compile: true ({sources['compile']}): the compiled "
                                    "blocks launch Inductor's generated kernels")


#: host costs of the list-form collectives, modelled under ``zero3_gather: per_tensor`` only
_HOST_FIELDS = ("zero3_host_python_op", "zero3_host_copy", "zero3_host_gather_call")


def _where(sources: dict[str, str], spec: SoftwareSpec) -> str:
    """Where ``zero3_gather``'s value came from: a config location, or the stack."""
    src = sources["zero3_gather"]
    return src if src.startswith(("system.", "parallel.")) else f"stack {spec.stack!r}"


def grad_dtype_bytes(rule: str, param_dtype: str) -> int:
    """Bytes per gradient element in the gradient buffers and their data-parallel reduction,
    under the stack's ``grad_reduce_dtype`` ``rule`` for parameters stored in ``param_dtype``
    (FP8 runs keep 16-bit parameters: pass the 16-bit dtype): ``param`` → the parameter's
    bytes, ``fp32`` → 4, ``fp32_if_bf16`` → 4 with bf16 parameters, else the parameter's."""
    from .config_types import DTYPE_BYTES
    own = DTYPE_BYTES[param_dtype]
    if rule == "fp32" or (rule == "fp32_if_bf16" and param_dtype == "bf16"):
        return max(own, 4)
    return own

"""The ``parallel`` section of a run config: the plan, with Megatron-LM's argument names
(:class:`ParallelConfig`), and its tensor-parallel scheme (:class:`TensorParallelSpec`).
Re-exported by :mod:`ddlsim.config`, which checks the plan against the model, the training
settings and the system.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (BeforeValidator, Field, StrictBool, StrictStr, field_validator,
                      model_validator)

from .config_moe import MoESpec
from .config_types import BucketBytes, _Strict, count_type, reject_bool
from .errors import did_you_mean
from .registered import algorithms, registered, schedules, tensor_parallel_modes
from .software import TPCommOverlap

__all__ = ["DPStrategy", "TensorParallelSpec", "ParallelConfig"]

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
    microbatch_group_size_per_vp_stage: count_type("microbatches") | None = Field(
        default=None, description="interleaved schedule: micro-batches each virtual stage "
                                  "runs in a row (Megatron-Core's option); default: the "
                                  "stack's rule (kernels.interleaved_groups: PP, or torch "
                                  "pipelining's micro-batches per round)")
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
    pipeline_model_parallel_layout: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="Megatron-Core's pipeline layout string: each virtual stage's layers, "
                    "E embedding, t transformer layer, m MTP layer, L loss, '|' between "
                    "virtual stages, (…)*n repeats (workloads/decoder/pp_layout.py)")
    sequence_parallel: StrictBool = Field(
        default=False, description="Megatron's sequence parallelism (TP > 1); unset: on where "
        "the stack's rules refuse TP without it (torchtitan; Megatron-Core's MoE layers), "
        "else off (RunConfig._plan_from_stack)")
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
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(reject_bool)] = Field(
        default=0, description="ZeRO stage (3: FSDP); unset: the stack's plan default "
        "(torchtitan: 3, its FSDP2), else 0 (RunConfig._plan_from_stack)")
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
    collective_buffers: Literal["in_place", "separate"] = Field(
        default="in_place", description="how the program passes its collectives' buffers: "
        "in_place (one buffer) or separate (send and receive: a one-rank collective then "
        "copies one into the other on the calling rank, MPI; ddlsim/workloads/onerankcopy.py)")
    rank_order: StrictStr = Field(
        default="tp-cp-ep-dp-pp",
        description="mesh axes innermost first (Megatron-Core's initialize_model_parallel "
                    "`order`); ranks are placed on devices in rank order")
    # --- tensor-parallel schemes and context parallelism (docs/tensor_parallel.md) ---------
    # `tensor_parallel` names a layer partitioner and its grid; its size is the tp axis and
    # fills in tensor_model_parallel_size (which alone still means Megatron's 1-D scheme).
    # `context_parallel_size` splits the sequence over the cp axis; `cp_comm_type` is how
    # attention exchanges K/V (Megatron-Core's names: p2p = ring attention, all_gather);
    # unset, the stack's (megatron-core: p2p, torchtitan: all_gather; software.yaml).
    tensor_parallel: TensorParallelSpec | None = Field(
        default=None, description="scheme and grid, e.g. {mode: 2.5d, q: 4, d: 4}")
    context_parallel_size: count_type("parallel_size") = Field(
        default=1, description="CP: the sequence split over this many ranks (Megatron-LM)")
    cp_comm_type: Literal["p2p", "all_gather"] | None = Field(
        default=None, description="CP's K/V exchange: ring (p2p) or all-gather "
                                  "(Megatron-Core's names); default: system.software's")

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
        if vpp not in (None, 1) and "schedule" not in self.model_fields_set:
            # virtual stages without a schedule: the interleaved one, as Megatron-LM runs
            # them (its --virtual-pipeline-model-parallel-size selects that schedule; it has
            # no flag of its own); a schedule written otherwise is refused below
            object.__setattr__(self, "schedule", "interleaved")
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
        elif self.microbatch_group_size_per_vp_stage is not None:
            raise ValueError(f"microbatch_group_size_per_vp_stage = "
                             f"{self.microbatch_group_size_per_vp_stage} needs schedule = "
                             f"'interleaved' (got {self.schedule!r}): it groups the "
                             "micro-batches of the interleaved schedule only")
        # ZeRO-3 with pipelining: the stacks that cannot run it say so in their rules
        # (software.yaml: pipeline_zero, zero3_pipeline, no_zero3); torchtitan runs FSDP in its stages
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

"""The fields of a software stack: ``kernels`` (:class:`KernelSpec`, how the compute runs) and
``overlap`` (:class:`OverlapSpec`, which communication hides behind compute), with their closed
choices and the types their values are read into. Each field is optional here: unset fields
take the named stack's value, and the stacks, their YAML and the cross-field checks are
:mod:`ddlsim.software`'s (:func:`~ddlsim.software.resolve_software`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictInt

from .config_types import Seconds, _Strict, reject_bool

__all__ = ["KernelSpec", "OverlapSpec", "TPCommOverlap", "GemmLibrary", "Zero3Implementation",
           "Zero3Gather", "Elements", "CPCommType"]

Attention = Literal["flash2", "flash3", "cudnn", "fused_softmax", "unfused"]
Zero3Gather = Literal["per_layer", "per_module", "per_tensor"]
#: whose code runs a ZeRO-3 plan (``zero3_implementation``): PyTorch's FSDP (FSDP1) or FSDP2,
#: DeepSpeed's stage 3, or Megatron-Core's Megatron-FSDP
#: (:mod:`ddlsim.workloads.decoder.megatron_fsdp`)
Zero3Implementation = Literal["torch_fsdp", "torch_fsdp2", "deepspeed", "megatron_fsdp"]
#: when a ZeRO-3/FSDP unit frees its gathered parameters after the forward
#: (:mod:`ddlsim.workloads.decoder.fsdp`): after every forward, never, or torchtitan's
#: defaults (not with pipelining; and, in 2024, never for the last transformer block)
Reshard = Literal["always", "never", "not_with_pp", "not_with_pp_nor_last"]
GradReduceDtype = Literal["param", "fp32", "fp32_if_bf16"]
#: how a checkpointed block is recomputed (:mod:`ddlsim.workloads.decoder.early_stop`)
Checkpoint = Literal["reentrant", "non_reentrant", "non_reentrant_early_stop"]
#: when the model repeats K and V to the query heads before the attention core
#: (:func:`ddlsim.simulator.kernels.repeat_kv.expands_kv`)
RepeatKV = Literal["always", "unfused_kernels", "never"]
#: the framework's default split of the layers over the pipeline's virtual stages
PipelineSplit = Literal["even", "torchtitan-2024", "torchtitan-2025", "deepspeed"]
#: how the interleaved schedule groups micro-batches (:func:`ddlsim.workloads.schedules.
#: microbatch_group`)
InterleavedGroups = Literal["pipeline_size", "megatron_core", "torch_rounds"]
#: where a micro-batch's dense attention mask comes from
#: (:mod:`ddlsim.workloads.decoder.batch_input`)
BatchMask = Literal["dataloader", "device", "none"]
#: how context-parallel attention exchanges K/V (Megatron-Core's ``cp_comm_type`` names)
CPCommType = Literal["p2p", "all_gather"]
#: how the stack hands kernels to the device (ddlsim/simulator/kernels/host.py)
HostDispatch = Literal["eager", "compiled", "cuda_graphs"]
#: how the unfused attention's softmax runs (the keys of
#: ddlsim/simulator/kernels/softmax.py SOFTMAX_DISPATCH)
SoftmaxDispatch = Literal["one_pass", "torch-1.8", "torch-2.5", "torch-2.10"]


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
    cp_comm_type: CPCommType | None = Field(
        default=None, description="how context-parallel attention exchanges K/V when "
                                  "parallel.cp_comm_type is unset: p2p (a ring) or "
                                  "all_gather (Megatron-Core's names; torchtitan's "
                                  "context_parallel_rotate_method alltoall and allgather)")
    fused_bias_gelu: StrictBool | None = None
    fused_squared_relu: StrictBool | None = Field(
        default=None, description="squared ReLU (a relu2 model's activation) in one kernel "
                                  "each way (Megatron's @jit_fuser function) instead of "
                                  "torch's relu and pow")
    fused_bias_dropout_add: StrictBool | None = None
    fused_layernorm: StrictBool | None = None
    fused_rope: StrictBool | None = None
    rope_form: Literal["rotate_half", "complex", "real_matrix"] | None = Field(
        default=None, description="how an unfused rotary embedding runs, per q and per k: "
                                  "rotate_half (t*cos + rotate_half(t)*sin: 5 kernels, 10d "
                                  "per element; Megatron), complex (view_as_complex of an "
                                  "fp32 copy times freqs_cis, cast back: 3 kernels, 2d + 16 "
                                  "B; torchtitan) or real_matrix (each fp32 pair times a "
                                  "2 x 2 real matrix, broadcast, summed over the pair, cast "
                                  "back: 4 kernels, 2d + 32 B; IBM fms); "
                                  "simulator/kernels/elementwise.py")
    fused_norm_backward: Literal["one_kernel", "two_kernels"] | None = Field(
        default=None, description="a fused norm's backward: one_kernel (the input gradient "
                                  "and the weight's partial sums in one pass, 3d: "
                                  "TransformerEngine) or two_kernels (the input gradient, "
                                  "3d, then the weight's, reading the output gradient and "
                                  "the input again, 2d: torch, apex, Inductor); "
                                  "simulator/kernels/elementwise_backward.py")
    fused_cross_entropy: StrictBool | None = None
    cross_entropy_fusion_impl: Literal["native", "te"] | None = Field(
        default=None, description="which fused cross-entropy runs under fused_cross_entropy "
                                  "(Megatron-Core's --cross-entropy-fusion-impl): native "
                                  "(Megatron-Core's jit-fused kernels over an fp32 copy of "
                                  "the logits) or te (Transformer Engine's Triton "
                                  "parallel_cross_entropy: the gradient written into the "
                                  "16-bit logits in place, 2 B per logit kept); "
                                  "simulator/kernels/step_passes.py")
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
    fp8_param_gather: StrictBool | None = Field(
        default=None, description="Megatron's --fp8-param-gather: Transformer Engine's linear "
                                  "weights are FP8 parameters, quantized by the distributed "
                                  "optimizer's step from the fp32 master shard and gathered at "
                                  "one byte per element, with no forward weight cast; needs "
                                  "train.dtype fp8, a te_* recipe and the distributed optimizer "
                                  "(simulator/kernels/fp8_weights.py, "
                                  "workloads/decoder/param_gather.py)")
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
    softmax_dispatch: SoftmaxDispatch | None = Field(
        default=None, description="the kernels attention: unfused's softmax runs, by the "
                                  "PyTorch whose CUDA dispatch (SoftMax.cu) the stack runs: "
                                  "torch-1.8 (a row over 1,024 elements or 4 KB is re-read: "
                                  "three reads forward; the backward's grad*output product, "
                                  "then two reads of it), torch-2.5 (the forward caches such "
                                  "rows in shared memory), torch-2.10 (both ways), or "
                                  "one_pass (one kernel each way reading its rows once: the "
                                  "numpy reference); simulator/kernels/softmax.py")
    qkv_bias_pass: StrictBool | None = Field(
        default=None, description="the QKV projection's bias (the one bias no fused "
                                  "bias-GeLU or bias-dropout-add takes) is added by an "
                                  "element-wise pass after its GEMM, and its gradient summed "
                                  "over the tokens by one before the weight gradient "
                                  "(numpy: ddlsim/reference/gpt2.py); false: in the GEMM's "
                                  "epilogue (torch's addmm, Transformer Engine), as every "
                                  "framework stack does, its gradient's sum not charged apart")
    separate_projections: StrictBool | None = Field(
        default=None, description="the model keeps the projections that read one input as "
                                  "separate modules (torchtitan's wq, wk, wv and w1, w3): one "
                                  "GEMM each, and autograd sums their input gradients "
                                  "(simulator/kernels/autograd.py); false: fused QKV and "
                                  "gated fc1 GEMMs (Megatron)")
    pipeline_split: PipelineSplit | None = Field(
        default=None, description="how the framework splits the transformer layers over the "
                                  "pipeline's virtual stages when the plan gives no split of "
                                  "its own: even (Megatron's L / (PP·VPP), refused where it "
                                  "does not divide), torchtitan's own uneven rule of 2024 "
                                  "or 2025 (workloads/decoder/titan_split.py), or DeepSpeed's "
                                  "balanced partition (workloads/decoder/ds_split.py)")
    interleaved_groups: InterleavedGroups | None = Field(
        default=None, description="how the interleaved schedule groups micro-batches: groups "
                                  "of PP with the micro-batches a multiple of PP "
                                  "(pipeline_size), Megatron-Core's groups of "
                                  "microbatch_group_size_per_vp_stage (megatron_core), or "
                                  "torch.distributed.pipelining's rounds (torch_rounds; "
                                  "workloads/schedules.py)")
    repeat_kv: RepeatKV | None = Field(
        default=None, description="under grouped-query attention the model repeats K and V "
                                  "to the query heads before the attention core: always "
                                  "(torchtitan's repeat_kv before SDPA), with the unfused "
                                  "kernels only (Megatron-Core's local DotProductAttention; "
                                  "its Transformer Engine path takes the K/V groups as they "
                                  "are), or never; the core then saves them at the query "
                                  "width, and a copy forward and a sum of their gradients "
                                  "backward run per K and V (simulator/kernels/repeat_kv.py)")
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
    moe_saves_expert_output: StrictBool | None = Field(
        default=None, description="an MoE layer weights each routed copy's expert output by "
                                  "its routing probability at the combine, whose product "
                                  "saves the expert output for the probability's gradient "
                                  "(2 bytes per copy and hidden unit kept); false: the "
                                  "experts' activation applies the probabilities and nothing "
                                  "after the second expert GEMM keeps its output "
                                  "(Megatron-Core from 0.13)")
    host_dispatch: HostDispatch | None = Field(
        default=None, description="how kernels are dispatched: eager (PyTorch from Python, op "
                                  "by op), compiled (torch.compile: a compiled wrapper "
                                  "launches them) or cuda_graphs (captured graphs); sets the "
                                  "host time per kernel (docs/compute.md)")
    batch_attention_mask: BatchMask | None = Field(
        default=None, description="where each micro-batch's dense [s, s] attention mask comes "
                                  "from: dataloader (the dataset builds it per sample; the "
                                  "batch, mask included, is copied to the device and "
                                  "broadcast over TP: Megatron-Core's "
                                  "get_batch_on_this_tp_rank), device (built on the GPU: "
                                  "Megatron-LM 2021's get_ltor_masks_and_position_ids, not "
                                  "charged) or none (the attention kernel masks by itself); "
                                  "workloads/decoder/batch_input.py")


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
    zero3_reduce_bucket_size: Elements | None = Field(
        default=None,
        description="per_tensor ZeRO-3: a gradient of more elements than this is "
                    "reduce-scattered by itself from the next gradient hook, after its "
                    "module's release has synchronised the compute stream, so the host "
                    "issues it once the module's backward has ended (DeepSpeed "
                    "reduce_bucket_size); 0: every issue beside the module's backward")
    zero3_implementation: Zero3Implementation | None = Field(
        default=None,
        description="whose code runs a ZeRO-3 plan: the stack's own (torch_fsdp, "
                    "torch_fsdp2, deepspeed) or megatron_fsdp (Megatron-Core's "
                    "Megatron-FSDP, --use-custom-fsdp --data-parallel-sharding-strategy "
                    "optim_grads_params: experts sharded over the expert data-parallel "
                    "group; megatron-core-2025 only, docs/moe.md)")

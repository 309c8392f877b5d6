"""How each training framework holds its loss temporaries and communication buffers: the
rules of :mod:`.allocator` keyed by the framework a software stack belongs to
(:func:`framework`, a registry whose keys prefix the stack names of
``ddlsim/data/software.yaml``), each field with where it was read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .pipeline_recv import TORCH_PP_RECV

__all__ = ["FrameworkMemory", "FRAMEWORKS", "framework"]


@dataclass(frozen=True)
class FrameworkMemory:
    """How one training framework holds its loss temporaries and communication buffers.

    Attributes
    ----------
    name : the framework (a prefix of its stacks' names).
    logit_bytes : bytes per logit element (micro-batch × sequence × vocabulary on one rank)
        held at the loss's peak, beside the kept activations.
    fsdp2 : ZeRO-3 runs as PyTorch FSDP2 (``fully_shard``): a unit's backward holds its
        unsharded gradients and its reduce-scatter input in the reduce dtype; under pipelining
        the stage keeps its parameters gathered and accumulates unsharded gradients in the
        reduce dtype (:func:`comm_buffer_bytes`).
    kept_root : the edge parameters FSDP2 keeps gathered from the forward to the backward:
        ``edges`` (embedding and head: the root unit), ``head`` (the [norm, output] unit), or
        ``none``.
    reduce_bucket_elements : elements of a ZeRO-1/2 gradient bucket allocated beside the
        gradients (one, two when the reduction overlaps the backward), 0 where the buckets
        are views into the gradients.
    step_bytes : bytes per parameter the optimizer step allocates for the time of the step
        without ZeRO in fp16 (:func:`step_temporaries`), 0 where it allocates none.
    logit_bytes_tp : bytes per logit under tensor parallelism where the loss runs another
        code path there (torchtitan's loss parallelism), None where it is the same.
    logit_bytes_compiled : bytes per logit when the stack's ``compile`` compiles the loss
        too, None where compiling leaves the loss eager.
    logit_bytes_te : bytes per logit under Transformer Engine's cross-entropy
        (``fused_cross_entropy`` with ``cross_entropy_fusion_impl: te``), None where the
        framework cannot run it.
    pipeline_holds_outputs : the pipeline schedule keeps each stage's output tensor until its
        micro-batch's backward, and the last stage's outputs (the logits) until the step ends
        (:func:`pipeline_held_bytes`); False where the schedule frees them after the send.
    pipeline_keeps_every_output : under :attr:`pipeline_holds_outputs`, every stage (not
        only the last) keeps each of its (micro-batch, chunk) outputs until the step ends,
        after the micro-batch's backward too (torch before pytorch#153383).
    pipeline_recv_buffers : the pipeline runtime keeps a receive buffer per micro-batch for
        each stage's input and output gradient (:func:`.pipeline_recv.pipeline_recv_bytes`).
    head_widths : (split, whole): 16-bit tensors of width ``h`` per token that the final norm
        and the output head keep for the backward outside the checkpointed blocks, split over
        TP under sequence parallelism or whole (:func:`head_bytes`); (0, 0) where they are
        not counted apart from the layers.
    sources : field → where it was read.
    """

    name: str
    logit_bytes: float
    fsdp2: bool
    kept_root: str
    reduce_bucket_elements: float
    sources: dict
    step_bytes: float = 0.0
    head_widths: tuple = (0, 0)
    logit_bytes_tp: float | None = None
    logit_bytes_compiled: float | None = None
    logit_bytes_te: float | None = None
    pipeline_holds_outputs: bool = False
    pipeline_keeps_every_output: bool = False
    pipeline_recv_buffers: bool = False

    def logits_at(self, t, compiled: bool = False, cross_entropy: str = "unfused"):
        """Bytes per logit with ``t`` tensor-parallel ranks: :attr:`logit_bytes_te` under
        Transformer Engine's cross-entropy (``cross_entropy`` ``"te"``, the name
        :func:`~ddlsim.simulator.kernels.step_passes.cross_entropy_impl` gives), else
        :attr:`logit_bytes_compiled` when the stack compiles the loss (``compiled``) and the
        framework says what that keeps, else :attr:`logit_bytes_tp` where ``t > 1`` and the
        loss differs under TP, else :attr:`logit_bytes` (``t`` may be an array over plans).

        Raises
        ------
        ConfigError
            for ``"te"`` in a framework without Transformer Engine's cross-entropy."""
        if cross_entropy == "te":
            if self.logit_bytes_te is None:
                raise ConfigError(f"system.software.kernels.cross_entropy_fusion_impl = 'te' "
                                  f"(Transformer Engine's cross-entropy) does not run in "
                                  f"{self.name}'s stacks; allowed there: native")
            return self.logit_bytes_te
        if compiled and self.logit_bytes_compiled is not None:
            return self.logit_bytes_compiled
        if self.logit_bytes_tp is None:
            return self.logit_bytes
        return _scalar(np.where(np.asarray(t) > 1, self.logit_bytes_tp, self.logit_bytes))


#: framework name → its memory rules; a stack belongs to the longest name that prefixes it
FRAMEWORKS: dict[str, FrameworkMemory] = {}


def _register(fm: FrameworkMemory) -> None:
    FRAMEWORKS[fm.name] = fm


_MEGATRON_LOSS = ("Megatron-LM megatron/core/tensor_parallel/cross_entropy.py "
                  "(_VocabParallelCrossEntropy): the 16-bit vocab-parallel logits and one fp32 "
                  "tensor of their size (the logits cast to fp32, exponentiated in place, kept "
                  "for the backward, whose softmax gradient reuses it)")
_TE_LOSS = ("Transformer Engine v2.7 (fedd9ddc) pytorch/cross_entropy.py CrossEntropyFunction "
            "with triton/cross_entropy.py cross_entropy_forward, the same at c6a9e261 (2025-05, "
            "megatron-core-2025's date) and through v2.14 (f031cf87): "
            "the softmax gradient is written into the 16-bit logits in place "
            "(cross_entropy_kernel), which ctx.save_for_backward keeps for the backward's "
            "in-place multiply; no fp32 copy: 2 B per logit, beside 12 B per token of fp32 "
            "max, sum and target logit (not counted). Megatron-Core calls it under "
            "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te (0f60adbd, "
            "2025-03-08; d7288711 language_module.py lines 141-164). TE v2.18 (01bbe3ee, "
            "2026-07) keeps an fp32 gradient instead (4 B more): no stack here runs it")
_TITAN_LOSS = ("cross_entropy(pred.flatten(0, 1).float(), labels), pred deleted before the "
               "backward: the loss's backward holds the saved fp32 log-softmax output, "
               "nll_loss's dense fp32 gradient and log_softmax's fp32 input gradient (3 x 4 B "
               "per logit; the forward's peak, 2 + 4 + 4 B, is lower)")
_TITAN_HEAD = ("torchtitan's Transformer.forward runs h = norm(h); output(h) outside the "
               "checkpointed blocks (apply_ac wraps model.layers only): the RMSNorm in torch ops "
               "(norms.py: x * rsqrt(mean(x^2) + eps) * weight) keeps its input and its "
               "normalised output, split over TP by SequenceParallel; the head's mm keeps its "
               "input, gathered to the whole sequence by ColwiseParallel(input_layouts=Shard(1))")
_TITAN_LOSS_TP = ("with TP, torchtitan's loss_parallel (parallelize_llama.py: loss_parallel "
                  "when TP > 1) runs torch/distributed/tensor/parallel/loss.py on the vocab "
                  "shards: the forward's _log_softmax holds the 16-bit logits, the fp32 "
                  "logits, shifted = x - max and exp(shifted) at once (2 + 3 x 4 B per logit), "
                  "and the backward's _nll_loss_and_log_softmax_backward (log_softmax's "
                  "backward folded into nll_loss's) the saved fp32 log-softmax x, grad_input = "
                  "zeros_like(x) (scattered in place), torch.exp(x), their sum and its "
                  "product with grad_output: 4 x 4 B per logit, the larger (pred deleted "
                  "before the backward in train.py)")
_TORCH_PP = ("PyTorch torch/distributed/pipelining/stage.py forward_one_chunk: "
             "self.fwd_cache[fwd_chunk_id] = (output_tuple, flatten_input_tensors), popped by "
             "backward_one_chunk (the stage's output held per micro-batch in flight), and "
             "self.output_chunks.append(output), which step() merges and returns on the last "
             "stage: every micro-batch's logits held to the step's end until PyTorch "
             "pytorch#165822 (2025-10) added step(return_outputs=False), which torchtitan "
             "e5ef99a (2025-10-22, 'Update PP to release memory earlier') passes; both "
             "torchtitan stacks are older")
_TORCH_PP_EVERY = ("PyTorch torch/distributed/pipelining/stage.py forward_one_chunk appended "
                   "every stage's output to self.output_chunks, cleared only when step() ends, "
                   "until pytorch#153383 (merged 2025-05-13, '[PP] Optimize memory usage by "
                   "releasing output memory earlier': append only on the last stage); "
                   "torchtitan 9dec370 (2024-12-26) runs the torch before it, torchtitan "
                   "07c00d9 (2025-08-31) the torch after it")
_MEGATRON_PP = ("Megatron-Core pipeline_parallel/schedules.py deallocate_output_tensor: after "
                "the send, the output's .data is replaced by a 1-element tensor "
                "(deallocate_pipeline_outputs), and the last stage keeps only the loss")
_FSDP2 = ("PyTorch torch/distributed/fsdp/_fully_shard: _fsdp_collectives.py foreach_reduce "
          "copies a unit's unsharded gradients into a reduce-scatter input of the unit's size in "
          "reduce_dtype (fp32 in torchtitan); _fsdp_param.py to_accumulated_grad_if_needed: "
          "without gradient sync (pipelining) the unsharded gradients accumulate in "
          "reduce_dtype")

_register(FrameworkMemory(
    "megatron", logit_bytes=2 + 4, fsdp2=False, kept_root="none", reduce_bucket_elements=0,
    head_widths=(2, 0), logit_bytes_te=2,
    sources={
        "logit_bytes": _MEGATRON_LOSS, "logit_bytes_te": _TE_LOSS,
        "head_widths": "Megatron-Core TransformerBlock.final_layernorm runs after the "
                       "(checkpointed) layers and keeps its input, the last layer's output "
                       "(the layers' own norm inputs count in Korthikanti et al.'s per-layer "
                       "figure, this one in none); the output layer "
                       "(tensor_parallel/layers.py LinearWithGradAccumulationAndAsync"
                       "Communication) saves its input, the norm's output, as the rank's "
                       "sequence shard under sequence parallelism and all-gathers it again in "
                       "the backward: two 16-bit h-wide tensors split over TP under SP",
        "reduce_bucket_elements": "Megatron-Core distributed/param_and_grad_buffer.py: the "
                                  "buckets are views into the contiguous gradient buffer "
                                  "(counted as the gradients)",
        "pipeline_holds_outputs": _MEGATRON_PP}))

_register(FrameworkMemory(
    "deepspeed", logit_bytes=2 + 4, fsdp2=False, kept_root="none", reduce_bucket_elements=5e8,
    sources={
        "logit_bytes": "Megatron-DeepSpeed keeps Megatron-LM's vocab-parallel cross-entropy: "
                       + _MEGATRON_LOSS,
        "reduce_bucket_elements": "DeepSpeed runtime/zero/stage_1_and_2.py backward(): with "
                                  "contiguous_gradients, ipg_buffer = torch.empty("
                                  "reduce_bucket_size) in the model dtype, and a second "
                                  "('double buffers') when overlap_comm; reduce_bucket_size "
                                  "defaults to 5e8 (DeepSpeed config docs, "
                                  "zero_optimization.reduce_bucket_size)",
        "step_bytes": "DeepSpeed runtime/fp16/fused_optimizer.py FP16_Optimizer.step() (ZeRO "
                      "off): _flatten_dense_tensors([p.grad.to(fp32) for p in group]) builds "
                      "an fp32 copy of every gradient, then their flat fp32 concatenation, "
                      "before the 16-bit gradients are dropped: 4 + 4 B per parameter"},
    step_bytes=4 + 4))

_register(FrameworkMemory(
    "torchtitan", logit_bytes=4 + 4 + 4, fsdp2=True, kept_root="edges",
    reduce_bucket_elements=0,
    sources={
        "logit_bytes": "torchtitan 9dec370 train.py lines 131-133 and 303-308: " + _TITAN_LOSS,
        "fsdp2": _FSDP2,
        "kept_root": "torchtitan 9dec370 torchtitan/parallelisms/parallelize_llama.py lines "
                     "325-339: fully_shard per transformer block, then the root (embeddings, "
                     "norm, output); PyTorch _fsdp_state.py _lazy_init: 'For the root, do not "
                     "reshard after forward' (post_forward_mesh_info = None)",
        "head_widths": _TITAN_HEAD, "logit_bytes_tp": _TITAN_LOSS_TP,
        "pipeline_holds_outputs": _TORCH_PP, "pipeline_keeps_every_output": _TORCH_PP_EVERY,
        "pipeline_recv_buffers": TORCH_PP_RECV},
    head_widths=(2, 1), logit_bytes_tp=4 + 4 + 4 + 4, pipeline_holds_outputs=True,
    pipeline_keeps_every_output=True, pipeline_recv_buffers=True))

_register(FrameworkMemory(
    "torchtitan-2025", logit_bytes=4 + 4 + 4, fsdp2=True, kept_root="head",
    logit_bytes_compiled=2 + 2,
    reduce_bucket_elements=0,
    sources={
        "logit_bytes": "torchtitan 07c00d9 torchtitan/components/loss.py lines 18-22 "
                       "(eager; compile.components 'loss' is not modelled): " + _TITAN_LOSS,
        "fsdp2": _FSDP2,
        "kept_root": "torchtitan 07c00d9 torchtitan/models/llama3/infra/parallelize.py lines "
                     "279-299: the embedding is its own unit, resharded after forward; "
                     "[norm, output] one unit with reshard_after_forward only under 'always' "
                     "('FSDP would prefetch them immediately after the forward pass')",
        "head_widths": _TITAN_HEAD, "logit_bytes_tp": _TITAN_LOSS_TP,
        "logit_bytes_compiled": "torchtitan 07c00d9 config/job_config.py lines 554-561 "
                                "(compile.components default ['model', 'loss']) and "
                                "components/loss.py line 27: with compile the loss function is "
                                "torch.compile'd; derived, not measured: Inductor fuses the fp32 "
                                "cast, log-softmax and nll into row reductions, keeping the "
                                "16-bit logits and writing their 16-bit gradient (2 + 2 B)",
        "pipeline_holds_outputs": _TORCH_PP, "pipeline_recv_buffers": TORCH_PP_RECV},
    head_widths=(2, 1), logit_bytes_tp=4 + 4 + 4 + 4, pipeline_holds_outputs=True,
    pipeline_recv_buffers=True))


_register(FrameworkMemory(
    "fms-fsdp", logit_bytes=2 + 2 + 2 + 2, fsdp2=False, kept_root="edges",
    reduce_bucket_elements=0,
    sources={
        "logit_bytes": "fms-fsdp ed74fd5d fms_fsdp/utils/train_utils.py lines 86-92: "
                       "output = model(input) (fms 953ef99b fms/models/llama.py: the head's "
                       "bf16 logits, no upcast), CrossEntropyLoss on them and loss.backward() "
                       "with output still alive (deleted only from 5a296afe, 2025-07, 'free "
                       "logits'): the bf16 logits, log_softmax's saved bf16 output, nll_loss's "
                       "dense bf16 gradient and log_softmax's bf16 input gradient (4 x 2 B per "
                       "logit at the backward's peak)",
        "kept_root": "fms-fsdp ed74fd5d main_training.py lines 82-91: FSDP1 around the whole "
                     "model with transformer_auto_wrap_policy on LLaMABlock: the embedding, "
                     "final norm and head are the root unit, which FSDP1 never reshards "
                     "after its forward",
        "head_widths": "fms 953ef99b fms/models/llama.py: dec_norm (LayerNormParameterized: "
                       "x * rsqrt(mean(x^2) + eps) * weight in torch ops) then the head, outside "
                       "the checkpointed LLaMABlocks: the norm keeps its input and its output, "
                       "the head's matmul its input, as torchtitan's (no tensor parallelism)"},
    head_widths=(2, 1)))


def framework(stack: str) -> FrameworkMemory:
    """The memory rules of the framework a software stack belongs to: the registered name
    that prefixes ``stack`` (the longest, should two).

    Raises
    ------
    ConfigError
        When no registered framework prefixes the stack's name.
    """
    hits = [k for k in FRAMEWORKS if stack.startswith(k)]
    if not hits:
        raise ConfigError(f"system.software: the stack {stack!r} belongs to no framework whose "
                          f"memory ddlsim models; allowed: stacks named after "
                          f"{', '.join(sorted(FRAMEWORKS))}")
    return FRAMEWORKS[max(hits, key=len)]


def _scalar(x):
    """A 0-d array back to a float (one plan); arrays over plans unchanged."""
    a = np.asarray(x)
    return float(a) if a.ndim == 0 else a

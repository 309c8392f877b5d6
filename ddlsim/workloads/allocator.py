"""Memory a training process holds beyond its model states and kept activations: the
communication buffers and loss temporaries its framework allocates through PyTorch's caching
allocator, and the CUDA context outside it.

``torch.cuda.max_memory_reserved()`` (what torchtitan logs as a step's memory) counts the
caching allocator's segments: model states, activations, temporaries and buffers. It does not
count the CUDA context (driver state and the loaded kernels) or what NCCL allocates itself, yet
both take device memory, so "does it fit?" adds them (:func:`context_bytes`).

How each framework lays its buffers out differs, so the rules are keyed by the framework a
software stack belongs to (:func:`framework`, a registry whose keys prefix the stack names of
``ddlsim/data/software.yaml``). Every function takes scalars or numpy arrays over plans (the
search tier calls the same rules).

Not modelled (named so that nobody reads them into the figures): the caching allocator's
fragmentation (the reserve beyond the live blocks; runs with ``expandable_segments:True``, as
torchtitan's launch script sets, keep it small, and Guo et al. 2024 (GMLake, ASPLOS) measured
15 % on average without it on LLM fine-tuning with recomputation), NCCL's buffers per system
(``NCCL_BUFFSIZE``, 4 MiB per channel and peer: the channel counts are not known per system
here, so one measured communicator size is used everywhere, :data:`NCCL_COMM_BYTES`), and
PyTorch DDP's gradient buckets (no decoder stack uses PyTorch DDP: Megatron's buckets are views
into its contiguous gradient buffer). docs/memory.md lists the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .pipeline_recv import TORCH_PP_RECV

__all__ = ["FrameworkMemory", "FRAMEWORKS", "framework", "loss_bytes", "head_bytes",
           "comm_buffer_bytes", "step_temporaries", "context_bytes", "pipeline_held_bytes",
           "CUDA_CONTEXT_BYTES", "NCCL_COMM_BYTES"]

#: CUDA context with PyTorch's kernels loaded, measured with NVML after the first CUDA tensor
#: of a PyTorch process: 1,343 MiB (Hugging Face transformers docs, "Model training anatomy",
#: docs/source/en/model_memory_anatomy.md: ``torch.ones((1, 1)).to("cuda")`` then
#: ``nvmlDeviceGetMemoryInfo(...).used // 1024**2`` prints 1343 MB). Outside the allocator.
CUDA_CONTEXT_BYTES = 1343 * 2**20

#: Device memory of one NCCL communicator on one rank after its first all-reduce, measured with
#: PyTorch on 4 A100s with NVLink: 544 MB for a group of 2 ranks, 688 MB for more (NVIDIA/nccl
#: issue #964, 2023-08; taken as MiB). NCCL's maintainers (issue #986): the memory grows with
#: the channels, a ring's with its 2 connections whatever the scale, not beyond 2 nodes.
#: Outside the caching allocator.
NCCL_COMM_BYTES = {2: 544 * 2**20, "more": 688 * 2**20}


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


def loss_bytes(logit_bytes: float, b, s: int, vocab: int, tp_cp):
    """Bytes the loss holds at its peak on one rank of the last stage: ``logit_bytes`` (a
    framework's :attr:`FrameworkMemory.logit_bytes`) per logit of the micro-batch
    (``b·s·V/(t·c)`` logits: the head is split over TP and the sequence over CP). ``b`` and
    ``tp_cp`` may be arrays over plans."""
    return b * s * vocab / tp_cp * logit_bytes


def head_bytes(fm: FrameworkMemory, hidden: int, t, sp):
    """Bytes per token of the rank's sequence that the final norm and the head keep on the
    last stage (:attr:`FrameworkMemory.head_widths`): ``2·h·(split/t' + whole)`` with ``t' = t``
    under sequence parallelism, else 1 (``t`` and ``sp`` may be arrays over plans)."""
    split, whole = fm.head_widths
    if not (split or whole):
        return 0.0
    t_sp = np.where(sp, t, 1)
    return _scalar(2.0 * hidden * (split / t_sp + whole))


def comm_buffer_bytes(fm: FrameworkMemory, zero_stage, dp, gathered, unit_params, kept_params,
                      param_bytes: float, reduce_bytes: float, stage_params, overlap: bool,
                      per_iteration):
    """Communication buffers on one rank at the peak, in bytes.

    Parameters
    ----------
    fm : the framework's rules (:func:`framework`).
    zero_stage, dp : the plan's ZeRO stage and data-parallel size (arrays allowed).
    gathered : ZeRO-3's gathered parameters in flight (bytes; 0 outside ZeRO-3).
    unit_params : parameters of the largest ZeRO-3 unit (a layer) on the rank.
    kept_params : edge parameters FSDP2 keeps gathered (:attr:`FrameworkMemory.kept_root`).
    param_bytes, reduce_bytes : bytes per unsharded parameter and per reduced gradient.
    stage_params : parameters on the rank before sharding.
    overlap : the gradient reduction overlaps the backward (DeepSpeed's overlap_comm: two
        buckets).
    per_iteration : FSDP gathers the stage once per iteration (pipelining,
        :func:`ddlsim.workloads.decoder.fsdp.per_iteration`; arrays allowed).

    Returns
    -------
    Bytes. ZeRO-3: ``gathered``; under FSDP2 per micro-batch also the kept edges and one
    unit's unsharded gradients and reduce-scatter input, ``kept·p + unit·(p + r)``, and per
    iteration the whole stage gathered with its gradients accumulated, ``stage·(p + r)``.
    ZeRO-1/2 with separate buckets: ``(1 + overlap) · min(bucket, stage params) · p``.
    """
    zero_stage = np.asarray(zero_stage)
    z3 = zero_stage == 3
    out = np.where(z3, gathered, 0.0)
    if fm.fsdp2:
        per_mb = gathered + kept_params * param_bytes + unit_params * (param_bytes + reduce_bytes)
        whole = stage_params * (param_bytes + reduce_bytes)
        out = np.where(z3, np.where(per_iteration, whole, per_mb), 0.0)
    if fm.reduce_bucket_elements:
        zero12 = (zero_stage >= 1) & ~z3 & (np.asarray(dp) > 1)
        bucket = (1 + bool(overlap)) * np.minimum(fm.reduce_bucket_elements, stage_params)
        out = out + np.where(zero12, bucket * param_bytes, 0.0)
    return _scalar(out)


def step_temporaries(fm: FrameworkMemory, zero_stage, fp16: bool, params):
    """Bytes the optimizer step allocates on one rank for the time of the step:
    ``fm.step_bytes`` per parameter without ZeRO in fp16 (DeepSpeed's FP16_Optimizer; its bf16
    optimizer is another code path, not modelled), else 0 (arrays allowed).

    The step runs after the backward has freed the activations, so it raises the peak only by
    what exceeds them: the caching allocator reuses freed blocks and, when cudaMalloc fails,
    frees its cached blocks and retries (PyTorch c10/cuda/CUDACachingAllocator.cpp, header
    comment) — the peak is the larger phase (:func:`ddlsim.workloads.decoder.memory.
    stage_activations` takes the larger of the two as the temporaries)."""
    if not (fp16 and fm.step_bytes):
        return 0.0
    return _scalar(np.where(np.asarray(zero_stage) == 0, fm.step_bytes * params, 0.0))


def pipeline_held_bytes(fm: FrameworkMemory, b, s: int, hidden: int, vocab: int, t, sp, cp,
                        pp, vpp, chunks, microbatches, last, compiled: bool = False):
    """Bytes the pipeline schedule itself holds on one rank at the peak, beyond what the
    layers keep (:attr:`FrameworkMemory.pipeline_holds_outputs`; 0 without pipelining or
    where the schedule frees its outputs). Arguments but ``s``, ``hidden`` and ``vocab`` may
    be arrays over plans.

    * every (micro-batch, model chunk) forward in flight of a stage that is not the last
      keeps the stage's 16-bit output, ``2·b·s·h/(t'·c)`` with ``t' = t`` under sequence
      parallelism, else 1 (the chunks of the rank's other stages on the last one:
      ``chunks·(vpp − 1)/vpp``); under :attr:`FrameworkMemory.pipeline_keeps_every_output`
      every forward of the step, ``m·vpp`` (``m·(vpp − 1)`` on the last rank), all of which
      are held once the last forward has run, while the last micro-batches' activations
      are still in flight;
    * the last stage keeps the 16-bit logits of every micro-batch, ``m·2·b·s·V/(t·c)``: the
      current one's too, beside its loss's backward, which the eager loss rules count
      without them (torchtitan's step deletes ``pred`` before the backward, the schedule
      keeps it); ``m − 1`` where the loss is compiled and its rule counts the logits
      (:attr:`FrameworkMemory.logit_bytes_compiled`).

    Parameters
    ----------
    fm : the framework's rules (:func:`framework`).
    b, s : micro-batch size and sequence length (the whole sequence; ``cp`` splits it).
    hidden, vocab : the model's width and vocabulary.
    t, sp, cp : tensor-parallel ranks, sequence parallelism, context-parallel ranks.
    pp, vpp : pipeline stages and model chunks per rank.
    chunks : (micro-batch, chunk) forwards in flight at the peak
        (:func:`~ddlsim.workloads.schedules.peak_inflight`).
    microbatches : micro-batches per iteration, ``m``.
    last : the rank holds the last stage.
    compiled : the stack compiles the loss (``software.compile``).

    Returns
    -------
    float or numpy.ndarray
        Bytes on the rank (an array where any argument is one).
    """
    if not fm.pipeline_holds_outputs:
        return 0.0
    output = 2.0 * b * s * hidden / (np.where(sp, t, 1) * cp)
    logits = 2.0 * b * s * vocab / (np.asarray(t) * cp)
    if fm.pipeline_keeps_every_output:
        others = np.asarray(microbatches) * (np.asarray(vpp) - np.where(last, 1, 0))
    else:
        others = np.asarray(chunks) * (1 - np.where(last, 1 / np.asarray(vpp), 0.0))
    current = 0 if compiled and fm.logit_bytes_compiled is not None else 1
    held = output * others + np.where(last, logits * (np.asarray(microbatches) - 1 + current),
                                      0.0)
    return _scalar(np.where(np.asarray(pp) > 1, held, 0.0))


def context_bytes(device, groups=()):
    """Device memory a process holds outside the caching allocator, on a GPU (a device with
    streaming multiprocessors, ``sm_count``; 0 on a CPU socket acting as a rank): the CUDA
    context with its kernels (:data:`CUDA_CONTEXT_BYTES`) and one NCCL communicator per
    process group of more than one rank the plan communicates over (:data:`NCCL_COMM_BYTES`).

    Parameters
    ----------
    device : the system's device spec.
    groups : the sizes of the rank's process groups (ints or arrays over plans).
    """
    if not device.sm_count:
        return 0.0
    out = float(CUDA_CONTEXT_BYTES)
    for n in groups:
        n = np.asarray(n)
        out = out + np.where(n == 2, NCCL_COMM_BYTES[2],
                             np.where(n > 2, NCCL_COMM_BYTES["more"], 0))
    return _scalar(out)


def _scalar(x):
    """A 0-d array back to a float (one plan); arrays over plans unchanged."""
    a = np.asarray(x)
    return float(a) if a.ndim == 0 else a

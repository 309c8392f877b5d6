"""Memory a training process holds beyond its model states and kept activations: the
communication buffers and loss temporaries its framework allocates through PyTorch's caching
allocator, and the CUDA context outside it.

``torch.cuda.max_memory_reserved()`` (what torchtitan logs as a step's memory) counts the
caching allocator's segments: model states, activations, temporaries and buffers. It does not
count the CUDA context (driver state and the loaded kernels) or what NCCL allocates itself, yet
both take device memory, so "does it fit?" adds them (:func:`context_bytes`).

How each framework lays its buffers out differs, so the rules take the framework a software
stack belongs to (:class:`~.framework_memory.FrameworkMemory`, from the registry of
:func:`.framework_memory.framework`, whose keys prefix the stack names of
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

import numpy as np

from .framework_memory import FrameworkMemory, _scalar
from .framework_memory import framework  # noqa: F401 (search/decodermemory.py imports it)

__all__ = ["loss_bytes", "head_bytes", "comm_buffer_bytes", "step_temporaries",
           "context_bytes", "pipeline_held_bytes", "CUDA_CONTEXT_BYTES", "NCCL_COMM_BYTES"]

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

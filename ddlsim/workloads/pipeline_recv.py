"""Receive buffers that PyTorch's pipeline runtime (``torch.distributed.pipelining``, the
torchtitan stacks' pipelining) allocates once per micro-batch and keeps for the whole run.

A stage prepares its communication before the first step: one receive buffer of its input
for every micro-batch of the step (every stage but the first) and one of its output's gradient
for every micro-batch (every stage but the last). Each is a tensor of the stage's
inter-stage activation; the runtime receives into it (``irecv``) and hands the buffer itself
to the forward or the backward, so nothing frees it between steps. Where a micro-batch's
forward is in flight, its input buffer is the first layer's input, which the layers' kept
activations already count; every other buffer comes on top.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TORCH_PP_RECV", "pipeline_recv_bytes"]

#: where the rule was read
TORCH_PP_RECV = ("PyTorch torch/distributed/pipelining/stage.py (torch 2.5-2.6, the torch of "
                 "torchtitan 9dec370, and later): _PipelineStage._prepare_forward_infra "
                 "builds, for chunk_id in range(num_microbatches), args_recv_info[chunk_id] = "
                 "_RecvInfo(..., _make_tensor_from_meta(inp, self.device)) on every stage but "
                 "the first; _prepare_backward_infra builds grad_recv_info[mb_index] = "
                 "_create_grad_recv_info(act_send_info) for each micro-batch, a buffer per "
                 "output on every stage but the last; _get_recv_ops irecv's into info.buffer, "
                 "_retrieve_recv_activations / _retrieve_recv_grads return the buffers "
                 "themselves, and no step frees them")


def pipeline_recv_bytes(fm, b, s: int, hidden: int, t, sp, cp, pp, vpp, chunks,
                        microbatches, first, last, elem_bytes: float):
    """Bytes of the pipeline runtime's receive buffers on one rank beyond what its layers
    keep: a communication buffer (the breakdown's ``buffers``). Arguments but ``s`` and
    ``hidden`` may be arrays over plans (the search tier calls this rule).

    Parameters
    ----------
    fm : FrameworkMemory
        The framework's rules; 0 unless :attr:`~.framework_memory.FrameworkMemory.
        pipeline_recv_buffers`.
    b, s : micro-batch size and sequence length (the whole sequence; ``cp`` splits it).
    hidden : the model's width, ``h``.
    t, sp, cp : tensor-parallel ranks, sequence parallelism, context-parallel ranks; one
        buffer is the stage's output, ``e·b·s·h/(t'·cp)`` with ``t' = t`` under sequence
        parallelism, else 1.
    pp, vpp : pipeline stages and model chunks (stages) per rank (``vpp`` >= 1); the bytes
        are 0 where ``pp`` is 1.
    chunks : (micro-batch, chunk) forwards in flight at the rank's peak
        (:func:`~ddlsim.workloads.schedules.peak_inflight`).
    microbatches : micro-batches per step, ``m``.
    first, last : the rank holds the first stage (whose input, the token ids, comes from no
        stage) / the last stage (whose output gradient comes from the loss).
    elem_bytes : bytes of one element of a stage's output, ``e``: the run's compute dtype
        (bf16 under FP8, whose GEMMs alone run in 8 bits; 4 for an fp32 run).

    Returns
    -------
    float or ndarray
        ``out · (m·(vpp − first) + m·(vpp − last) − chunks·(vpp − first)/vpp)``, ``out`` one
        buffer: an input buffer per micro-batch on each chunk with a previous stage and an
        output-gradient buffer per micro-batch on each chunk with a next stage, less the input
        buffers of the forwards in flight on chunks with a previous stage (the first layer's
        inputs, counted with the activations; in-flight forwards spread evenly over the
        rank's chunks).

    References
    ----------
    :data:`TORCH_PP_RECV`.
    """
    if not fm.pipeline_recv_buffers:
        return 0.0
    # plain arithmetic, the same for scalars and arrays over plans (bools count as 0/1)
    out = elem_bytes * b * s * hidden / ((sp * t + (1 - sp)) * cp)
    with_prev, with_next = vpp - 1 * first, vpp - 1 * last
    held = out * (microbatches * (with_prev + with_next) - chunks * with_prev / vpp) * (pp > 1)
    return float(held) if np.ndim(held) == 0 else held

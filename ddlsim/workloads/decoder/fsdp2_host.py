"""FSDP2's host time: its hooks per unit and pass, ``_chunk_cat``'s metadata and the
optimizer step over DTensors, as torch's ``fully_shard`` code runs them (its memory passes are
:mod:`.fsdp2_passes`'s).

**Host time of the hooks** (:func:`hook_seconds`). ``fully_shard``'s hooks run Python per
unit and per parameter on the host: ``pre_forward`` and ``pre_backward`` (the unshard: the
shard's cast, the copy-in, the all-gather's issue, the copy-out, the unsharded parameters'
DTensor views; the backward prefetch inside ``pre_backward``), ``post_forward`` (the
reshard) and ``post_backward`` (``foreach_reduce``: ``chunk_cat``, the reduce-scatter's
issue, the new sharded gradients, the reshard). Per unit of ``T`` parameter tensors and pass,
``(a + b·T)`` tiny ops (:data:`HOOK_TINY_OPS`: ``a`` and ``b`` at one rank and sharded,
forward and backward), a tiny op being the device's time for a 1-element op in a Python loop
(:func:`tiny_op_s`: the launch facts' ``eager_op_s + host_launch_s``; on a CPU, whose facts
give the dispatch as the gap, ``stream_gap_s``). Measured on a CPU
(``benchmarks/fsdp2_host_costs.py``: tiny units under ``fully_shard`` against the same units
bare; sharded on torch's fake process group, where no collective runs, so the figures are
FSDP2's path alone, for any backend); the H200's one-rank trace agrees to within its profiler
(below, :data:`HOOK_TINY_OPS`). Where the host is the device (a CPU, :func:`host_is_device`)
the unit's kernels run on the core that runs its hooks and stream its weights and activations
past that core's caches between two units' hooks, so the hooks refetch their code and data:
there they are charged :data:`COLD_HOOK_TINY_OPS`, the same benchmark's figures with each unit
evicting the caches as the torch loop's calibration flushes them (``--evict llc``), 1.5-1.6
times the hot ones for a sharded block (2.1-2.3 at one rank); a GPU's host runs no kernel and
keeps the hot figures. The hooks run on
the host whatever the blocks' dispatch
(torchtitan compiles each block, ``apply_compile``, before ``fully_shard`` registers
its hooks around it), so :mod:`.zero3_pass`
lays them on the ``host`` stream under every mode but CUDA graphs, before the unit's compute
(the pre-hook) and after it (the post-hook). On a GPU the host runs ahead of the device: the
post-hook follows the host's issue of the unit (its pre-hook and, under eager dispatch, its
layer ops' host work, :mod:`.eager_host`), not the unit's end on the device, and the
backward's holds ``_chunk_cat``'s metadata (:func:`chunk_cat_host_seconds`: one entry per
2 KiB of output, 1.8 ms a Llama 3.1 8B block on the H200's host), which the ``chunk_cat``
kernel waits for; on a CPU, host and device are one processor and the post-hook waits for
the unit. Not charged: what a backend's collectives cost
the host beyond their own time (the collectives are timed by their cost model): on the torch
loop's CPU the two-rank Gloo runs, their collectives' time taken off, read 287-337 tiny ops a
unit forward and 167-802 backward against the fake process group's 215-245 and 263-309: too
noisy to charge (two ranks on two cores, Gloo's blocking collectives as long as the hooks).

**The optimizer step over DTensors** (:func:`step_host_seconds`): torch's single-tensor
Adam/AdamW (``fused_optimizer`` false: the loop torch runs on a CPU, ``torch/optim/
optimizer.py`` ``_default_to_fused_or_foreach`` picks foreach only for CUDA tensors) runs
:data:`STEP_OPS_PER_TENSOR` ATen ops per parameter tensor, each dispatched through DTensor
(sharding propagation, unwrapping and wrapping): :data:`DTENSOR_OP_TINY_OPS` tiny ops more
per op, laid on the ``host`` stream before the step (:meth:`.update.UpdateOps._step_ops`).
A fused step (``_fused_adamw_``, one call per device and dtype group: torchtitan's default,
``fused_optimizer`` true) or a foreach one pays DTensor once per list op, tens of µs a step:
not charged: an unfused step is single-tensor only on a CPU (:func:`host_is_device`), where
the torch loop runs it; on CUDA torch defaults to foreach (torchtitan 9dec370 asks for it:
``foreach = not fused``).

Both are host-stream ops, not :attr:`~ddlsim.workloads.payloads.Compute.host_s`: on a CPU
(launch facts with no host lead) ``max(Σ t + n·g, n·h + host_s)`` would hide them under the
op's own time, where the CPU runs them one after the other; on the ``host`` stream the unit's
compute waits for them, and the host's work runs ahead of a GPU's as far as the gathers let
it.
"""

from __future__ import annotations

__all__ = ["HOOK_TINY_OPS", "COLD_HOOK_TINY_OPS", "STEP_OPS_PER_TENSOR", "DTENSOR_OP_TINY_OPS",
           "POST_HOOK_SHARE", "tiny_op_s", "host_is_device", "layer_tensors", "edge_tensors",
           "hook_seconds", "step_host_seconds", "CHUNK_CAT_BLOCK_BYTES",
           "CHUNK_CAT_HOST_TINY_OPS", "chunk_cat_host_seconds"]

#: FSDP2's hooks' host time per unit and pass, in tiny ops: ``(sharded, backward) → (a, b)``,
#: ``a`` per unit, ``b`` per parameter tensor of it. ``benchmarks/fsdp2_host_costs.py`` on
#: this repository's 2-core CPU (torch 2.13 CPU, one thread; the tiny op 1.11-1.19 µs).
#: One rank (Gloo, 2026-11-30 01:50-01:56 UTC, load 1.3-2.3, seven runs, the medians):
#: forward 91.7-109.0 per unit (median 102.4) and 7.05-11.25 per tensor (9.09), backward
#: 128.4-154.9 (148.6) and 15.76-22.00 (18.33); ``--fake 1`` (03:20, five runs) reads the
#: same, 107.7 + 7.76 and 150.1 + 17.49. Sharded (``--fake 2``, 03:20-03:21 UTC, load
#: 2.2-3.0, five runs, the medians): forward 215.3-244.5 (225.8) per unit and 9.16-11.52
#: (10.92) per tensor, backward 263.1-308.5 (276.8) and 16.87-20.27 (18.68); ``--fake 8``
#: (two runs) the same (229-248 + 9-13, 297-299 + 22-23): no dependence on the ranks.
#: The two-rank Gloo runs (01:50-01:56: 336.6 + 17.01, 490.2 + 34.23; 03:19: 287-309 +
#: 15-20, 167-802 + 38-43) carry the noise of Gloo's blocking collectives taken off (180-610
#: µs a unit, as much as what is left) and are not used. Against the H200's one-rank trace
#: of torch 2.11 (Llama blocks of 9 tensors, ``--trace`` on ``run1/llama`` and
#: ``run5/none_s2048``): forward 1.21-1.24 ms, backward 3.48-3.80 ms per block, where the
#: one-rank figures give 184 and 314 tiny ops, 1.33 and 2.26 ms at the H200's tiny op
#: (7.2 µs, ``dgx-h200``'s launch facts; 2.16 and 3.68 ms at the profiled trace's 11.75 µs,
#: ``resnet/host.py``): the unit carries from one host to the other within the profiler's
#: spread (the backward's ``chunk_cat`` holds 1.5 ms of the H200's host time).
HOOK_TINY_OPS = {
    (False, False): (102.4, 9.09),
    (False, True): (148.6, 18.33),
    (True, False): (225.8, 10.92),
    (True, True): (276.8, 18.68),
}

#: FSDP2's hooks' host time where the host is the device (:func:`host_is_device`: a CPU), in
#: tiny ops as :data:`HOOK_TINY_OPS`, ``(sharded, backward) → (a, b)``: the hooks as they run
#: between a unit's kernels there, out of caches the kernels have swept.
#: ``benchmarks/fsdp2_host_costs.py --evict llc --iters 20`` (each tiny unit, bare and sharded
#: alike, zeroes the torch job's flush, ``torch_samples.flush_buffer``: twice the 32 MiB L3, before
#: its ops forward and after them backward, the zeroing's own time taken off) on this
#: repository's 2-core CPU (torch 2.13 CPU, one thread, the tiny op 1.15-1.18 µs), 2026-11-30
#: 07:53-07:56 UTC, load 1.8-2.6, the medians of four runs alternating with hot ones. Sharded
#: (``--fake 2``): forward 350.4-405.4 (377.2) per unit and 13.91-19.83 (17.73) per tensor,
#: backward 390.4-495.5 (459.9) and 24.13-29.24 (28.0); the hot runs between them 225.1-233.3
#: (227.8) + 9.28-13.88 (11.65) and 276.2-297.7 (283.2) + 16.10-24.91 (20.19), the table above
#: within their spread. One rank (``--fake 1``): forward 243.5-505.0 (351.8) + 9.85-14.07
#: (10.80), backward 325.3-711.6 (522.3) + 13.66-29.82 (19.45); hot 101.2-108.1 + 7.34-15.75,
#: 152.7-157.6 + 15.02-27.62. A 12-tensor unit (the loop's block) sharded: 590 tiny ops
#: forward and 796 backward, against 368 and 525 hot. The post-hook's share read 0.10-0.12
#: forward and 0.49 backward sharded, inside :data:`POST_HOOK_SHARE`'s runs' spread: kept.
COLD_HOOK_TINY_OPS = {
    (False, False): (351.8, 10.80),
    (False, True): (522.3, 19.45),
    (True, False): (377.2, 17.73),
    (True, True): (459.9, 28.0),
}

#: the post-hook's share of a pass's hook time, ``(sharded, backward) → share``: the
#: profiler's ``FSDP::`` ranges of the units (``benchmarks/fsdp2_host_costs.py``, no
#: collective inside them). One rank (Gloo, four runs 01:54-01:56 UTC): forward 0.18, 0.15,
#: 0.15, 0.12, backward 0.60, 0.63, 0.64, 0.66, the medians (``--fake 1``: 0.10-0.15,
#: 0.61-0.64); sharded (``--fake 2``, the five runs above): forward 0.05-0.09 (0.08),
#: backward 0.40-0.46 (0.46). The H200's one-rank trace: 0.09 forward, 0.73 backward (its
#: ``chunk_cat``'s 1.5 ms of host included).
POST_HOOK_SHARE = {(False, False): 0.15, (False, True): 0.635,
                   (True, False): 0.08, (True, True): 0.46}

#: bytes of ``chunk_cat``'s output per CUDA block (``kChunkCatBytesPerBlock = 128 * 16``:
#: pytorch ``aten/src/ATen/native/cuda/ChunkCat.h``; ``BYTES_PER_BLOCK`` in
#: ``TensorShape.cu``), for each of which the host's ``get_chunk_cat_metadata`` appends one
#: entry to ``block_idx_to_tensor_idx`` before ``pack_vecs`` copies the metadata to the device
CHUNK_CAT_BLOCK_BYTES = 2048

#: host time of ``_chunk_cat``'s metadata per block of its output, in tiny ops: the H200's
#: Kineto traces (``run1/llama``, ``run4/llama_s2048``, ``run5/none_s2048``,
#: ``run5/full_s2048``; ``benchmarks/decoder_host_trace.py --chunk-cat``): each Llama 3.1 8B
#: block's ``aten::_chunk_cat`` (218.1 M gradients cast to fp32: 872 MB, 425,990 blocks)
#: runs 1.51-7.15 ms on the host, the median of the 32 1.835 ms: 4.31 ns a block, 5.97e-4 of
#: the H200's 7.22 µs tiny op (``dgx-h200``'s launch facts). A C++ loop with no profiled
#: event inside, so the profiler does not lengthen it. The root unit (embedding and output,
#: 1.05 B gradients, 2.05 M blocks) ran 18.0-34.4 ms, 8.8-16.8 ns a block: larger metadata
#: cost more a block, which this figure does not carry (it is low for such a unit).
CHUNK_CAT_HOST_TINY_OPS = 5.97e-4

#: ATen ops per parameter tensor of torch's single-tensor Adam step, counted under a
#: ``TorchDispatchMode`` (``torchbench.count_ops``, 28 tensors, torch 2.13, 2026-11-30 08:00
#: UTC: 7.0; ``benchmarks/dtensor_dispatch.py`` alike); ``zero_grad()`` with torch's default
#: ``set_to_none=True`` (torchtitan's ``OptimizersContainer.zero_grad``, and the torch loop's
#: trainer since 2026-11-30) runs none (``set_to_none=False``'s ``zero_`` made the 8.0 of
#: ``benchmarks/torch_fsdp_step.py``)
STEP_OPS_PER_TENSOR = 7.0

#: DTensor's host time per ATen op of the single-tensor step, in tiny ops:
#: ``benchmarks/torch_fsdp_step.py`` (2 ranks, the loop's sharded model, the step over the
#: DTensors against the same step over plain copies of the local shards, alternating)
#: on 2026-11-30 01:51-01:52 UTC, load 1.6-1.9, three runs: +21.4, +18.1, +19.3 µs per op
#: (+0.171, +0.145, +0.154 ms per tensor, 28 tensors), the median 19.3 µs over the tiny op of
#: the same minutes (1.11-1.18 µs, median 1.125: :data:`HOOK_TINY_OPS`'s runs). The loaded
#: runs of 2026-11-29 22:42-22:55 (load 2.4-5.9) read +41-64 µs; ``dtensor_dispatch.py``'s
#: one-rank host-only figure then 20.8 µs.
DTENSOR_OP_TINY_OPS = 17.2


def tiny_op_s(launch) -> float:
    """Seconds of a 1-element op in a Python loop on the device's host: ``eager_op_s +
    host_launch_s`` of its launch facts, or ``stream_gap_s`` where both are 0 (a CPU: the
    op runs after its dispatch, which the facts give as the gap,
    ``ddlsim/reference/torch_machine.py``); 0 without facts (no host model).

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch``.

    Returns
    -------
    float
        seconds (s).
    """
    if launch is None:
        return 0.0
    return launch.stream_gap_s if host_is_device(launch) else \
        launch.eager_op_s + launch.host_launch_s


def host_is_device(launch) -> bool:
    """Whether launch facts describe a CPU device: no host time per op, the dispatch given as
    the gap (``ddlsim/reference/torch_machine.py``: "the CPU runs each op after its
    dispatch")."""
    return (launch is not None and launch.eager_op_s == 0 and launch.host_launch_s == 0
            and launch.stream_gap_s > 0)


def layer_tensors(shape, separate: bool) -> int:
    """Parameter tensors of a dense layer: its leaf modules' (``DecoderShape.layer_modules``),
    the fused QKV and gate/up projections split in three and two where the stack keeps them
    apart (``separate_projections``: torchtitan's ``wq``, ``wk``, ``wv`` and ``w1``, ``w3``)."""
    n = sum(len(m) for m in shape.layer_modules())
    if separate:
        n += 2 * (2 if shape.qkv_bias else 1)
        if shape.gated_mlp:
            n += 2 if shape.mlp_bias else 1
    return n


def edge_tensors(shape, label: str) -> int:
    """Parameter tensors of FSDP2's edge unit ``label`` (:mod:`.fsdp_edges`): ``.embedding``
    the token table (and learned positions), ``.head`` the final norm and an untied output
    layer, ``.root`` both."""
    embedding = 1 + (shape.positions == "learned")
    head = (2 if shape.norm == "layernorm" else 1) + (not shape.tied_embeddings)
    return {".embedding": embedding, ".head": head}.get(label, embedding + head)


def hook_seconds(launch, shards: int, backward: bool, tensors: int, post: bool) -> float:
    """Host seconds of FSDP2's pre-hook or post-hook on one unit of ``tensors`` parameter
    tensors in one pass (module docstring): ``(a + b·tensors)`` tiny ops
    (:data:`HOOK_TINY_OPS`; :data:`COLD_HOOK_TINY_OPS` where the host is the device), the
    post-hook's share of it :data:`POST_HOOK_SHARE`.

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch`` (:func:`tiny_op_s`).
    shards : int
        Ranks the unit is sharded over (``N``; 1: FSDP2's one-rank branch).
    backward : bool
        The backward's hooks (pre-backward and post-backward), else the forward's.
    tensors : int
        Parameter tensors of the unit.
    post : bool
        The post-hook's share (``post_forward``, ``post_backward``), else the pre-hook's.

    Returns
    -------
    float
        seconds (s); 0 without launch facts.
    """
    table = COLD_HOOK_TINY_OPS if host_is_device(launch) else HOOK_TINY_OPS
    a, b = table[shards > 1, backward]
    share = POST_HOOK_SHARE[shards > 1, backward]
    return (a + b * tensors) * tiny_op_s(launch) * (share if post else 1.0 - share)


def step_host_seconds(launch, fused: bool, tensors: int) -> float:
    """DTensor's host seconds in a single-tensor optimizer step over ``tensors`` sharded
    parameter tensors (module docstring); 0 for a fused or foreach step: torch runs the
    single-tensor loop where the step is not fused and the tensors are not CUDA's
    (``torch/optim/optimizer.py`` ``_default_to_fused_or_foreach``), i.e. on a CPU
    (:func:`host_is_device`).

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch`` (:func:`tiny_op_s`).
    fused : bool
        ``software.fused_optimizer``.
    tensors : int
        Parameter tensors the rank steps.

    Returns
    -------
    float
        seconds (s).
    """
    if fused or not host_is_device(launch):
        return 0.0
    return tensors * STEP_OPS_PER_TENSOR * DTENSOR_OP_TINY_OPS * tiny_op_s(launch)


def chunk_cat_host_seconds(launch, nbytes: float) -> float:
    """Host seconds of ``torch._chunk_cat``'s metadata for an output of ``nbytes`` bytes on a
    GPU: one entry per :data:`CHUNK_CAT_BLOCK_BYTES` of it, :data:`CHUNK_CAT_HOST_TINY_OPS`
    tiny ops each; 0 on a CPU (its ``_chunk_cat`` is the composite copy, no metadata) or
    without launch facts.

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch`` (:func:`tiny_op_s`).
    nbytes : float
        Bytes of the ``chunk_cat``'s output (the unit's gradients in ``reduce_dtype``).

    Returns
    -------
    float
        seconds (s).
    """
    if launch is None or host_is_device(launch):
        return 0.0
    return nbytes / CHUNK_CAT_BLOCK_BYTES * CHUNK_CAT_HOST_TINY_OPS * tiny_op_s(launch)

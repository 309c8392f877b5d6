"""PyTorch's context-parallel attention (``software.cp_attention: torch``) as torchtitan runs it.

Read in ``torch/distributed/tensor/experimental/_attention.py`` (two stored versions, one of
late 2024 — ``mesh.get_group()``, a ``PRE_ALL_GATHER`` rotate method; the index gives no commit
for it — and one of 2025 with flex attention, pytorch/pytorch 0123248a; the ring, the merger
and both rotaters are the same code in each) and in
torchtitan 9dec370 (2024-12) and 07c00d9 (2025-08):

* **Backend.** torchtitan enters ``sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])``
  around the CP context (9dec370 ``torchtitan/utils.py`` ``get_train_context``; 07c00d9
  ``models/attention.py``: FLASH, EFFICIENT, MATH with priority, cuDNN first on B200 only),
  so on H100/A100 every step is ``aten._scaled_dot_product_flash_attention`` (the stack's
  ``attention``, flash2).
* **Head counts.** torchtitan's Llama repeats K and V to the query heads before SDPA
  (``repeat_kv``, model.py of both commits), so every K/V buffer the ring moves or copies
  has the query heads' width ``(a/p)·d``, not ``(g/p)·d``.
* **Forward** (``_templated_ring_attention``, round-robin load balance on): K and V are made
  contiguous, then at each step ``i < cp − 1`` concatenated into one flat buffer
  (``torch.cat``) and handed to the rotater. ``_AllGatherRotater`` (torchtitan's default
  ``allgather``) all-gathers that buffer once, asynchronously, at step 0, and the first
  ``next_buffer`` (step 1) waits for it: the gather overlaps step 0. ``_AllToAllRotater``
  (``alltoall``, ddlsim's ``cp_comm_type: p2p``) permutes it to rank ``+1`` at every step,
  overlapping that step. Step 0 is one causal call on both chunks ``(2c, 2c)``; a later step
  of rank 0 (``i > rank``) is one unmasked call of the second query chunk on both key chunks
  ``(c, 2c)`` (other ranks: ``(2c, c)``, the same FLOPs). ``_SDPAMerger`` (``convert_to_f32``
  on) casts each step's output and log-sum-exp to fp32 and merges them in torch element-wise
  ops: ``out − sigmoid(lse_b − lse)·(out − out_b)`` and ``lse − logsigmoid(lse − lse_b)``,
  a partial step writing its half back with ``torch.cat`` (``_partial_update``); the result
  is cast back to bf16.
* **Backward** (``_templated_ring_attention_backward``): fp32 zeros for dQ, dK, dV; K/V
  gathered (or rotated) again as in the forward; at each step the flash backward, then dK/dV
  added into the fp32 accumulators that arrived from rank ``−1`` (waited for first, except at
  step 0), concatenated and sent on to rank ``+1`` — always by ``_AllToAllRotater`` and in
  fp32 — and dQ added (a partial step through ``_partial_update``). After the last step the
  accumulated dK/dV arrive home and are cast back to bf16, as dQ is.

Eager (``compile`` off) each torch op is one kernel, counted with the bytes it reads and
writes. With ``compile`` the ring runs inside the compiled block (its functional collectives
are traceable: ``_maybe_wait`` exists for that case); ddlsim takes Inductor to fuse each
merge and each accumulation into one pass reading each input and writing each output once,
to drop the concatenations whose result nothing uses (the all-gather rotater ignores every
buffer after the first), and to fold the fp32 zeros into the first accumulation — our
reading of what Inductor does with such chains, not a measurement.

Rank 0 is timed (one rank class); its partial steps move half the query-side tensors.

**When the ring waits** (:func:`_waits`). Eager, the rotaters' collectives are
``AsyncCollectiveTensor`` s waited at first use: the forward's all-gather (or each permute)
overlaps the step it was issued before, and each dK/dV permute the next flash backward.
Compiled, they are not: while tracing, a functional collective is waited as soon as it is
issued (torch ``distributed/_functional_collectives.py`` ``_maybe_wrap_tensor``: "if
_are_we_tracing(): return wait_tensor(self)", the same in the 2024 and 2025 stored
versions), and only Inductor's ``reorder_for_compute_comm_overlap`` pass (``sink_waits``,
``raise_comms``) would move the wait later; it is off by default (``torch/_inductor/config.py``)
and neither torchtitan 9dec370 nor 820504e turns it on (they set only ``_micro_pipeline_tp``,
and for rowwise float8 ``emulate_precision_casts``). So in a compiled block the step after an
exchange waits for it: the K/V all-gather before step 0, each K/V permute before the step it
was issued with, each dK/dV permute before the next step's flash backward. That Inductor's
scheduler keeps an extern kernel (the flash call) after a wait it does not depend on is our
reading of its default scheduling, not a measurement.

References
----------
The merge is the numerically stable form of the log-sum-exp combination that torch's code
cites: zhuzilin/ring-flash-attention pull request 34, comment 2076126795.
"""

from __future__ import annotations

from typing import Any

from ...trace import Collective, Compute, Kernel, P2P, Wait

__all__ = ["attention_forward", "attention_backward", "kv_bytes", "backward_buffer_bytes"]


def _sizes(part: Any) -> tuple[float, float]:
    """``(E, L)``: bytes of one bf16 query-side tensor of the rank (``b·(s/cp)·(a/p)·d``
    elements: Q, O, or K/V repeated to the query heads) and of its fp32 log-sum-exp
    (``b·(a/p)·(s/cp)`` rows)."""
    sh = part.shape
    rows = part.b * part.s / part.cp * sh.heads / part.size
    return rows * sh.d * part.dt, rows * 4.0


def kv_bytes(part: Any) -> float:
    """Bytes of the rank's K and V as the ring moves them (K/V repeated to the query heads
    by torchtitan's ``repeat_kv``).

    Parameters
    ----------
    part : LayerPartitioner
        The layer's partitioner (``b``, ``s``, ``cp``, the grid size ``p``, the dtype).

    Returns
    -------
    float
        ``2·b·(s/cp)·(a/p)·d`` elements of the training dtype, in bytes.
    """
    return 2 * _sizes(part)[0]


def backward_buffer_bytes(part: Any) -> float:
    """Bytes torch's ring backward holds at its peak on rank 0 beside the layer's saved
    tensors, in units of one bf16 query-side tensor ``E`` (:func:`_sizes`).

    From ``_templated_ring_attention_backward`` (pytorch/pytorch 0123248a
    ``torch/distributed/tensor/experimental/_attention.py``; the late-2024 stored version,
    ``mesh.get_group()`` in the function, has the same loop): step 0 calls the flash backward
    on the full local ``q, k, v`` (``2c`` queries), a later step of rank 0 (``i > rank``) on
    the second query half. The flash backward (pytorch/pytorch 03b7c19d
    ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` ``mha_bwd``)
    returns bf16 ``dq, dk, dv`` (``empty_like`` q, k, v: ``3E`` at step 0, ``2.5E`` later)
    and holds an fp32 ``dq_accum`` of ``seqlen_q_rounded × heads × head_size_rounded``
    (``2E`` at step 0, ``E`` later; ``d = 128`` is not rounded); its fp32 ``softmax_d``
    (``E/64`` at ``d = 128``) is not counted.

    * Compiled (Inductor frees each buffer after its last use — our reading of its generated
      code's ``del``, not a measurement — and each exchange is waited at once): the peak is
      step 0's flash backward, with dQ's fp32 accumulator (``2E``) and dK/dV's
      fp32 zeros (``4E``, ``torch.zeros_like(..., dtype=accum_dtype)``), K and V made
      contiguous (``2E``), the K/V the rotater holds — the all-gather rotater's gathered
      buffer (``2·cp·E``, ``_AllGatherRotater._aggregated_buffer``) or the all-to-all one's
      next block (``2E``) — and the step's flash gradients (``3E``) with ``dq_accum``
      (``2E``).
    * Eager (a loop variable's tensor lives until it is reassigned): step 1's flash
      backward, with dQ's accumulator (``2E``); the gathered K/V and the flat concatenation
      made for a rotater that ignores it (``(2·cp + 2)·E``), or the all-to-all one's block in
      use, the one sent and the one arriving (``6E``); fp32 dK/dV as last sent, as received at
      the step before (step 0's zeros) and as arriving (``4E`` each); step 0's flash
      gradients (``3E``), still bound to the loop's names, and step 1's (``2.5E``) with
      ``dq_accum`` (``E``). A step ``i ≥ 2`` holds ``0.5E`` less (its predecessor's
      gradients are ``2.5E``).

    Parameters
    ----------
    part : LayerPartitioner
        The layer's partitioner under context parallelism with torch's ring.

    Returns
    -------
    float
        Bytes: compiled ``(13 + 2·cp)·E`` (all-gather) or ``15·E``; eager
        ``(22.5 + 2·cp)·E`` or ``26.5·E``.
    """
    E, _ = _sizes(part)
    gather = part.cp_comm == "all_gather"
    if part.sw.compile:
        held = 2 * part.cp if gather else 2
        return (2 + 4 + 2 + held + 3 + 2) * E
    held = 2 * part.cp + 2 if gather else 6
    return (2 + held + 12 + 3 + 2.5 + 1) * E


def _memory(bytes_list: list[float], dtype: str) -> tuple[Kernel, ...]:
    """One streaming kernel per entry (its bytes read + written)."""
    return tuple(Kernel("memory", bytes=b, dtype=dtype) for b in bytes_list)


def _passes(name: str, kernels: tuple[Kernel, ...], dtype: str) -> Compute:
    """An element-wise op made of ``kernels`` (its bytes their sum)."""
    return Compute(name, 0.0, sum(k.bytes for k in kernels), kind="elementwise", dtype=dtype,
                   kernels=kernels)


def _pack_kernels(part: Any, first: bool, backward: bool = False) -> tuple[Kernel, ...]:
    """Before the flat K/V buffer is handed to the rotater: eager, ``key.contiguous()`` and
    ``value.contiguous()`` (``first`` only; backward also the three fp32 zeros of dQ, dK,
    dV) and the ``torch.cat`` (read + write ``2E``); compiled, the concatenation alone."""
    E, _ = _sizes(part)
    cat = [4 * E]
    if part.sw.compile:
        return _memory(cat, part.dtype)
    front = ([2 * E, 2 * E] + ([2 * E] * 3 if backward else [])) if first else []
    return _memory(front + cat, part.dtype)


def _merge_kernels(part: Any) -> tuple[Kernel, ...]:
    """``_SDPAMerger.step`` of a partial step (rank 0, ``c`` of its ``2c`` queries): eager,
    cast (read ``E/2``, write ``E`` fp32), ``out − out_b``, the product with
    ``sigmoid(lse_b − lse)``, the subtraction (read ``2E``, write ``E`` each, fp32 halves),
    the ``torch.cat`` of the whole fp32 output (``4E``) and six small log-sum-exp kernels;
    compiled, one pass (read ``E/2`` bf16 and the ``2E`` fp32 output, write ``2E``) and
    one over the log-sum-exp."""
    E, L = _sizes(part)
    if part.sw.compile:
        return _memory([E / 2 + 4 * E, 2.5 * L], part.dtype)
    lse = [1.5 * L / 2, L, 1.5 * L / 2, L, 1.5 * L / 2, 2 * L]   # sub, sigmoid, sub, ..., cat
    return _memory([1.5 * E, 3 * E, 2 * E, 3 * E, 4 * E] + lse, part.dtype)


def _accumulate_kernels(part: Any, step: int) -> tuple[Kernel, ...]:
    """dK/dV and dQ of one backward step into the fp32 accumulators (rank 0: ``i > rank``
    after step 0, dK/dV whole, dQ on its second half): eager, the two in-place adds (read
    ``2E`` fp32 + ``E`` bf16, write ``2E`` each), the fp32 ``torch.cat`` for the send
    (``8E``) and dQ's add (step 0: ``5E``; later: the half add ``2.5E`` and the cat ``4E``);
    compiled, one pass for dK/dV (read the received ``4E`` after step 0, the ``2E`` of
    dK/dV; write ``4E``) and one for dQ."""
    E, _ = _sizes(part)
    if part.sw.compile:
        dkv = (4 * E if step else 0.0) + 2 * E + 4 * E
        dq = 3 * E if step == 0 else 4.5 * E
        return _memory([dkv, dq], part.dtype)
    dq = [5 * E] if step == 0 else [2.5 * E, 4 * E]
    return _memory([5 * E, 5 * E, 8 * E] + dq, part.dtype)


def _step_kernels(part: Any, backward: bool, step: int) -> tuple[Kernel, ...]:
    """The flash call of ring step ``step`` (base ``cp_core_kernels``), after a later
    forward step its merge; eager, a forward step ``0 < i < cp − 1`` also concatenates the
    K/V it holds (the all-gather rotater ignores the copy, the all-to-all one sends it:
    counted with the send in :func:`attention_forward`)."""
    flash = part.cp_core_kernels(backward, min(step, 1))
    if backward:
        return flash
    E, _ = _sizes(part)
    if step == 0:
        return flash + (() if part.sw.compile else _memory([3 * E], part.dtype))
    return flash + _merge_kernels(part)


def _transfers(part: Any, ops: Any, tag: str, deps: tuple[int, ...]) -> list[int | None]:
    """The K/V each step ``i ≥ 1`` waits for, indexed by step (``None`` at step 0): one
    all-gather on stream ``cp`` after the first pack (all-gather rotater), or a pack and a
    permute to ``+1`` per step (all-to-all rotater: send, and the receive from ``−1``)."""
    cp, kv = part.cp, kv_bytes(part)
    pack = ops.add(_passes(f"{tag}.kv.pack", _pack_kernels(part, True, tag == "bwd"),
                           part.dtype), deps=deps)
    if part.cp_comm == "all_gather":
        gather = ops.add(Collective(f"{tag}.kv.all_gather", "all_gather", "cp", kv * cp),
                         "cp", (pack,))
        return [None] + [gather] * (cp - 1)
    out: list[int | None] = [None]
    for i in range(1, cp):
        if i > 1:
            pack = ops.add(_passes(f"{tag}.kv.pack", _pack_kernels(part, False), part.dtype),
                           deps=(out[-1],))
        sent = ops.add(P2P(f"{tag}.kv.send", "send", "cp", +1, kv, f"kv.{tag}"), "cp", (pack,))
        out.append(ops.add(P2P(f"{tag}.kv.recv", "recv", "cp", -1, kv, f"kv.{tag}"), "cp",
                           (sent,)))
    return out


def _waits(part: Any, arrive: list[int | None], step: int) -> tuple[int, ...]:
    """The transfers ring step ``step`` waits for: the K/V it computes on (``arrive[step]``,
    none at step 0) and, compiled, also the exchange issued just before it, which carries the
    next step's K/V (module docstring, "When the ring waits")."""
    waits = [arrive[step]]
    if part.sw.compile and step + 1 < len(arrive):
        waits.append(arrive[step + 1])
    return tuple(w for w in waits if w is not None)


def attention_forward(part: Any, ops: Any, tag: str) -> None:
    """Append torch's ring attention forward (module docstring): the K/V transfers, step 0
    on the local block, ``cp − 1`` later steps each with its fp32 merge, the cast back.

    Parameters
    ----------
    part : LayerPartitioner
        The layer's partitioner under context parallelism (``cp > 1``, a fused kernel).
    ops : OpList
        The layer body the ops are appended to; its last compute op is the QKV projection.
    tag : str
        Name prefix of the pass (``fwd``, or ``recompute`` under full recomputation).
    """
    cp, flops = part.cp, part.attn_core_flops()
    prev = ops.last_compute()                   # the qkv GEMM: K/V exist from here on
    arrive = _transfers(part, ops, tag, () if prev is None else (prev,))
    E, _ = _sizes(part)
    eager_cats = part.cp_comm == "all_gather" and not part.sw.compile
    for i in range(cp):
        kernels = _step_kernels(part, False, i)
        if eager_cats and 0 < i < cp - 1:
            kernels += _memory([4 * E], part.dtype)
        if i == cp - 1:                          # results(): the fp32 output back to bf16
            kernels += _memory([E if part.sw.compile else 3 * E], part.dtype)
        ops.add(Compute(f"{tag}.attn_core.step", flops / cp, dtype=part.dtype,
                        kernels=kernels), deps=_waits(part, arrive, i))


def attention_backward(part: Any, ops: Any) -> None:
    """Append torch's ring attention backward (module docstring): K/V again, per step the
    flash backward and the fp32 accumulation, dK/dV sent on to ``+1`` in fp32 after every
    step (stream ``cp.dkv``), and the casts back to bf16 once they are home.

    Parameters
    ----------
    part : LayerPartitioner
        The layer's partitioner under context parallelism (``cp > 1``, a fused kernel).
    ops : OpList
        The layer's backward body; its last compute op precedes the core's backward.
    """
    cp, flops = part.cp, 2 * part.attn_core_flops()
    E, _ = _sizes(part)
    prev = ops.last_compute()
    arrive = _transfers(part, ops, "bwd", () if prev is None else (prev,))
    eager_cats = part.cp_comm == "all_gather" and not part.sw.compile
    dkv, dkv_bytes = None, 2 * kv_bytes(part)   # fp32 dK/dV
    for i in range(cp):
        deps = _waits(part, arrive, i)
        if dkv is not None and part.sw.compile:     # the last dK/dV permute, waited at once
            deps += (dkv,)
        kernels = _step_kernels(part, True, i)
        if eager_cats and 0 < i < cp - 1:
            kernels += _memory([4 * E], part.dtype)
        step = ops.add(Compute("bwd.attn_core.step", flops / cp, dtype=part.dtype,
                               kernels=kernels), deps=deps)
        acc = ops.add(_passes("bwd.attn_core.accumulate", _accumulate_kernels(part, i),
                              part.dtype), deps=(step,) if dkv is None else (step, dkv))
        sent = ops.add(P2P("bwd.dkv.send", "send", "cp", +1, dkv_bytes, "dkv"), "cp.dkv",
                       (acc,) if dkv is None else (acc, dkv))
        dkv = ops.add(P2P("bwd.dkv.recv", "recv", "cp", -1, dkv_bytes, "dkv"), "cp.dkv",
                      (sent,))
    ops.add(Wait("bwd.dkv.wait", "cp.dkv"))
    casts = [3 * E, 6 * E]                      # dQ fp32 -> bf16; dK/dV fp32 -> bf16
    ops.add(_passes("bwd.attn_core.cast", _memory(casts, part.dtype), part.dtype),
            deps=(dkv,))

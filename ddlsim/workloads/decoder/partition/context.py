"""Context parallelism: the attention core of a layer over the ``cp`` axis.

With context parallelism each of the ``cp`` ranks holds ``s/cp`` positions of every
sequence; every op but the attention core is local to them. The core needs every key and
value. Two ways, Megatron-Core's ``cp_comm_type``:

``p2p`` (ring attention; Liu et al. 2023, arXiv:2310.01889; Transformer Engine's
``AttnFuncWithCPAndKVP2P``)
    ``cp`` steps. At step 0 a rank attends to its own K/V block; at step ``i`` to the block
    of the rank ``i`` places back, which arrived over the ring while step ``i − 1`` computed
    (send to ``+1``, receive from ``−1`` on stream ``cp``; each receive is posted after its
    send, so that every layer's transfers pair in order). Forward: ``cp − 1`` hops of
    ``2·b·(s/cp)·gd/p`` bytes (K and V of the rank's heads under a p-rank grid). Backward
    (our choice where the papers leave it open, following Transformer Engine): K/V make the
    same ``cp − 1`` hops again and the gradient accumulators dK/dV travel with them, one hop
    after each step, ``cp`` hops in all, so each returns to its owner (stream ``cp.dkv``);
    the layer's qkv backward waits for the last one.
``all_gather`` (Megatron-Core / TE ``AttnFuncWithCPAndKVAllGather``)
    Forward: all-gather of K/V over ``cp`` (the gathered ``2·b·s·gd/p`` bytes), then the
    core; backward: all-gather again (K/V are not kept gathered), the core's backward, and a
    reduce-scatter of dK/dV. Nothing overlaps: the gather precedes the compute it feeds.

**Causal load balance** (Megatron-Core ``get_batch_on_this_cp_rank``): the sequence is cut
into ``2·cp`` chunks and rank ``r`` holds chunks ``r`` and ``2cp − 1 − r``. Under the causal
mask every (rank, step) pair then meets the same number of unmasked chunk pairs (two of
``(s/2cp)²``, a diagonal pair counting half each), so every step costs ``1/cp`` of the rank's
core and every rank does ``1/cp`` of the layer's. ddlsim counts the core as
:meth:`DecoderShape.layer_gemm_flops` does (``4bs²·ad``, the mask not exploited), so the ring
step of one rank is ``4bs²·ad / (p·cp²)`` FLOPs and the balance shows as equal steps on all
ranks (one rank class). Without it the last rank would do ``(2cp − 1)/cp`` times the mean;
that variant is not offered.

Both are TransformerEngine's and Megatron-Core's way. PyTorch's context parallelism
(``software.cp_attention: torch``, torchtitan's stacks) is a ring of its own whichever the
rotation: :mod:`.torch_cp`.
"""

from __future__ import annotations

from typing import Any

from ...trace import Collective, Compute, P2P, Wait
from . import torch_cp

__all__ = ["attention_forward", "attention_backward", "torch_ring"]


def torch_ring(part: Any) -> bool:
    """Whether torch's ring attention runs the core (``software.cp_attention: torch`` with a
    fused kernel: :mod:`.torch_cp`); its handler dispatches only the flash, efficient and
    cuDNN SDPA ops, so an unfused core keeps the generic ring below."""
    from ....simulator.kernels.attention import FLASH_KINDS
    sw = part.sw
    return sw.cp_attention == "torch" and sw.attention in FLASH_KINDS


def _repeat_kv(part: Any, ops: Any, name: str) -> None:
    """Append the repeat of K and V to the query heads (before the core) or the sums of their
    gradients (after its backward) on the rank's tokens, where the stack repeats them
    (:mod:`~ddlsim.simulator.kernels.repeat_kv`; torchtitan repeats them before SDPA, the
    ring included)."""
    from ....simulator.kernels.repeat_kv import expands_kv, repeat_kv_kernels
    sh = part.shape
    if not expands_kv(part.sw, sh):
        return
    k = repeat_kv_kernels(part.tokens, sh.heads / part.size, sh.g / part.size, sh.d, part.dt,
                          part.dtype, bool(part.sw.compile), backward=name.startswith("bwd"))
    ops.add(Compute(name, 0.0, sum(x.bytes for x in k), kind="elementwise", dtype=part.dtype,
                    kernels=k))


def attention_forward(part: Any, ops: Any, tag: str) -> None:
    """Append the attention core's forward (one op, a ring or a gather + op), after the
    repeat of K and V where the stack repeats them."""
    _repeat_kv(part, ops, f"{tag}.repeat_kv")
    _core_forward(part, ops, tag)


def attention_backward(part: Any, ops: Any) -> None:
    """Append the attention core's backward, then the sums of the repeated K/V's gradients
    where the stack repeats them."""
    _core_backward(part, ops)
    _repeat_kv(part, ops, "bwd.repeat_kv")


def _core_forward(part: Any, ops: Any, tag: str) -> None:
    """Append the attention core's forward (one op, a ring or a gather + op)."""
    flops, cp = part.attn_core_flops(), part.cp
    if cp == 1:
        ops.add(Compute(f"{tag}.attn_core", flops, dtype=part.dtype,
                        kernels=part.core_kernels(False)))
        return
    if torch_ring(part):
        torch_cp.attention_forward(part, ops, tag)
        return
    kv = part.kv_block_bytes()
    if part.cp_comm == "all_gather":
        ops.add(Collective(f"{tag}.kv.all_gather", "all_gather", "cp", kv * cp))
        ops.add(Compute(f"{tag}.attn_core", flops, dtype=part.dtype,
                        kernels=part.cp_core_kernels(False)))
        return
    prev = ops.last_compute()            # the qkv GEMM: K/V exist from here on
    ops.add(Compute(f"{tag}.attn_core.step", flops / cp, dtype=part.dtype,
                    kernels=part.cp_core_kernels(False, 0)))
    later = part.cp_core_kernels(False, 1)      # every later step launches the same shape
    for _ in range(1, cp):
        sent = ops.add(P2P(f"{tag}.kv.send", "send", "cp", +1, kv, "kv"), "cp",
                       () if prev is None else (prev,))
        prev = ops.add(P2P(f"{tag}.kv.recv", "recv", "cp", -1, kv, "kv"), "cp", (sent,))
        ops.add(Compute(f"{tag}.attn_core.step", flops / cp, dtype=part.dtype, kernels=later),
                deps=(prev,))


def _core_backward(part: Any, ops: Any) -> None:
    """Append the attention core's backward (2 × forward FLOPs)."""
    flops, cp = 2 * part.attn_core_flops(), part.cp
    if cp == 1:
        ops.add(Compute("bwd.attn_core", flops, dtype=part.dtype,
                        kernels=part.core_kernels(True)))
        return
    if torch_ring(part):
        torch_cp.attention_backward(part, ops)
        return
    kv = part.kv_block_bytes()
    if part.cp_comm == "all_gather":
        ops.add(Collective("bwd.kv.all_gather", "all_gather", "cp", kv * cp))
        ops.add(Compute("bwd.attn_core", flops, dtype=part.dtype,
                        kernels=part.cp_core_kernels(True)))
        ops.add(Collective("bwd.dkv.reduce_scatter", "reduce_scatter", "cp", kv * cp))
        return
    prev_kv, prev_dkv = ops.last_compute(), None
    steps = (part.cp_core_kernels(True, 0), part.cp_core_kernels(True, 1))   # step 0, later
    for i in range(cp):
        deps: tuple[int, ...] = ()
        if i > 0:
            sent = ops.add(P2P("bwd.kv.send", "send", "cp", +1, kv, "kv.bwd"), "cp",
                           () if prev_kv is None else (prev_kv,))
            prev_kv = ops.add(P2P("bwd.kv.recv", "recv", "cp", -1, kv, "kv.bwd"), "cp",
                              (sent,))
            deps = (prev_kv,)
        step = ops.add(Compute("bwd.attn_core.step", flops / cp, dtype=part.dtype,
                               kernels=steps[min(i, 1)]), deps=deps)
        sent = ops.add(P2P("bwd.dkv.send", "send", "cp", +1, kv, "dkv"), "cp.dkv",
                       (step,) if prev_dkv is None else (step, prev_dkv))
        prev_dkv = ops.add(P2P("bwd.dkv.recv", "recv", "cp", -1, kv, "dkv"), "cp.dkv",
                           (sent,))
    ops.add(Wait("bwd.dkv.wait", "cp.dkv"))

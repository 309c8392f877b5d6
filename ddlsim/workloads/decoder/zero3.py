"""ZeRO-3 / FSDP blocks of a decoder without pipelining: per-layer parameter all-gathers in the
forward and again in the backward, gradient reduce-scatters after each layer's backward.

Three effects, each as ZeRO-3 (DeepSpeed) and FSDP run them:

* **Prefetch limit** ``k = cfg.software.zero3_prefetch_layers``: the all-gather of layer
  ``l`` may start once layer ``l − k − 1`` has finished, i.e. while layer ``l − k`` computes
  (``k = 1``: one layer ahead, FSDP's ``backward_prefetch = BACKWARD_PRE`` with
  ``limit_all_gathers = True``; ``k = 0``: gathered on demand, fully exposed). The backward
  counts layers in backward order.
* **Stream contention**: the all-gathers and the reduce-scatters of a group share one
  communication stream (``dp``; ``edp`` for experts under EP), i.e. one NIC, in issue order —
  a layer's reduce-scatter delays the gathers issued after it.
* **Exposed first gather**: each micro-batch's forward and backward begin with a marker on
  the compute stream; the first ``k + 1`` gathers depend on it, so nothing is gathered ahead
  across micro-batches (FSDP and DeepSpeed free the gathered layers after use and start each
  pass from the root module's pre-hook). The forward's first gather overlaps only the
  embedding, the backward's only the output head's backward.

Every micro-batch gathers all layers twice and reduce-scatters every layer's gradients:
DeepSpeed ZeRO-3 partitions gradients at every backward (``reduce_scatter`` in its
backward hooks, gradient accumulation included; DeepSpeed docs, "ZeRO-3 Offload" and
``stage3.py``), i.e. ``3Ψ`` bytes per micro-batch (Rajbhandari et al. 2020, §7.2.2).

Memory: ``k + 1`` gathered layers are alive at once (the one computing and ``k`` prefetched):
:func:`gathered_layers_bytes`.
"""

from __future__ import annotations

from ..trace import Block, Collective, Op, Wait
from .builder import StageBuilder, as_ops

__all__ = ["zero3_blocks", "zero3_shards", "gathered_layers", "zero3_gathered_bytes"]


def gathered_layers(prefetch: int) -> int:
    """Layers whose full (TP-sharded) parameters a rank holds at once under ZeRO-3: the one
    computing and ``prefetch`` gathered ahead."""
    return prefetch + 1


def zero3_gathered_bytes(cfg, layer_bytes: float) -> float:
    """Memory of the gathered layers in flight: :func:`gathered_layers` × one layer's
    parameters on the rank (``layer_bytes``, already TP-sharded)."""
    return gathered_layers(cfg.software.zero3_prefetch_layers) * layer_bytes


def zero3_shards(b: StageBuilder, moe: bool) -> list[tuple[str, float]]:
    """(group, bytes) of one layer's parameters for ZeRO-3's gathers and reduce-scatters."""
    if not b.shape.is_moe:
        return [("dp", b.shape.layer_params / b.tp * b.dt)]
    dense, expert = b.layer_rank_params(moe)
    if b.split_experts and expert:
        return [("dp", dense * b.dt), ("edp", expert * b.dt)]
    return [("dp", (dense + expert) * b.dt)]


def _pass(b: StageBuilder, head: list, bodies: list[list], moe: list[bool], backward: bool,
          prefetch: int) -> list[Op]:
    """One pass (forward or backward) over the layers ``bodies`` (in pass order) after the
    ``head`` ops, with its gathers, prefetch limit and (backward) reduce-scatters."""
    ops: list[Op] = [Op(Wait("zero3.start", "compute"))]
    pending: dict[int, tuple[int, ...]] = {}

    def gather(j: int, dep: int) -> None:
        idx = []
        for group, n in zero3_shards(b, moe[j]):
            ops.append(Op(Collective("param.all_gather", "all_gather", group, n), group,
                          deps=(dep,)))
            idx.append(len(ops) - 1)
        pending[j] = tuple(idx)

    for j in range(min(prefetch + 1, len(bodies))):
        gather(j, 0)
    ops += as_ops(head)
    for j, body in enumerate(bodies):
        ops += [Op(x, deps=pending.pop(j) if i == 0 else ()) for i, x in enumerate(body)]
        last = len(ops) - 1
        if backward:
            for group, n in zero3_shards(b, moe[j]):
                ops.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", group,
                                         n * b.gdt / b.dt), group, deps=(last,)))
        if j + prefetch + 1 < len(bodies):
            gather(j + prefetch + 1, last)
    return ops


def zero3_blocks(b: StageBuilder, prefetch: int) -> dict[str, Block]:
    """The ``F0`` and ``B0`` blocks of ZeRO-3 without pipelining (the module docstring)."""
    moe = [b.shape.is_moe_layer(i) for i in range(b.split[0][0])]
    fwd = _pass(b, b.embedding_forward(), [b.layer_forward(moe=m) for m in moe], moe, False,
                prefetch)
    fwd += as_ops(b.head_forward())
    back = moe[::-1]
    bwd = _pass(b, b.head_backward(), [b.layer_backward(moe=m) for m in back], back, True,
                prefetch)
    return {"F0": Block("F0", "forward", tuple(fwd)), "B0": Block("B0", "backward", tuple(bwd))}

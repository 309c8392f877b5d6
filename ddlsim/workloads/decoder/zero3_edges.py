"""DeepSpeed ZeRO-3's edges without pipelining (``zero3_gather: per_module`` or ``per_tensor``):
the input embedding, the final norm and the output layer fetched and reduce-scattered by the
same leaf-module hooks as a layer's modules (:mod:`.zero3_fetch`).

Read in DeepSpeed 38327e07 ``runtime/zero/partitioned_param_coordinator.py`` (v0.3.13's
``stage3.py`` fetches from the same hooks): every leaf module with partitioned parameters is
fetched in its forward pre-hook and again in its backward pre-hook, and released after each
unless persistent (under ``zero3_persistence_threshold`` elements: the final norm) or reused
within ``zero3_max_reuse_distance`` elements of the trace (``__params_to_release``: the
elements of the modules after it, counted until the distance is reached). So, per
micro-batch:

* the embedding (word embeddings, and learned positions: two leaf modules) is gathered before
  its forward, the first unit of the pass; its backward comes last, after every layer's
  forward and backward (and recomputation) and the head's, so it is gathered again unless all
  of those hold fewer elements than the reuse distance; its gradients are reduce-scattered at
  the end of the backward;
* the output layer is gathered before its forward (one module ahead, behind the last layer's
  last module) and kept for its backward, which follows at once (reuse distance 0); its
  gradients and the final norm's are reduce-scattered after the head's backward. A tied
  output layer is the embedding's weight, used outside its module: DeepSpeed fetches it again
  for the head (an external parameter, ``ZeROOrderedDict.__getitem__`` at 38327e07
  ``partition_parameters.py``), and its gradient is whole only after the embedding's
  backward, so it is reduce-scattered with the embedding's.

Each gathered or reduced tensor costs the memory passes and host time of its kind
(:data:`.zero3_fetch.FETCH_PASSES`, :func:`.zero3_fetch.list_host_seconds`), as a layer's
modules do; per module, the tensors of one leaf module are one coalesced collective. Memory
(:func:`.zero3.module_hook_bytes`): the output layer held at the backward's start with the
modules gathered ahead of it; the embedding's gathered tables (at the forward's start and the
backward's end, away from the activations' peak) are not counted. Not read: how DeepSpeed
v0.3.13 handled the tied weight (the same rule is used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EdgeFetch", "edge_fetches", "hook_units"]


@dataclass(frozen=True)
class EdgeFetch:
    """Elements on a rank that DeepSpeed's hooks gather for the embedding and the head,
    forward and backward, and reduce-scatter after them, one entry per collective."""

    emb_forward: tuple[float, ...]
    head_forward: tuple[float, ...]
    head_backward: tuple[float, ...]
    emb_backward: tuple[float, ...]
    head_reduce: tuple[float, ...]
    emb_reduce: tuple[float, ...]


def edge_fetches(shape: Any, tp: int, sw: Any, layers: int, full_recompute: bool) -> EdgeFetch:
    """:class:`EdgeFetch` of a decoder of ``layers`` dense layers on one of ``tp`` TP ranks
    under stack ``sw`` (module docstring): leaf modules word embeddings ``V·h/t``, learned
    positions, the final norm (shaped as a layer's input norm) and the output layer
    ``V·h/t``."""
    threshold, reuse = sw.zero3_persistence_threshold, sw.zero3_max_reuse_distance
    vh = shape.vocab * shape.hidden / tp
    modules = shape.layer_modules(tp)
    pos = [(float(shape.max_positions * shape.hidden),)] if shape.positions == "learned" else []
    emb, norm, out = [(vh,), *pos], [modules[0]], [(vh,)]

    def fetched(mods: list) -> tuple[float, ...]:
        big = [[n for n in m if n >= threshold] for m in mods]
        if sw.zero3_gather == "per_module":
            return tuple(sum(m) for m in big if m)
        return tuple(n for m in big for n in m)

    def reduced(mods: list) -> tuple[float, ...]:
        if sw.zero3_gather == "per_module":
            return tuple(sum(m) for m in mods)
        return tuple(n for m in mods for n in m)

    head = fetched(norm + out)
    between = layers * sum(sum(m) for m in modules) * (3 if full_recompute else 2) + 2 * sum(head)
    tied = shape.tied_embeddings
    return EdgeFetch(fetched(emb), head, () if reuse > 0 else head,
                     () if between < reuse else fetched(emb),
                     reduced(norm if tied else norm + out), reduced(emb))


def hook_units(b: Any, before: list, units: list, after: list, backward: bool) -> list:
    """The units of a pass under module hooks with the edges' (:func:`edge_fetches`): the
    forward's embedding unit (``before``: its ops) first and head unit (``after``) last; the
    backward's head unit (``before``) first and the embedding's last (no op of the trace: a
    marker that the backward has ended)."""
    from ..trace import Wait
    f = edge_fetches(b.shape, b.tp, b.sw, b.split[0][0], b.plan.recompute == "full")
    emb, head = sum(f.emb_forward), sum(f.head_forward)
    if not backward:
        return [_unit(b, before, f.emb_forward, (), emb, ".embedding"), *units,
                _unit(b, after, f.head_forward, (), head, ".head")]
    return [_unit(b, before, f.head_backward, f.head_reduce, head, ".head"), *units,
            _unit(b, [Wait("zero3.embedding_backward", "compute")], f.emb_backward,
                  f.emb_reduce, emb, ".embedding")]


def _unit(b: Any, ops: list, gathers: tuple, reduces: tuple, live: float, label: str) -> Any:
    """A unit gathering ``gathers`` and reduce-scattering ``reduces`` (elements, one
    collective each) on ``dp``, with the passes and host time of a layer module's
    (:func:`.zero3._module_units`); ``live``: its module's gathered elements, whether
    gathered for this visit or kept (the cap's count, :func:`.zero3_fetch._live_elements`)."""
    from .zero3 import _Unit
    from .zero3_fetch import (FETCH_FILL_PASSES, FETCH_PASSES, REDUCE_PASSES, gather_host_split,
                              reduce_host_split)
    unit = _Unit(ops, [("dp", n * b.dt) for n in gathers],
                 [("dp", n * b.gdt) for n in reduces], label=label)
    unit.reduce_passes = REDUCE_PASSES * sum(reduces) * b.gdt
    unit.live = live
    if b.sw.zero3_gather == "per_tensor":   # PyTorch 1.8's list-form collectives
        unit.fill = FETCH_FILL_PASSES * sum(gathers) * b.dt
        unit.gather_passes = (FETCH_PASSES - FETCH_FILL_PASSES) * sum(gathers) * b.dt
        unit.host_gather, unit.host_copy_out = gather_host_split(b.sw, b.dp, len(gathers))
        unit.host_reduce, unit.host_reduce_after = reduce_host_split(b.sw, b.dp, reduces)
    return unit

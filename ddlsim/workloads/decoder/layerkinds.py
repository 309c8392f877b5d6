"""Which layers of a pipeline chunk are Mixture-of-Experts layers, and which projections an
attention block runs: the two facts of today's models (DeepSeek-V3's dense first layers,
Multi-head Latent Attention) that a stage builder needs per chunk and per layer.

Layers are numbered in model order across the virtual pipeline stages: virtual stage
``k = chunk·PP + stage`` holds ``split[stage][chunk]`` consecutive layers after those of the
virtual stages before it (Megatron-LM's interleaved assignment, :mod:`.split`); whether layer
``i`` is an MoE layer is :meth:`DecoderShape.is_moe_layer` (every ``moe_layer_freq``-th, past
``first_dense_layers``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["chunk_first_layer", "moe_layers_in_chunk", "moe_layers_in_stage",
           "attention_projections"]


def chunk_first_layer(split: list[list[int]], stage: int, chunk: int) -> int:
    """Model index of the first layer of ``chunk`` on ``stage`` (``split[stage][chunk]``
    layers each, :func:`.split.chunk_layers`)."""
    pp = len(split)
    k = chunk * pp + stage
    return sum(split[st][ch] for st in range(pp) for ch in range(len(split[st]))
               if ch * pp + st < k)


def moe_layers_in_chunk(shape: Any, split: list[list[int]], stage: int, chunk: int) -> int:
    """MoE layers among the ``split[stage][chunk]`` layers of that chunk."""
    first = chunk_first_layer(split, stage, chunk)
    return sum(shape.is_moe_layer(i) for i in range(first, first + split[stage][chunk]))


def moe_layers_in_stage(shape: Any, split: list[list[int]], stage: int) -> int:
    """MoE layers held by one rank of ``stage`` (all its chunks)."""
    return sum(moe_layers_in_chunk(shape, split, stage, c) for c in range(len(split[stage])))


def attention_projections(shape: Any) -> tuple[tuple, tuple]:
    """The attention block's linear GEMMs before and after its core, each as
    ``(name, N, K, split by rows)`` for ``[M, K]·[K, N]``: the fused ``qkv`` (``N = a·d +
    2·g·d``) and ``proj``; with MLA its four projections (:meth:`MLA.projections`, whose down
    projections Megatron-Core replicates over TP) and its ``a·d_v``-wide output projection."""
    h = shape.hidden
    if shape.mla is None:
        return ((("qkv", shape.q_width + 2 * shape.kv_width, h, False),),
                (("proj", h, shape.q_width, True),))
    p = shape.mla.projections(h, shape.heads)
    before = tuple((name, out, inp, False) for name, (inp, out, _) in p.items() if name != "proj")
    inp, out, _ = p["proj"]
    return before, (("proj", out, inp, True),)

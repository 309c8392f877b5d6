"""The tensor-parallel collectives a recomputed module runs again (``train.recompute_modules``
at TP > 1): Megatron-Core checkpoints a module's whole forward, its Transformer Engine
linears' sequence-parallel gathers and reduce-scatters included, and runs it again in the
backward (Megatron-LM d7288711):

* ``mlp`` (a dense layer's MLP, ``transformer_layer.py`` lines 781-800:
  ``tensor_parallel.checkpoint(self.mlp, ...)``, ``te_checkpoint`` under FP8): ``linear_fc1``
  gathers its sequence-parallel input and ``linear_fc2`` reduce-scatters its output, or, without
  sequence parallelism, all-reduces it: the pair a dense layer's MLP has in its forward
  (:meth:`~.builder.StageBuilder._tp_comm`);
* ``shared_experts`` (``moe/moe_layer.py`` lines 441-462: the ``SharedExpertMLP`` checkpointed
  whole): the shared experts' own gather and reduce-scatter (:meth:`.moe.MoEOps._shared`);
* ``mla_up_proj`` (``multi_latent_attention.py`` lines 732-760 and 856-859: the up projections
  and RoPE checkpointed): ``linear_q_up_proj`` (``linear_q_proj`` without a query LoRA) and
  ``linear_kv_up_proj`` are column-parallel linears whose inputs, the compressed query and key/
  value (``q_lora_rank`` and ``kv_lora_rank`` wide; the hidden states without a query LoRA),
  are sequence-sharded (lines 540-542, 625-632): each gathers its input again. Without
  sequence parallelism their inputs are whole on every rank and nothing is gathered.

Each module's collectives follow its recomputation op; context parallelism with ``mlp`` or
``mla_up_proj`` is refused (:mod:`.recompute_checks`).
"""

from __future__ import annotations

from typing import Any

from ..trace import Collective
from .recompute_modules import _applied

__all__ = ["module_collectives"]


def module_collectives(b: Any, moe: bool) -> list[Collective]:
    """The collectives builder ``b``'s layer (an MoE layer or not) recomputes with
    ``plan.recompute_modules`` (module docstring); none at TP 1."""
    modules = b.plan.recompute_modules or ()
    if b.tp == 1 or not modules:
        return []
    out: list[Collective] = []
    mla = b.shape.mla
    if "mla_up_proj" in modules and mla is not None and b.sp:
        per = b.act_bytes / b.shape.hidden          # bytes per gathered element's row
        q_in = mla.q_lora_rank or b.shape.hidden
        out += [Collective("recompute.mla_up_proj.q.ag", "all_gather", "tp", per * q_in),
                Collective("recompute.mla_up_proj.kv.ag", "all_gather", "tp",
                           per * mla.kv_lora_rank)]
    if "mlp" in modules and _applied("mlp", moe, modules):
        out += b._tp_comm("recompute.mlp")
    if "shared_experts" in modules and _applied("shared_experts", moe, modules):
        out += [c for c in b._shared("recompute", False) if isinstance(c, Collective)]
    return out

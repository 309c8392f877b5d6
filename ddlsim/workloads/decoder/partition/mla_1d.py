"""Multi-head Latent Attention under Megatron-Core's 1-D tensor parallelism, as its code runs it.

Megatron-LM d98e8a64 (2026), ``megatron/core/models/gpt/gpt_layer_specs.py`` lines 104-137
(the MLA layer spec: ``linear_q_down_proj`` and ``linear_kv_down_proj`` are
``backend.linear()``, Transformer Engine's ``TELinear``; the up projections are
column-parallel, with the latent norms fused when ``qk_layernorm``; a separate input norm) and
``megatron/core/transformer/multi_latent_attention.py``:

* lines 524-606: a ``TELinear`` down projection is built with ``parallel_mode='duplicated'``
  and no tensor-parallel group: every TP rank holds the whole ``h × r_q`` and
  ``h × (r_kv + d_r)`` weights and runs them on the hidden states it has, the ``s/t``
  sequence-parallel shard under sequence parallelism (the comments of lines 640-644 and
  659-662: ``[s / TP, b, q_lora_rank]``), all ``s`` tokens without it;
* lines 745-764: the key/value latent stays on ``s/t`` tokens and the shared rotary key
  ``k_pos_emb`` is all-gathered over TP (``gather_from_sequence_parallel_region``);
* lines 786-800: the up projections (column-parallel) read the normalised latents, which a
  column-parallel linear all-gathers under sequence parallelism: the query latent (``r_q``)
  and the key/value latent (``r_kv``), not the hidden state ``h``.

So per layer and micro-batch, with sequence parallelism, the attention gathers
``r_q + r_kv + d_r`` per token (DeepSeek-V3: 1,536 + 512 + 64 = 2,112) in three all-gathers
where a standard attention gathers ``h`` (7,168) in one; its backward reduce-scatters the
three and gathers the two latents again for the weight gradients, and the output
projection's gradient is gathered at ``h`` as before. The down projections' backward needs no
collective (their input and its gradient stay on the rank's tokens); their weight gradients
are partial sums over the rank's tokens, which ``finalize_model_grads`` all-reduces over TP
once a step (``_allreduce_non_tensor_model_parallel_grads``, params with
``sequence_parallel`` set: Transformer Engine sets it on duplicated weights) — that
once-a-step reduction is not modelled here.

Without sequence parallelism nothing is gathered: the down projections run on all ``s``
tokens on every rank (``t`` times their FLOPs in all), and the up projections' backward
all-reduces the latents' gradients (``r_q`` and ``r_kv``), as any column-parallel linear
all-reduces its input's.
"""

from __future__ import annotations

from typing import Any

from ....simulator.kernels.dtensor import regathers_input
from ...trace import Collective, Compute

__all__ = ["DOWN", "UP", "projection", "gathers_latents", "duplicated_gemm", "latent_gathers",
           "latent_backward", "attention_backward"]

#: MLA's down projections, which Megatron-Core replicates over TP (``TELinear``,
#: ``parallel_mode='duplicated'``)
DOWN = frozenset({"q_down", "kv_down"})
#: MLA's up projections and which latents each gathers under sequence parallelism
#: (:meth:`~ddlsim.workloads.models.mla.MLA.gathered_widths`): the query's, and the
#: key/value latent with the shared rotary key
UP = {"q_up": ("q",), "kv_up": ("kv", "k_pos")}


def projection(name: str) -> str:
    """The projection an op's ``name`` runs (``fwd.q_down`` → ``q_down``)."""
    return name.rpartition(".")[2]


def gathers_latents(shape: Any, t: int, sp: bool) -> bool:
    """Whether the layers' attention all-gathers MLA's latents instead of the hidden state:
    an MLA model, TP over several ranks, sequence parallelism."""
    return shape.mla is not None and t > 1 and sp


def duplicated_gemm(part: Any, ops: Any, name: str, M: float, N: float, K: float,
                    backward: bool) -> None:
    """A down projection ``[M, K]·[K, N]`` on one rank of ``part`` (a
    :class:`~.megatron_1d.Megatron1D`): the whole weight on the rank's own rows (``M/t``
    under sequence parallelism), no collective; its input comes from the separate input
    norm, so an FP8 recipe takes its amax itself."""
    rows = M / part.size if part.sp else M
    ops.add(Compute(name, (4 if backward else 2) * rows * N * K, dtype=part.dtype,
                    kernels=part.linear_kernels((rows, N, K), backward, norm_fed=False)))


def latent_gathers(part: Any, name: str, M: float, kind: str) -> list:
    """The all-gathers before the up projection ``kind`` (:data:`UP`) over ``M`` tokens: one
    per latent it reads (``{name}.{latent}.ag``), each ``M`` × its width (:meth:`~ddlsim.
    workloads.models.mla.MLA.gathered_widths`)."""
    widths = dict(part.shape.mla.gathered_widths(part.shape.hidden))
    return [c for latent in UP[kind]
            for c in part.gather(f"{name}.{latent}.ag", M * widths[latent] * part.dt)]


def latent_backward(part: Any, name: str, M: float, kind: str) -> list:
    """The backward's collectives of the up projection ``kind`` over ``M`` tokens under
    sequence parallelism: per latent it read, the all-gather of the saved shard for the
    weight gradient (where the stack gathers it again) and the reduce-scatter of its
    gradient; after the query's, the all-gather of the output projection's gradient at the
    hidden width (the ``g`` of a standard layer, which the column-parallel block before it
    carries)."""
    widths = dict(part.shape.mla.gathered_widths(part.shape.hidden))
    again = regathers_input(part.sw, part.plan.recompute)
    out: list = []
    for latent in UP[kind]:
        nbytes = M * widths[latent] * part.dt
        # the rotary key is gathered by an explicit gather: the weight gradient of kv_up
        # reads only the key/value latent
        if again and latent != "k_pos":
            out.append(Collective(f"{name}.{latent}.ag.input", "all_gather", "tp",
                                  part.gather_bytes(nbytes)))
        out.append(Collective(f"{name}.{latent}.rs", "reduce_scatter", "tp", nbytes))
    if kind == "q_up":
        out += part.gather(f"{name}.ag", M * part.shape.hidden * part.dt)
    return out


def attention_backward(part: Any, name: str, M: float) -> list:
    """The collectives of an MLA attention block's backward over ``M`` tokens as one op list
    (the builder's fused ``attn``): both up projections' (:func:`latent_backward`) under
    sequence parallelism; without it the all-reduce of each latent's gradient (``r_q`` or
    the query's ``h``, and ``r_kv``); nothing at ``t = 1``."""
    if part.size == 1:
        return []
    if part.sp:
        return [*latent_backward(part, name, M, "kv_up"), *latent_backward(part, name, M, "q_up")]
    widths = dict(part.shape.mla.gathered_widths(part.shape.hidden))
    return [Collective(f"{name}.{latent}.ar", "all_reduce", "tp", M * widths[latent] * part.dt)
            for latent in ("kv", "q")]

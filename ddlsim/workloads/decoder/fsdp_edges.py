"""FSDP's edge units without pipelining: the input embedding, the final norm and the output
layer gathered and reduce-scattered as torchtitan wraps them (``zero3_implementation:
torch_fsdp2`` under a torchtitan stack) and as FSDP1's root holds them (``torch_fsdp``: the
2024 root unit below); DeepSpeed's module hooks are in :mod:`.zero3_edges`.

The wrapping is the framework's :attr:`~ddlsim.workloads.framework_memory.FrameworkMemory.kept_root`
(one source for the trace and the memory rule), read in torchtitan's ``apply_fsdp``:

* ``edges`` (torchtitan 9dec370, ``torchtitan/parallelisms/parallelize_llama.py`` lines
  325-339): ``fully_shard`` on every block, then ``fully_shard(model, ...)``: the root unit
  holds the embedding, the final norm and the output layer. FSDP2 never reshards the root
  after its forward (``_fsdp_state.py`` ``_lazy_init``: "For the root, do not reshard after
  forward"), so each micro-batch gathers the root once, in the root's pre-forward before the
  embedding, and keeps it through the backward. Its gradients are reduce-scattered once the
  whole backward has run: the root's inputs (token ids) need no gradient, so its post-backward
  runs from ``_root_post_backward_final_callback``.
* ``head`` (torchtitan 07c00d9, ``torchtitan/models/llama3/infra/parallelize.py`` lines
  279-299): ``fully_shard(model.tok_embeddings, reshard_after_forward=...)`` (the policy:
  resharded unless ``never``), ``fully_shard([model.norm, model.output],
  reshard_after_forward=policy == "always")`` and a root without parameters. The embedding is
  gathered before its forward and again (prefetched behind the first layer's backward) for its
  backward unless kept; the [norm, output] unit is gathered behind the last layer's forward
  (FSDP2's implicit prefetch, one unit ahead as for the blocks) and kept for its backward
  unless resharded (``always``). The head's gradients are reduce-scattered after the head's
  backward (its input needs a gradient, so its post-backward hook fires there), the
  embedding's at the end of the backward (its post-backward from the final callback).

Gradients are reduce-scattered at every micro-batch, in the reduce dtype, with FSDP2's copy
passes (copy-out after the gather, ``chunk_cat`` before the reduce-scatter) and, under HSDP,
the replicas' all-reduce, as the blocks get them (:func:`.fsdp.fsdp_unit`). The float8
all-gather does not reach them: the embedding is an ``nn.Embedding``, and torchtitan 9dec370
leaves the output layer out of its float8 conversion (``torchtitan/float8.py`` line 99,
``module_filter_fn=lambda mod, fqn: fqn != "output"``). At 07c00d9 the conversion's
``filter_fqns`` defaults to empty (``config/job_config.py`` line 575), so the output layer
becomes a ``Float8Linear`` there; its weight is still gathered in 16 bits here (not
modelled). With pipelining, :mod:`.fsdp` gathers and reduce-scatters the stage's edge
parameters with the stage's (:func:`.fsdp.with_stage_reduce_scatters`).
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError

__all__ = ["layout", "forward_edges", "backward_edges"]


def layout(sw: Any) -> str:
    """How stack ``sw`` wraps the edges in ZeRO-3 units without pipelining: ``edges`` (one
    root unit: torchtitan 9dec370, and FSDP1, the Megatron stacks' ``torch_fsdp``, whose
    auto-wrapped layers leave the edges to the root, which ``_post_forward_reshard`` never
    frees after the forward: "Do not free the root's parameters in the post-forward for
    FULL_SHARD", pytorch ``torch/distributed/fsdp/_runtime_utils.py``), ``head`` (an
    embedding unit and a [norm, output] unit), ``hooks`` (DeepSpeed's module hooks,
    :mod:`.zero3_edges`), or ``none`` (not modelled: Megatron's ``--use-torch-fsdp2``;
    Megatron-FSDP's own are in :mod:`.megatron_fsdp`)."""
    if sw.zero3_gather != "per_layer":
        return "hooks"
    if sw.zero3_implementation == "torch_fsdp":   # FSDP1's root unit, never resharded
        return "edges"
    if sw.zero3_implementation != "torch_fsdp2":
        return "none"
    from ..framework_memory import framework
    try:
        return framework(sw.name).kept_root
    except ConfigError:
        return "none"


def forward_edges(b: Any, embedding: list, units: list, head: list) -> tuple[list, list, list]:
    """(ops before the pass's units, its units, ops after them) of the forward over the
    layers' ``units`` between the ``embedding`` and ``head`` ops (module docstring)."""
    kind = layout(b.sw)
    if kind == "none":
        return embedding, units, head
    if kind == "hooks":
        from .zero3_edges import hook_units
        return [], hook_units(b, embedding, units, head, False), []
    from .fsdp import fsdp_unit
    from .megatron_fsdp import edge_params
    head_p, emb_p = edge_params(b)
    if kind == "edges":
        return [], [fsdp_unit(b, embedding, emb_p + head_p, True, False, ".root"), *units], head
    return [], [fsdp_unit(b, embedding, emb_p, True, False, ".embedding"), *units,
                fsdp_unit(b, head, head_p, True, False, ".head")], []


def backward_edges(b: Any, head: list, units: list) -> tuple[list, list]:
    """(ops before the pass's units, its units) of the backward over the layers' ``units``
    after the ``head`` ops: the edges' gathers where resharded and their reduce-scatters
    (module docstring); the embedding's unit computes the embedding's backward
    (:mod:`.embedding_grad`)."""
    kind = layout(b.sw)
    if kind == "none":
        return head, units
    if kind == "hooks":
        from .zero3_edges import hook_units
        return [], hook_units(b, head, units, [], True)
    from .fsdp import fsdp_unit
    from .megatron_fsdp import edge_params
    head_p, emb_p = edge_params(b)
    policy = b.sw.zero3_reshard_after_forward
    end = b.embedding_backward()
    if kind == "edges":
        return head, [*units, fsdp_unit(b, end, emb_p + head_p, False, True, ".root")]
    return [], [fsdp_unit(b, head, head_p, policy == "always", True, ".head"), *units,
                fsdp_unit(b, end, emb_p, policy != "never", True,
                          ".embedding")]

"""Megatron-FSDP: ZeRO-3 as Megatron-Core runs it (``zero3_implementation: megatron_fsdp``).

Megatron-Core's own FSDP (``--use-custom-fsdp --data-parallel-sharding-strategy
optim_grads_params`` at NVIDIA/Megatron-LM 9c1a5351 and 1e057005, renamed
``--use-megatron-fsdp`` later) is, read in its code at 1e057005
(``megatron/core/distributed/custom_fsdp/``), the per-layer FSDP that
:mod:`.zero3` and :mod:`.fsdp` already build, with the experts sharded apart:

* **What it shards**: parameters, gradients and optimizer state (``optim_grads_params``,
  ``fully_sharded_data_parallel.py`` docstring; the fp32 main weights too). Dense parameters
  are sharded over the data-parallel group with context parallelism (``dp_cp_group``, line
  126), expert parameters (``allreduce = False``) over the expert data-parallel group
  (``expt_dp_group``, line 129): :func:`.zero3.zero3_shards`'s ``(dp, dense)`` and
  ``(edp, expert)`` pairs.
* **Its unit**: each ``TransformerLayer`` (default ``fsdp_unit_modules``, line 167). Its
  parameters fall into buckets by dtype, expert-ness and unit (``param_and_grad_buffer.py``
  ``_get_parameter_groups``, line 1005), and the buckets of one unit and one group are
  gathered and reduce-scattered together (line 1048): one all-gather and one reduce-scatter
  per layer and group. Modules outside a unit (embedding, output layer) stay gathered.
* **Prefetch**: the next unit (``suggested_communication_unit_size`` defaults to twice the
  mean unit's elements, line 254), in forward and in backward order: one layer ahead
  (the stack's ``zero3_prefetch_layers: 1``).
* **Resharding**: after every forward (``_post_forward``, line 551); with full recomputation
  the recomputed forward reuses the backward's gather (line 409): one gather per layer in
  the backward (per-layer units' recomputation inside the gathered unit).
* **Gradients**: reduce-scattered after every micro-batch's backward of a unit (line 392),
  in the main-gradient dtype (``grad_reduce_in_fp32`` with ``--bf16``); each micro-batch
  overwrites ``main_grad`` with ``param.grad`` (``main_grad.copy_(param.grad)``, line 365),
  the pass :meth:`.stage.StageBase.grad_accumulate_bytes` counts.
* **No copy-out**: the parameters are views of the all-gather bucket
  (``param_and_grad_buffer.py`` line 736), so ``zero3_copy_out`` is false.

**Outside the units** (``fsdp_unit_id`` None: the embedding, the final norm and the output
layer) the parameters are sharded over dp × cp too, gathered once per iteration and kept
(only units are released, ``release_module_parameters``; ``finish_grad_sync`` resets the
gather pipeline after the last micro-batch, line 683, and ``start_param_sync`` gathers the
first bucket before the next forward, line 630), their gradients reduce-scattered after
every micro-batch's backward of their module (``_post_backward``, line 392): here the head's
after the head's backward (:func:`with_head_reduce_scatter`), the embedding's at the end of
the backward (:func:`with_embedding_reduce_scatter`), both gathered after the optimizer step
(:func:`with_edge_gather`: the output layer's gather, which the run prefetches beside the
first micro-batch's last layer, counted exposed), and kept gathered in memory
(:func:`memory_rules`).

What this module adds is the check of the plan (:func:`check`), the plan line's phrase
(:func:`phrase`), the edges' collectives and the memory rules; the stack rules (``zero3_no_expert_parallel``, ``no_megatron_fsdp``,
``megatron_fsdp_no_grad_accum_fusion``) are in :mod:`ddlsim.stackrules`. Not modelled: the
reduce-scatter queue's cap (``suggested_RS_queue_capacity``), the double-buffer allocator,
NCCL user buffers, HSDP (``--num-distributed-optimizer-instances``) and the ``optim`` /
``optim_grads`` strategies.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..trace import Block, Collective, Op, Wait
from .oplists import comm_stream

__all__ = ["NAME", "active", "check", "phrase", "memory_rules", "edge_params",
           "with_head_reduce_scatter", "with_embedding_reduce_scatter", "with_edge_gather"]

#: ``zero3_implementation``'s value for Megatron-FSDP
NAME = "megatron_fsdp"
#: the stack fields Megatron-FSDP's code fixes (module docstring): field -> its value
BEHAVIOUR = {"zero3_gather": "per_layer", "zero3_reshard_after_forward": "always",
             "zero3_copy_out": False}


def active(sw: Any) -> bool:
    """Whether stack ``sw`` runs ZeRO-3 as Megatron-FSDP."""
    return sw.zero3_implementation == NAME


def check(cfg: Any) -> None:
    """What Megatron-FSDP models (ValueError, one paragraph): ZeRO-3 only (its
    ``optim_grads_params`` strategy), without pipelining, with the per-layer behaviour its
    code fixes (:data:`BEHAVIOUR`). A plan the stack's rules refuse is left to them."""
    sw, p = cfg.software, cfg.parallel
    if not active(sw):
        return
    from ...stackrules import broken_rules
    if not sw.what_if and broken_rules(cfg):
        return          # the stack cannot run the plan: its rule says so, with its source
    where = sw.sources["zero3_implementation"]
    if p.zero_stage != 3:
        raise ValueError(
            f"{where}: zero3_implementation = {NAME!r} is Megatron-FSDP's optim_grads_params "
            f"strategy (ZeRO-3), and parallel.zero_stage = {p.zero_stage}; set zero_stage: 3 "
            "(its no_shard, optim and optim_grads strategies are not modelled: use the "
            "distributed optimizer, zero_stage: 1, without zero3_implementation)")
    if p.pp > 1:
        raise ValueError(
            f"{where}: zero3_implementation = {NAME!r} with pipeline_model_parallel_size = "
            f"{p.pp} is not modelled (Megatron-FSDP within pipeline stages); use "
            "pipeline_model_parallel_size: 1")
    for field, value in BEHAVIOUR.items():
        if getattr(sw, field) != value:
            raise ValueError(
                f"{sw.sources[field]}: {field} = {getattr(sw, field)!r} contradicts "
                f"zero3_implementation = {NAME!r} ({where}): Megatron-FSDP gathers per "
                "TransformerLayer unit, reshards after every forward and gathers into the "
                f"bucket its parameters view; set {field}: {value!r}")


def phrase(sw: Any) -> str:
    """``, Megatron-FSDP (experts over the expert data-parallel group)`` under Megatron-FSDP,
    else empty."""
    return ", Megatron-FSDP (experts over the expert data-parallel group)" if active(sw) else ""


def memory_rules(sw: Any, fm: Any) -> Any:
    """The framework memory rules ``fm`` (:class:`~ddlsim.workloads.framework_memory.
    FrameworkMemory`) under stack ``sw``: under Megatron-FSDP, ZeRO-3's buffers per
    micro-batch as FSDP2's rule counts them (:func:`~ddlsim.workloads.allocator.
    comm_buffer_bytes`): the gathered units, the modules outside a unit kept gathered
    (embedding, final norm and output layer: ``kept_root`` edges; Megatron-LM HEAD
    docs/user-guide/features/megatron_fsdp.md, "Non-unit modules remain persistently
    un-sharded"; 1e057005 releases units only, ``release_module_parameters`` in
    ``_post_forward`` and ``_post_backward``), and one unit's unsharded gradients, the
    backward's 16-bit ``param.grad`` and the main-gradient bucket it is copied into before
    the reduce-scatter (``_grad_acc``, line 365). Else ``fm`` itself."""
    if not active(sw):
        return fm
    return replace(fm, fsdp2=True, kept_root="edges")


def edge_params(b: Any) -> tuple[float, float]:
    """``(head, embedding)`` parameters on one rank outside any unit (pipeline size 1): the
    final norm with an untied output layer, and the input embedding (with learned positions;
    a tied output layer is its weight, whose gradient is whole after the embedding's
    backward), as :func:`.builder.with_edges` counts them."""
    from .builder import with_edges
    head = with_edges(b.shape, b.part.param_split, 0.0, False, True, 1)
    return head, with_edges(b.shape, b.part.param_split, 0.0, True, True, 1) - head


def _reduce_scatter(b: Any, name: str, params: float, deps: tuple[int, ...]) -> Op:
    group = b.grad_group
    return Op(Collective(name, "reduce_scatter", group, params * b.gdt), comm_stream(group),
              deps)


def with_head_reduce_scatter(b: Any, head: list) -> list:
    """The head's backward ops ``head`` (payloads or ops indexing ``head``) followed by the
    reduce-scatter of the head's gradients after them (:func:`edge_params`)."""
    params = edge_params(b)[0]
    if not (active(b.sw) and params):
        return head
    ops = [x if isinstance(x, Op) else Op(x) for x in head]
    return [*ops, _reduce_scatter(b, "grad.reduce_scatter.head", params, (len(ops) - 1,))]


def with_embedding_reduce_scatter(b: Any, backward: Block) -> Block:
    """``backward`` followed by the reduce-scatter of the embedding's gradients after its
    last op (the embedding's backward ends the pass)."""
    if not active(b.sw):
        return backward
    rs = _reduce_scatter(b, "grad.reduce_scatter.embedding", edge_params(b)[1],
                         (len(backward.ops) - 1,))
    return Block(backward.name, backward.phase, (*backward.ops, rs))


def with_edge_gather(b: Any, update: Block) -> Block:
    """``update`` followed by the gather of the parameters outside any unit after its last op
    (the optimizer step), which the compute stream then waits for (the next iteration's
    forward starts with the embedding)."""
    if not active(b.sw):
        return update
    group, n = b.grad_group, len(update.ops)
    gather = Op(Collective("params.all_gather.edges", "all_gather", group,
                           sum(edge_params(b)) * b.dt), comm_stream(group), (n - 1,))
    wait = Op(Wait("params.edges.wait", comm_stream(group)), deps=(n,))
    return Block(update.name, update.phase, (*update.ops, gather, wait))

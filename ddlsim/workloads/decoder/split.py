"""How many transformer layers each model chunk holds: Megatron-Core's pipeline split.

By default every chunk (pipeline stage × virtual stage) holds ``L / (PP·VPP)`` layers. Megatron-
Core also splits unevenly, by the options of the same names (megatron/core/transformer/
transformer_block.py, ``get_num_layers_to_build``, and transformer_config.py, NVIDIA/Megatron-LM
d98e8a64, 2026-08):

* ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
  input embedding (the loss) counts as one layer of the split, ``L + 1`` (``+ 2``) layers over
  ``PP·VPP`` chunks, and the first chunk of the first stage (the last chunk of the last stage)
  builds one transformer layer fewer. Llama 3.1 405B's 126 layers on PP 8 × VPP 8 are
  ``128 / 64 = 2`` per chunk, with 1 in the first and in the last. Such a chunk may be left
  with no layer (Qwen3-235B's 94 layers on PP 32 × VPP 3: ``96 / 96 = 1``, the first chunk
  the embedding alone, the last the loss alone), which Megatron-Core builds (it asserts
  ``num_layers_to_build >= 0``, d7288711 transformer_block.py lines 183-196); every other
  chunk holds at least one layer (each gets at least one of the split's units).
* ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``: the first
  (last) stage holds that many layers, the others share the rest evenly; with VPP each stage's
  layers are split evenly over its chunks. These two cannot be combined with the two above.

``layers_per_virtual_stage`` gives every virtual stage's layers outright, in stage order
(virtual stage ``k`` on pipeline rank ``k mod PP``, chunk ``k // PP``: torchtitan's ``loop``
placement, ``stage_ids_this_rank``), as torchtitan splits its model: an uneven first and last
stage (``ddlsim/importers/torchtitan_split.py``). It combines with none of the above. A plan
that gives none of these on a stack whose framework splits by a rule of its own (the stack's
``pipeline_split``: torchtitan's, :mod:`.titan_split`; DeepSpeed's, :mod:`.ds_split`, where
the layers do not divide) gets that rule's split, laid out the same way; ``even`` is
Megatron's.

``pipeline_model_parallel_layout`` (Megatron-Core's layout string, :mod:`.pp_layout`) gives
every chunk's layers as letters; it combines with none of the above (Megatron-Core raises
ValueError for the four options of the first two items, transformer_config.py lines 2242-2259
at d98e8a64). Its ``m`` (multi-token-prediction) layers must match ``model.mtp_num_layers``,
modelled on the last stage (:mod:`.mtp`).

Every rule Megatron-Core asserts is checked here, with the field, the value and what would do.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["chunk_layers", "is_uneven", "UNEVEN_FIELDS", "mtp_depths", "stack_split_applies",
           "virtual_stage_layers"]

#: the plan fields of an uneven split (``parallel.*``)
UNEVEN_FIELDS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "layers_per_virtual_stage", "pipeline_model_parallel_layout")


def is_uneven(parallel: Any) -> bool:
    """True when the plan asks for any of Megatron-Core's uneven splits or gives every
    virtual stage's layers."""
    return bool(parallel.layers_per_virtual_stage is not None
                or parallel.pipeline_model_parallel_layout is not None
                or parallel.account_for_embedding_in_pipeline_split
                or parallel.account_for_loss_in_pipeline_split
                or parallel.num_layers_in_first_pipeline_stage is not None
                or parallel.num_layers_in_last_pipeline_stage is not None)


def chunk_layers(cfg: Any) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each chunk: ``out[stage][virtual stage]`` (module docstring),
    the MTP depths' layers in the last chunk of the last stage.
    Raises ``ValueError`` naming the field when the split is impossible."""
    p = cfg.parallel
    _refuse_mtp(cfg)
    if p.pipeline_model_parallel_layout is not None:
        split = _layout(p, cfg.model.num_hidden_layers, mtp_depths(cfg))
    elif p.layers_per_virtual_stage is not None:
        split = _given(p, cfg.model.num_hidden_layers)
    elif stack_split_applies(cfg):
        split = _given(p, cfg.model.num_hidden_layers, _stack_split(
            cfg.software.pipeline_split, cfg.model.num_hidden_layers, p.pp * p.vpp))
    else:
        # a chunk can be left without a layer only where the embedding or the loss counts
        # as one (each chunk gets at least one of the split's units): Megatron-Core builds it
        split = _split(cfg.model.num_hidden_layers, p.pp, p.vpp,
                       p.num_layers_in_first_pipeline_stage,
                       p.num_layers_in_last_pipeline_stage,
                       bool(p.account_for_embedding_in_pipeline_split),
                       bool(p.account_for_loss_in_pipeline_split))
    return _with_mtp(split, mtp_depths(cfg))


def _with_mtp(split: tuple, mtp: int) -> tuple[tuple[int, ...], ...]:
    """The split with the MTP depths' transformer layers in the last stage's last chunk,
    where Megatron-Core builds them by default (``mtp_on_this_rank``; a layout puts its 'm'
    there too, :mod:`.pp_layout`): each is one more layer of that chunk (:mod:`.mtp`)."""
    if not mtp:
        return split
    last = split[-1]
    return (*split[:-1], (*last[:-1], last[-1] + mtp))


def mtp_depths(cfg: Any) -> int:
    """``model.mtp_num_layers``: the multi-token-prediction depths the run trains (0 where the
    model section has no such field: a proxy's)."""
    return getattr(cfg.model, "mtp_num_layers", 0)


def _refuse_mtp(cfg: Any) -> None:
    """Multi-token prediction (:mod:`.mtp`) is modelled with Megatron's 1-D tensor
    parallelism without context parallelism, the ops ddlsim's builder emits itself."""
    n, p, m = mtp_depths(cfg), cfg.parallel, cfg.model
    if n and (p.tp_mode != "1d" or p.cp > 1 or m.decoder_sparse_step > 1):
        what = (f"parallel.tensor_parallel.mode {p.tp_mode!r}" if p.tp_mode != "1d"
                else f"parallel.context_parallel_size = {p.cp}" if p.cp > 1
                else f"model.decoder_sparse_step = {m.decoder_sparse_step}")
        raise ValueError(f"model.mtp_num_layers = {n} with {what}: multi-token prediction "
                         "is modelled with 1-D tensor parallelism, no context parallelism "
                         "and layers all of one kind after the first dense ones (its layer "
                         "is of the last layer's kind); set mtp_num_layers 0 or change the "
                         "plan")


def _layout(p: Any, layers: int, mtp: int) -> tuple[tuple[int, ...], ...]:
    """``pipeline_model_parallel_layout``'s transformer layers per chunk, checked
    (:func:`.pp_layout.parse_layout`)."""
    from .pp_layout import parse_layout
    other = [f for f in UNEVEN_FIELDS if f != "pipeline_model_parallel_layout"
             and getattr(p, f) not in (None, False)]
    if other:
        raise ValueError(f"parallel.pipeline_model_parallel_layout cannot be set together with "
                         f"{', '.join(other)} (Megatron-Core raises ValueError, "
                         "transformer_config.py lines 2242-2259 at d98e8a64); give one")
    return parse_layout(p.pipeline_model_parallel_layout, p.pp, p.vpp, layers, mtp).count("t")


def stack_split_applies(cfg: Any) -> bool:
    """Whether the plan's layers are split by the stack's own rule (``pipeline_split``, not
    ``even``): a pipeline with none of the split options above."""
    p, rule = cfg.parallel, cfg.software.pipeline_split
    # DeepSpeed's balanced partition is the even split where the layers divide
    return p.pp > 1 and not is_uneven(p) and rule != "even" and not (
        rule == "deepspeed" and cfg.model.num_hidden_layers % (p.pp * p.vpp) == 0)


def virtual_stage_layers(cfg: Any) -> list[int]:
    """Each virtual stage's layers in stage order (virtual stage ``k`` is chunk ``k // PP``
    of rank ``k mod PP``): :func:`chunk_layers` read as ``layers_per_virtual_stage`` gives
    them."""
    p, rows = cfg.parallel, chunk_layers(cfg)
    return [rows[k % p.pp][k // p.pp] for k in range(p.pp * p.vpp)]


def _stack_split(rule: str, layers: int, stages: int) -> list[int]:
    """Each virtual stage's layers by the stack's own rule (``pipeline_split``: torchtitan's,
    :mod:`.titan_split`; DeepSpeed's, :mod:`.ds_split`), ValueError naming the field where the
    framework refuses it."""
    from .ds_split import split_deepspeed
    from .titan_split import split_2024, split_2025
    rules = {"torchtitan-2024": split_2024, "torchtitan-2025": split_2025,
             "deepspeed": split_deepspeed}
    try:
        return rules[rule](layers, stages)
    except ValueError as exc:
        raise ValueError(f"system.software.kernels.pipeline_split = {rule!r}: {exc}") from None


def _given(p: Any, layers: int, given: list[int] | None = None) -> tuple[tuple[int, ...], ...]:
    """``layers_per_virtual_stage`` (or ``given``, the stack's own split) as
    ``out[stage][chunk]`` (module docstring), checked."""
    given, n = list(p.layers_per_virtual_stage if given is None else given), p.pp * p.vpp
    other = [f for f in UNEVEN_FIELDS[:4] if getattr(p, f) not in (None, False)]
    if other:
        raise ValueError(f"parallel.layers_per_virtual_stage cannot be set together with "
                         f"{', '.join(other)}: give each virtual stage's layers, or one of "
                         "Megatron-Core's uneven splits")
    if p.pp == 1:
        raise ValueError("parallel.layers_per_virtual_stage needs a pipeline: "
                         "pipeline_model_parallel_size is 1")
    if len(given) != n:
        raise ValueError(f"parallel.layers_per_virtual_stage has {len(given)} numbers; the "
                         f"plan has pipeline_model_parallel_size × virtual_pipeline_model_"
                         f"parallel_size = {p.pp} × {p.vpp} = {n} virtual stages: give one "
                         "number per virtual stage")
    if sum(given) != layers:
        raise ValueError(f"parallel.layers_per_virtual_stage = {given} adds up to "
                         f"{sum(given)} layers; model.num_hidden_layers = {layers}")
    return tuple(tuple(given[c * p.pp + s] for c in range(p.vpp)) for s in range(p.pp))


@lru_cache(maxsize=256)
def _split(layers: int, pp: int, v: int, first: int | None, last: int | None,
           embedding: bool, loss: bool) -> tuple[tuple[int, ...], ...]:
    if first is not None or last is not None:
        return _first_last_split(layers, pp, v, first, last, embedding, loss)
    return _even_split(layers, pp, v, embedding, loss)


def _first_last_split(layers: int, pp: int, v: int, first: int | None, last: int | None,
                      embedding: bool, loss: bool) -> tuple[tuple[int, ...], ...]:
    """Megatron-Core's ``num_layers_in_first/last_pipeline_stage``: those stages' layers as
    given, the rest split evenly over the other stages, each stage's over its chunks."""
    if embedding or loss:
        raise ValueError("parallel.num_layers_in_first/last_pipeline_stage cannot be set "
                         "together with account_for_embedding/loss_in_pipeline_split "
                         "(Megatron-Core asserts it); use one kind of uneven split")
    if pp == 1:
        raise ValueError("parallel.num_layers_in_first/last_pipeline_stage needs a "
                         "pipeline: pipeline_model_parallel_size is 1")
    per_stage = [None] * pp
    rest, left = layers, pp
    for name, value, idx in (("first", first, 0), ("last", last, pp - 1)):
        if value is None:
            continue
        if value > layers:
            raise ValueError(f"parallel.num_layers_in_{name}_pipeline_stage = {value} "
                             f"exceeds model.num_hidden_layers = {layers}")
        per_stage[idx] = value
        rest, left = rest - value, left - 1
    if rest < 0:
        raise ValueError(f"parallel.num_layers_in_first_pipeline_stage + "
                         f"num_layers_in_last_pipeline_stage = {first or 0} + {last or 0} "
                         f"exceeds model.num_hidden_layers = {layers}")
    if left and rest % left:
        raise ValueError(f"model.num_hidden_layers = {layers} minus the first/last stage's "
                         f"layers leaves {rest}, not divisible by the {left} other pipeline "
                         "stages (Megatron-Core: the left-over layers must divide evenly)")
    per_stage = [n if n is not None else rest // left for n in per_stage]
    for s, n in enumerate(per_stage):
        if n % v:
            name = ("num_layers_in_first_pipeline_stage" if s == 0 and first is not None
                    else "num_layers_in_last_pipeline_stage" if s == pp - 1
                    and last is not None else None)
            what = f"parallel.{name} = {n}" if name else f"the {n} layers of stage {s}"
            raise ValueError(f"{what} is not divisible by "
                             f"virtual_pipeline_model_parallel_size = {v}: each stage's "
                             "layers are split evenly over its model chunks")
    return tuple(tuple([n // v] * v) for n in per_stage)


def _even_split(layers: int, pp: int, v: int, embedding: bool,
                loss: bool) -> tuple[tuple[int, ...], ...]:
    """The layers split evenly over ``pp × v`` chunks, the embedding and the loss counted as
    a layer each when ``account_for_embedding/loss_in_pipeline_split`` says so."""
    pv = f"pipeline_model_parallel_size × virtual_pipeline_model_parallel_size = {pp} × {v}"
    total = layers + int(embedding) + int(loss)
    if total % (pp * v):
        parts = ["+1 for the embedding"] * embedding + ["+1 for the loss"] * loss
        extra = f" ({', '.join(parts)})" if parts else ""
        hint = "" if parts else ("; Megatron-Core can split unevenly: set parallel."
                                 "account_for_embedding_in_pipeline_split / "
                                 "account_for_loss_in_pipeline_split, "
                                 "num_layers_in_first/last_pipeline_stage, or "
                                 "pipeline_model_parallel_layout")
        raise ValueError(f"model.num_hidden_layers = {layers}{extra} is not divisible by "
                         f"{pv} = {pp * v}{hint}")
    each = total // (pp * v)
    out = [[each] * v for _ in range(pp)]
    if embedding:
        out[0][0] -= 1
    if loss:
        out[pp - 1][v - 1] -= 1
    return tuple(tuple(row) for row in out)

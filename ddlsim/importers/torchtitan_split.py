"""How torchtitan splits a decoder's transformer layers over its virtual pipeline stages,
as ``parallel.layers_per_virtual_stage`` (``ddlsim/workloads/decoder/split.py``).

* **2024** (torchtitan 9dec370 ``torchtitan/parallelisms/pipelining_utils.py``
  ``generate_split_points``, lines 18-57): ``PP`` stages for a single-stage schedule (1F1B,
  GPipe), ``2·PP`` for a multi-stage one (Interleaved1F1B); with ``L`` layers over ``S``
  stages, the first stage gets ``L // S``, each middle stage ``L // S + 1`` while the
  remainder ``L mod S`` lasts, then ``L // S``, and the last stage what is left.
* **2025** (torchtitan 07c00d9 ``torchtitan/distributed/pipeline_parallel.py``
  ``generate_llm_fqn_per_model_part``, lines 127-226, with the stage count of
  ``torchtitan/models/llama3/infra/pipeline.py`` lines 64-110): the embedding counts as
  ``pipeline_parallel_first_stage_less_layers`` layers and the norm and output as
  ``pipeline_parallel_last_stage_less_layers`` (1 each by default); ``S`` is
  ``ceil((L + first + last) / pipeline_parallel_layers_per_stage)`` when that is given, else
  ``PP`` or ``2·PP``; the ``L + first + last`` effective layers split evenly, the first
  ``(L + first + last) mod S`` stages one more, and the first (last) stage gives up ``first``
  (``last``) of its share.

Llama 3.1 405B's 126 layers over 16 virtual stages are ``7, 8, …, 8, 7`` by both.

A split the run gives itself: 9dec370's ``[experimental] pipeline_parallel_split_points``
(``layers.N`` begins a stage: ``pipeline_llama.py`` lines 70-72) and 07c00d9's ``[parallelism]
module_fqns_per_model_part`` (each stage's module names; its ``pipeline_parallel_split_points``
is refused there: ``models/llama3/infra/pipeline.py`` lines 41-45).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["split_2024", "split_2025", "virtual_stages_2025", "split_from_points",
           "split_from_fqns", "run_split"]


def split_2024(layers: int, stages: int) -> list[int]:
    """Transformer layers of each of ``stages`` virtual stages, torchtitan 9dec370's split
    (module docstring).

    Parameters
    ----------
    layers, stages : int
        The model's transformer layers and the virtual stages.

    Returns
    -------
    list of int
        Layers per virtual stage, in stage order.

    Raises
    ------
    ValueError
        If there are more stages than layers (torchtitan raises it too).
    """
    if stages > layers:
        raise ValueError(f"{stages} pipeline stages for {layers} layers: torchtitan needs at "
                         "least one layer per stage")
    base, extra = divmod(layers, stages)
    out = [base]
    for _ in range(1, stages - 1):
        out.append(base + 1 if extra > 0 else base)
        extra -= 1 if extra > 0 else 0
    return out + [layers - sum(out)] if stages > 1 else [layers]


def virtual_stages_2025(layers: int, pp: int, multi_stage: bool, per_stage: int | None,
                        first: int = 1, last: int = 1) -> int:
    """Virtual stages of torchtitan 07c00d9: ``ceil((layers + first + last) / per_stage)``
    when ``pipeline_parallel_layers_per_stage`` is given, else ``2·pp`` for a multi-stage
    schedule, ``pp`` otherwise. Raises ``ValueError`` where torchtitan does (stages not a
    multiple of ``pp``; one stage per rank for a single-stage schedule, two or more for a
    multi-stage one)."""
    if per_stage is None:
        return 2 * pp if multi_stage else pp
    stages = math.ceil((layers + first + last) / per_stage)
    if stages % pp:
        raise ValueError(f"pipeline_parallel_layers_per_stage = {per_stage} gives {stages} "
                         f"virtual stages, not a multiple of pipeline_parallel_degree = {pp}")
    if (stages // pp != 1) if not multi_stage else (stages // pp < 2):
        raise ValueError(f"pipeline_parallel_layers_per_stage = {per_stage} gives "
                         f"{stages // pp} stages per rank; a "
                         f"{'multi' if multi_stage else 'single'}-stage schedule needs "
                         f"{'two or more' if multi_stage else 'exactly one'}")
    return stages


def split_2025(layers: int, stages: int, first: int = 1, last: int = 1) -> list[int]:
    """Transformer layers of each of ``stages`` virtual stages, torchtitan 07c00d9's split
    with the embedding weighing ``first`` layers and the output ``last`` (module docstring).

    Parameters
    ----------
    layers, stages : int
        The model's transformer layers and the virtual stages.
    first, last : int
        ``pipeline_parallel_first/last_stage_less_layers``.

    Returns
    -------
    list of int
        Layers per virtual stage, in stage order.

    Raises
    ------
    ValueError
        Where torchtitan raises (empty stages, a weight above a stage's share).
    """
    if stages == 1:
        return [layers]
    effective = layers + first + last
    base, extra = divmod(effective, stages)
    if base == 0 or first > base or last > base:
        raise ValueError(f"{layers} layers (+{first} for the embedding, +{last} for the "
                         f"output) over {stages} pipeline stages leave {base} per stage: "
                         "torchtitan refuses it")
    out, left = [], layers
    for k in range(stages):
        share = base + (1 if k < extra else 0)
        share -= first if k == 0 else last if k == stages - 1 else 0
        out.append(min(share, left))
        left -= out[-1]
    return out


def _layer_index(name: Any, where: str) -> int:
    """``N`` of a module name ``layers.N`` (ValueError naming ``where`` otherwise)."""
    head, _, tail = str(name).partition(".")
    if head != "layers" or not tail.isdigit():
        raise ValueError(f"{where}: {name!r} is not a transformer block's name (layers.N)")
    return int(tail)


def split_from_points(points: Any, layers: int) -> list[int]:
    """Layers of each stage from 9dec370's split points (each ``layers.N`` begins a stage;
    a comma-separated string or a list, as its config reader takes them)."""
    names = points.split(",") if isinstance(points, str) else list(points)
    starts = [_layer_index(n.strip() if isinstance(n, str) else n,
                           "pipeline_parallel_split_points") for n in names]
    bounds = [0, *starts, layers]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"pipeline_parallel_split_points {names} must rise from layers.1 to "
                         f"below layers.{layers}: every stage needs a layer")
    return [b - a for a, b in zip(bounds, bounds[1:])]


def split_from_fqns(parts: Any) -> list[int]:
    """Layers of each stage from 07c00d9's ``module_fqns_per_model_part``: the ``layers.N``
    names of each part (the embedding, norm and output are not layers)."""
    if not (isinstance(parts, list) and all(isinstance(p, list) for p in parts)):
        raise ValueError("module_fqns_per_model_part expects a list of lists of module names")
    other = {"tok_embeddings", "norm", "output"}
    return [sum(1 for n in part if n not in other and _layer_index(
        n, "module_fqns_per_model_part") >= 0) for part in parts]


def run_split(s: dict, old: bool, layers: int | None, pp: int, multi: bool) -> list[int] | None:
    """Layers of each virtual stage as torchtitan of the config's date splits them.

    Parameters
    ----------
    s : dict
        The config's ``[parallelism]`` section (2024's keys moved there).
    old : bool
        The 2024 format (torchtitan 9dec370) rather than 2025's (07c00d9).
    layers : int or None
        The model's transformer layers, if known.
    pp : int
        ``pipeline_parallel_degree``.
    multi : bool
        The schedule is a multi-stage one (Interleaved1F1B).

    Returns
    -------
    list of int or None
        Layers per virtual stage; None when the split needs ``layers`` and it is unknown.

    Raises
    ------
    ValueError
        Where torchtitan refuses the split, or the schedule cannot take its stage count.
    """
    points, fqns = s.get("pipeline_parallel_split_points"), s.get("module_fqns_per_model_part")
    first = s.get("pipeline_parallel_first_stage_less_layers", 1)
    last = s.get("pipeline_parallel_last_stage_less_layers", 1)
    if points and not old:
        raise ValueError("torchtitan 07c00d9 refuses pipeline_parallel_split_points "
                         "(deprecated): give module_fqns_per_model_part")
    if fqns is not None and not old:
        split = split_from_fqns(fqns)
    elif layers is None:
        return None
    elif points:
        split = split_from_points(points, layers)
    elif old:
        split = split_2024(layers, pp * (2 if multi else 1))
    else:
        split = split_2025(layers, virtual_stages_2025(
            layers, pp, multi, s.get("pipeline_parallel_layers_per_stage"), first, last),
            first, last)
    if len(split) % pp or (len(split) != pp if not multi else len(split) < 2 * pp):
        raise ValueError(f"{len(split)} stages over pipeline_parallel_degree = {pp}: a "
                         f"{'multi' if multi else 'single'}-stage schedule needs "
                         f"{'a multiple of it, two or more per rank' if multi else 'one per rank'}")
    return split

"""How torchtitan splits a decoder's transformer layers over its virtual pipeline stages,
as ``parallel.layers_per_virtual_stage`` (``ddlsim/workloads/decoder/split.py``): the split
rules of 2024 and 2025 are :mod:`ddlsim.workloads.decoder.titan_split`'s (a torchtitan
stack's default split too); the stage count is ``PP`` for a single-stage schedule (1F1B,
GPipe) and ``2·PP`` for a multi-stage one (Interleaved1F1B), or in 2025 (torchtitan 07c00d9
``torchtitan/models/llama3/infra/pipeline.py`` lines 64-110)
``ceil((L + first + last) / pipeline_parallel_layers_per_stage)`` when that is given.

A split the run gives itself: 9dec370's ``[experimental] pipeline_parallel_split_points``
(``layers.N`` begins a stage: ``pipeline_llama.py`` lines 70-72) and 07c00d9's ``[parallelism]
module_fqns_per_model_part`` (each stage's module names; its ``pipeline_parallel_split_points``
is refused there: ``models/llama3/infra/pipeline.py`` lines 41-45).
"""

from __future__ import annotations

import math
from typing import Any

from ..workloads.decoder.titan_split import split_2024, split_2025

__all__ = ["split_2024", "split_2025", "virtual_stages_2025", "split_from_points",
           "split_from_fqns", "run_split"]


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

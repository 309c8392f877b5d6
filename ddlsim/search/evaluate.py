"""Evaluate a grid of plans with the vectorised tier: enumerate, apply the rules, time, rank.

:func:`evaluate_grid` returns the evaluated plans as a :class:`pandas.DataFrame` (one row per
plan that passed every rule, sorted by the objective) and the rejected plans counted per
reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..gcpause import collector_paused
from .family import vector_family
from .pipeline import iteration_time
from .planconfig import ContextBases, group_rules, judge_failed_contexts, plan_config, \
    plan_sections
from .plans import RECOMPUTE, SCHEDULE, VECTOR_FIELDS, PlanSet, context_overrides, \
    enumerate_plans, plan_rules, stack_plan_rules, what_if_plans
from . import decoder  # noqa: F401  (registers the gpt and llama vectorised forms)
from .rejections import Rejections
from .ranking import DOES_NOT_FIT, METRICS, Grid, pareto_mask, rank, setting_column, \
    with_costs

__all__ = ["Grid", "base_config", "evaluate_grid", "evaluate_plans", "DOES_NOT_FIT", "METRICS", "rank",
           "pareto_mask"]

def _setting(path: str, value: Any) -> str:
    from ..sweeps import _setting as setting
    return setting(path, value)


def evaluate_plans(cfg, plans: PlanSet, memory: tuple[np.ndarray, np.ndarray] | None = None,
                   ctx: Any = None) -> dict[str, np.ndarray]:
    """Iteration time, memory and throughput of ``plans`` (all valid, one context) on the
    base config ``cfg``; ``memory``: their ``(bytes per device, capacity)`` when the caller
    has them (the family's ``memory``, as :func:`evaluate_grid` computes it first); ``ctx``:
    the family's ``prepare(cfg)`` when the caller has it.

    Returns
    -------
    dict of arrays: ``iteration_time_s``, ``memory_per_device_bytes``, ``capacity_bytes``,
    ``fits``, ``gpus``, ``tokens_per_s``, ``mfu``.
    """
    family = vector_family(cfg.model.architecture)
    ctx = family.prepare(cfg) if ctx is None else ctx
    costs = family.costs(ctx, plans, None)
    t = iteration_time(costs, plans)
    memory, capacity = family.memory(ctx, plans) if memory is None else memory
    gpus = plans["tp"] * plans["pp"] * plans["dp"]
    shape, s = cfg.model.shape(), cfg.train.seq_length
    tokens = plans["gbs"] * s
    model_flops = 3.0 * plans["gbs"] * (shape.stack_forward_flops(1, s)
                                        + shape.logits_forward_flops(1, s))
    peak = cfg.system.device.peak_flops[cfg.train.dtype]
    return {"iteration_time_s": t, "memory_per_device_bytes": memory,
            "capacity_bytes": capacity, "fits": memory <= capacity, "gpus": gpus,
            "tokens_per_s": tokens / t, "mfu": model_flops / (t * gpus * peak)}


def _contexts(data: dict, base_dir, overrides: Sequence[str], contexts: list[dict],
              built: tuple[list, Any] | None = None):
    """Each context's base config, or the ConfigError that rejects it; ``built``: a config
    already built with these settings, ``(settings, config)`` (the grid's base config: the
    context of a grid without context axes)."""
    from ..configload import build_config

    out = []
    for ctx in contexts:
        sets = [*overrides, *(_setting(p, v) for p, v in context_overrides(ctx).items())]
        if built is not None and sets == built[0]:
            out.append(built[1])
            continue
        try:
            out.append(build_config(data, sets, base_dir))
        except ConfigError as exc:
            out.append(exc)
    return out


def evaluate_grid(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list],
                  constraints, objective: str = "time", price_per_gpu_hour: float | None = None,
                  progress: Callable[[int, int], None] | None = None, dask=None,
                  dask_workers: int | None = None) -> Grid:
    """Every plan of ``axes`` on the config ``data`` (a mapping, with ``--set`` overrides),
    evaluated by the vectorised tier.

    Parameters
    ----------
    data, base_dir, overrides : the run config as :func:`ddlsim.configload.build_config`
        takes it (without its ``search`` section).
    axes : ``{config path: values}``.
    constraints : a :class:`~ddlsim.search.spec.Constraints`.
    objective : a key of :data:`~ddlsim.search.spec.OBJECTIVES`.
    price_per_gpu_hour : adds ``cost_per_iteration`` and ``cost_per_million_tokens``.
    progress : called with (contexts done, contexts).
    dask, dask_workers : where a grid with no vectorised form predicts its plans
        (:func:`~ddlsim.search.exact.evaluate_exact`); the vectorised tier ignores them.

    Returns
    -------
    Grid
    """
    # a cold grid allocates many short-lived objects (op lists, pydantic copies, numpy
    # arrays), nearly all freed by their reference counts; their allocation triggered ~25
    # collections a grid, ~3 % of its CPU time (py-spy, 2026-11-30, docs/search.md "Speed"),
    # which found ~1,000 objects in cycles: paused, ~4,000 wait for the next collection
    with collector_paused():
        return _evaluate_grid(data, base_dir, overrides, axes, constraints, objective,
                              price_per_gpu_hour, progress, dask, dask_workers)




def _evaluate_grid(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list],
                   constraints, objective: str, price_per_gpu_hour: float | None,
                   progress: Callable[[int, int], None] | None, dask=None,
                   dask_workers: int | None = None) -> Grid:
    """:func:`evaluate_grid`'s work, with the collector as the caller set it."""
    base, fields, on_neutral, unset = _base_config(data, base_dir, overrides, axes)
    neutral = [*overrides, *(_setting(p, v) for p, v in context_overrides({}).items())]
    ctx_cfgs = _contexts(data, base_dir, overrides, _context_combinations(axes),
                         (neutral, base) if on_neutral else None)
    prepared = _prepared(data, base_dir, overrides, axes, base, ctx_cfgs)
    if prepared is None or _stack_defaulted(ctx_cfgs, unset):
        from .exact import evaluate_exact
        return evaluate_exact(data, base_dir, overrides, axes, constraints, objective,
                              price_per_gpu_hour, progress, dask, dask_workers)
    if constraints.global_batch_size is not None:
        fields["train.global_batch_size"] = constraints.global_batch_size
    sections = plan_sections(data, base_dir, overrides)
    bases = ContextBases(data, base_dir, overrides, base)   # each context's model and system
    devices = _context_devices(bases, _context_combinations(axes), base)
    fill = [min(d, constraints.max_gpus or d) for d in devices]
    # the fields are laid out flat for the plans the rules pass only (the rules read the grid)
    plans = enumerate_plans(axes, fields, fill, lazy=True)
    verdicts = Rejections(plans.shape)
    reject = verdicts.reject
    good = [None if isinstance(c, ConfigError) else c for c in ctx_cfgs]
    family = vector_family(base.model.architecture)

    def build(plan):
        return plan_config(sections, bases, plan)

    # what the stack cannot run first: predict names the stack's rule before any of the
    # config's own (a model's limit on a plan no framework runs is not the reason)
    for text, mask in stack_plan_rules(plans, good, True):     # what the stack cannot run
        reject(text, mask)
    # the config's own rules (on the plans still pending), then the batch arithmetic
    for text, mask in [*group_rules(plans, good, bases, sections, True, verdicts.pending),
                       *plan_rules(plans, good, devices, constraints.max_gpus, True)]:
        reject(text, mask)
    # a context whose config fails on the neutral plan alone: its plans judged by the config
    judge_failed_contexts(plans, ctx_cfgs, verdicts.free, reject, build, family.prepare)
    alive = verdicts.alive()
    alive_plans = plans.take(alive)
    if hasattr(family, "beyond") and family.beyond(good, alive_plans):
        from .exact import evaluate_exact   # a plan beyond the closed form: the exact engine
        return evaluate_exact(data, base_dir, overrides, axes, constraints, objective,
                              price_per_gpu_hour, progress, dask, dask_workers)
    parts = []
    for i, cfg in enumerate(ctx_cfgs):
        here = alive_plans["context"] == i
        if here.any():
            # prepared above, or a failed context given a plan's config by the judge
            ctx = prepared[i] if prepared[i] is not None else family.prepare(cfg)
            index = alive[here]
            sub = alive_plans.take(here) if len(ctx_cfgs) > 1 else alive_plans
            # memory first: a plan that must fit and does not is not timed (nor, where the
            # family has a floor of its memory, given its whole memory when over the floor)
            if constraints.must_fit and hasattr(family, "memory_floor"):
                fits = _reject_over(family.memory_floor(ctx, sub), index, reject, len(plans))
                index, sub = index[fits], sub.take(fits)
            if len(index):
                memory, capacity = family.memory(ctx, sub)
                if constraints.must_fit:
                    fits = _reject_over((memory, capacity), index, reject, len(plans))
                    index, sub = index[fits], sub.take(fits)
                    memory, capacity = memory[fits], capacity[fits]
            if len(index):
                parts.append((index, sub, evaluate_plans(cfg, sub, (memory, capacity), ctx)))
        if progress is not None:
            progress(i + 1, len(ctx_cfgs))
    seqs = [base.train.seq_length if isinstance(c, ConfigError) else c.train.seq_length
            for c in ctx_cfgs]   # each context's sequence (a train.seq_length axis)
    frame = _frame(plans, parts, verdicts.free, seqs, price_per_gpu_hour)
    if base.software.what_if or any(   # plans a stack cannot run were evaluated: say which
            not isinstance(c, ConfigError) and c.software.what_if for c in ctx_cfgs):
        frame["what_if"] = what_if_plans(plans.take(frame["plan"].to_numpy()), [
            None if isinstance(c, ConfigError) else c for c in ctx_cfgs])
    frame = rank(frame, objective)
    frame.attrs["tier"] = "vectorised"
    return Grid(frame, verdicts.counts(), len(plans))


def _context_devices(bases: ContextBases, contexts: list[dict], base) -> list[int]:
    """Each context's devices (its cluster's: a ``system.preset`` axis may change them);
    the run's where the context's own system does not validate (its plans are rejected
    with that reason)."""
    out = []
    for context in contexts:
        try:
            out.append(bases(context).system.num_devices)
        except ConfigError:
            out.append(base.system.num_devices)
    return out


def _reject_over(memory: tuple[np.ndarray, np.ndarray], index: np.ndarray,
                 reject: Callable[[str, np.ndarray], None], total: int) -> np.ndarray:
    """Per plan, whether its ``memory`` (bytes, capacity) fits; the others (positions
    ``index`` in a grid of ``total`` plans) rejected as not fitting."""
    used, capacity = memory
    fits = used <= capacity
    over = np.zeros(total, dtype=bool)
    over[index[~fits]] = True
    reject(DOES_NOT_FIT, over)
    return fits


def vectorised(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list],
               base) -> bool:
    """Whether the grid's every context has a vectorised form: the model's family registers
    one and its ``prepare`` accepts each context's base config (else the grid is searched by
    the exact engine, :mod:`.exact`)."""
    cfgs = _contexts(data, base_dir, overrides, _context_combinations(axes))
    return _prepared(data, base_dir, overrides, axes, base, cfgs) is not None


def _context_combinations(axes: Mapping[str, list]) -> list[dict]:
    """Every combination of the axes that are not vector fields (the contexts), in the
    order of :func:`~ddlsim.search.plans.enumerate_plans`."""
    import itertools
    context_axes = {p: v for p, v in axes.items() if p not in VECTOR_FIELDS}
    return [dict(zip(context_axes, combo))
            for combo in itertools.product(*context_axes.values())]


def _prepared(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list], base,
              cfgs: list) -> list | None:
    """Each context's ``family.prepare`` (None for a context whose base config failed,
    ``cfgs[i]`` a ConfigError), or None when the grid has no vectorised form
    (:func:`vectorised`)."""
    try:
        family = vector_family(base.model.architecture)
    except ConfigError:
        return None
    from ..configload import build_config
    out = []
    for ctx, cfg in zip(_context_combinations(axes), cfgs):
        try:
            if not isinstance(cfg, ConfigError):
                out.append(family.prepare(cfg))
                continue
            out.append(None)
            # a context that needs more than the one-device plan (a 2-D tensor grid): the
            # config as written with the context's values, if that builds, tells its form
            try:
                cfg = build_config(data, [*overrides, *(_setting(p, v) for p, v in ctx.items())],
                                   base_dir)
            except ConfigError:
                continue      # rejected plan by plan (planconfig.judge_failed_contexts)
            family.prepare(cfg)
        except ConfigError:
            return None
    return out


def base_config(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list]):
    """``(config, fields)``: the config without its search section, built with the vector
    fields set to a plan every rule accepts (:func:`~ddlsim.search.plans.context_overrides`:
    the plan is the search's, the rest must be valid alone), and the config's own values of
    the vector fields and the schedule (the parallel and train sections validated alone, so a
    batch that does not divide over the default DP is no error: the plans' rules judge it)."""
    cfg, fields, _, _ = _base_config(data, base_dir, overrides, axes)
    return cfg, fields


def _base_config(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list]):
    """:func:`base_config`, whether the config is the one built on the neutral plan (else
    the config as written), and the plan fields (``parallel.…`` vector fields) the config
    leaves unset and no axis sets (:func:`_stack_defaulted`)."""
    from ..config import ParallelConfig, TrainConfig
    from pydantic import ValidationError

    from ..configload import apply_overrides, build_config, format_validation_error, \
        resolve_section

    sections = {k: resolve_section(k, data[k], base_dir, expand=False)
                for k in ("parallel", "train") if k in data}
    sections = apply_overrides(sections, [o for o in overrides
                                          if str(o).startswith(("parallel.", "train."))])
    own = {}
    for name, schema in (("parallel", ParallelConfig), ("train", TrainConfig)):
        try:
            own[name] = schema.model_validate(sections.get(name, {}))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, name)) from None
    neutral = [_setting(p, v) for p, v in context_overrides({}).items()]
    try:
        cfg, on_neutral = build_config(data, [*overrides, *neutral], base_dir), True
    except ConfigError:
        # a plan that needs more than one device as given (expert parallelism, a 2-D tensor
        # grid): the config as written is the base, and the exact tier searches it
        cfg, on_neutral = build_config(data, overrides, base_dir), False
    fields = {p: _field(own, p) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = own["parallel"].schedule
    unset = {p for p in VECTOR_FIELDS if p.startswith("parallel.") and p not in axes
             and p.split(".")[1] not in own["parallel"].model_fields_set}
    return cfg, fields, on_neutral, unset


def _stack_defaulted(cfgs: list, unset: set[str]) -> bool:
    """Whether a context's stack gives a default (its ``plan:`` in software.yaml:
    torchtitan's ZeRO-3, which applies where DP × CP > 1, ``RunConfig._plan_from_stack``) to
    a plan field the config leaves unset and no axis sets (``unset``): each plan's config
    then decides it, so the grid goes to the exact tier, which builds them (the vectorised
    tier's fields hold one value for the grid)."""
    from ..software import plan_defaults
    return any(f"parallel.{f}" in unset for c in cfgs if not isinstance(c, ConfigError)
               for f in plan_defaults(c.software.name))


def _field(sections: dict, path: str) -> Any:
    section, key = path.split(".")
    return getattr(sections[section], key)


def _frame(plans: PlanSet, parts, free: np.ndarray, seqs: list[int], price: float | None):
    """The evaluated plans as a frame; ``seqs``: each context's sequence length (the
    tokens a plan's iteration trains, for its cost per token)."""
    import pandas as pd

    frames = []
    tokens = []
    for index, sub, metrics in parts:
        keep = free[index]
        cols: dict[str, Any] = {"plan": index[keep]}
        ctx = sub["context"][keep]
        for path in (plans.contexts[0] if plans.contexts else {}):
            cols[path] = setting_column(plans.contexts[c][path] for c in ctx)
        for path, field in VECTOR_FIELDS.items():
            a = sub[field][keep]
            cols[path] = (np.array(RECOMPUTE, dtype=object)[a] if field == "recompute"
                          else a.astype(bool) if field == "sp" else a)
        cols["parallel.schedule"] = np.array(SCHEDULE, dtype=object)[sub["schedule"][keep]]
        for k, v in metrics.items():
            cols[k] = v[keep]
        frames.append(pd.DataFrame(cols))
        tokens.append(sub["gbs"][keep] * np.asarray(seqs)[ctx])
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["plan", *(plans.contexts[0] if plans.contexts else {}), *VECTOR_FIELDS,
                 "parallel.schedule", *METRICS])
    return with_costs(frame, np.concatenate(tokens) if tokens else np.zeros(0), price)

"""Plans as arrays: the product of the search axes, and the config rules applied to all at once.

A :class:`PlanSet` holds one numpy array per plan field (struct of arrays). The fields the
vectorised tier varies inside one evaluation are :data:`VECTOR_FIELDS`; any other
``parallel.*`` / ``train.*`` axis (dtype, optimizer, bucket size, collective algorithms, …) is
a *context* axis: the plans are grouped by its values and each group gets its own base config
(:func:`context_overrides`).

Each rule gives a mask of the plans it rejects and a reason, so the search can count
rejections per reason. Most of the config's rules are judged by the config itself, once per
distinct combination of the fields they read (:func:`~ddlsim.search.planconfig.group_rules`);
:func:`plan_rules` states on arrays only the batch arithmetic, whose fields (DP, micro-batch,
global batch) take too many combinations to build each; :func:`stack_plan_rules` evaluates
the software stack's rule objects (:mod:`ddlsim.stackrules`, the ones ``RunConfig`` applies)
on the arrays; :func:`check_plan_configs` judges plans by the config, once per structural
combination, for contexts whose config fails on the neutral plan. ``tests/test_search_plans.py``
and ``tests/test_stack_rules.py`` check, plan by plan on grids, that the search accepts
exactly the plans ``RunConfig`` accepts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["VECTOR_FIELDS", "RECOMPUTE", "SCHEDULE", "PlanSet", "enumerate_plans", "plan_rules",
           "context_overrides", "check_plan_configs", "what_if_plans", "stack_plan_rules"]

#: Config path → PlanSet field, for the fields varied as arrays.
VECTOR_FIELDS = {
    "parallel.tensor_model_parallel_size": "tp",
    "parallel.pipeline_model_parallel_size": "pp",
    "parallel.data_parallel_size": "dp",
    "parallel.virtual_pipeline_model_parallel_size": "v",
    "parallel.sequence_parallel": "sp",
    "parallel.zero_stage": "zero",
    "train.micro_batch_size": "mbs",
    "train.global_batch_size": "gbs",
    "train.recompute": "recompute",
}
#: Codes of ``train.recompute`` in :attr:`PlanSet.recompute`.
RECOMPUTE = ("none", "selective", "full")
#: Codes of ``parallel.schedule`` in :attr:`PlanSet.schedule`.
SCHEDULE = ("1f1b", "interleaved", "gpipe")


class PlanSet(dict):
    """``{field: array}`` with one entry per plan; ``context`` indexes :attr:`contexts`.

    Fields: ``tp, pp, dp, v, sp, zero, mbs, gbs, recompute`` (codes of :data:`RECOMPUTE`),
    ``schedule`` (codes of :data:`SCHEDULE`), ``context``.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], contexts: list[dict[str, Any]],
                 grid: Mapping[str, np.ndarray] | None = None):
        super().__init__(arrays)
        self.contexts = contexts
        #: for a whole product of axes (:func:`enumerate_plans`), each field as an array that
        #: broadcasts to the product's shape (axis k of the shape is the k-th search axis):
        #: a rule computed on these is computed once per distinct value of the fields it reads
        self.grid = grid
        #: the product's shape (None without a grid)
        self.shape = None if grid is None else np.broadcast_shapes(*(a.shape for a in
                                                                     grid.values()))

    def __missing__(self, field: str) -> np.ndarray:
        """A field of a lazy product (:func:`enumerate_plans` with ``lazy``), laid out flat in
        plan order on first use."""
        if self.grid is None or field not in self.grid:
            raise KeyError(field)
        self[field] = out = flat(self.grid[field], self.shape)
        return out

    def __len__(self) -> int:  # plans, not fields
        return len(self["tp"]) if self.grid is None else math.prod(self.shape)

    def take(self, index: np.ndarray) -> "PlanSet":
        """The plans at ``index`` (a boolean mask or integer positions)."""
        index = np.asarray(index)
        if index.dtype == bool:  # positions once, not a mask pass per field
            index = np.flatnonzero(index)
        if self.grid is None:
            return PlanSet({k: v[index] for k, v in self.items()}, self.contexts)
        # a product's fields read at the plans' coordinates, none laid out in full
        at = np.unravel_index(index, self.shape)
        none = np.zeros(len(index), dtype=np.intp)   # an axis the field does not vary on
        return PlanSet({k: _at(g, at, none) for k, g in self.grid.items()}, self.contexts)

    def overrides(self, i: int) -> dict[str, Any]:
        """Plan ``i`` as ``{config path: value}`` (its context's values included), the form
        ``--set`` takes."""
        out = dict(self.contexts[int(self["context"][i])])
        for path, field in VECTOR_FIELDS.items():
            value = self[field][i].item()
            if field == "recompute":
                value = RECOMPUTE[value]
            elif field == "sp":
                value = bool(value)
            elif field == "v":
                value = None if value == 1 else value
            out[path] = value
        out["parallel.schedule"] = SCHEDULE[int(self["schedule"][i])]
        return out


def _at(field: np.ndarray, at: tuple[np.ndarray, ...], none: np.ndarray) -> np.ndarray:
    """A grid field (an array that broadcasts to the grid's shape) at the plans whose
    coordinates are ``at``; ``none``: zeros, the coordinate on an axis the field does not
    vary on. A field that varies on one axis (most: each search axis's own) is read from
    its values by that axis's coordinates alone."""
    varies = [k for k, n in enumerate(field.shape) if n > 1]
    if len(varies) <= 1:
        return field.reshape(-1)[at[varies[0]] if varies else none]
    return field[tuple(c if n > 1 else none for c, n in zip(at, field.shape))]


def enumerate_plans(axes: Mapping[str, Sequence[Any]], base: Mapping[str, Any],
                    devices: int | Sequence[int], lazy: bool = False) -> PlanSet:
    """Every combination of ``axes`` (the first varying slowest), as a :class:`PlanSet`.

    Parameters
    ----------
    axes : ``{config path: values}`` (values already in the config's units).
    base : the base config's values of the :data:`VECTOR_FIELDS` and ``parallel.schedule``.
    devices : the devices a derived data-parallel size fills (``devices // (TP·PP)``), or
        one count per context (a ``system.preset`` axis whose clusters differ).
    lazy : lay a field out flat only when it is asked for (:meth:`PlanSet.__missing__`;
        :meth:`PlanSet.take` reads the grid): the rules read the grid, so the fields of a
        large product are laid out for the plans that pass them only.

    Returns
    -------
    PlanSet
        ``dp`` is 0 where it is derived and the devices are not a multiple of TP·PP (a rule
        rejects those plans); ``schedule`` is the context's, or ``interleaved`` for every plan
        with VPP ≥ 2 when the schedule is not an axis (``1f1b`` for VPP = 1 if the base
        schedule is interleaved).
    """
    vector = {p: v for p, v in axes.items() if p in VECTOR_FIELDS}
    context_axes = {p: v for p, v in axes.items() if p not in VECTOR_FIELDS}
    contexts = [dict(zip(context_axes, combo)) for combo in itertools.product(*context_axes.values())]
    sizes = tuple(len(v) for v in axes.values())
    position = {path: k for k, path in enumerate(axes)}

    def along(path: str, values: np.ndarray) -> np.ndarray:
        """``values`` (one per value of axis ``path``) laid along that axis of the grid."""
        shape = [1] * len(sizes)
        shape[position[path]] = len(values)
        return values.reshape(shape)

    one = (1,) * len(sizes)
    grid: dict[str, np.ndarray] = {}
    for path, field in VECTOR_FIELDS.items():
        if path in vector:
            grid[field] = along(path, np.array([_code(field, x) for x in vector[path]],
                                               dtype=np.int64))
        else:
            grid[field] = np.full(one, _code(field, base[path]), dtype=np.int64)
    ctx = np.zeros(one, dtype=np.int64)
    stride = 1
    for path in reversed(list(context_axes)):
        k = len(context_axes[path])
        ctx = ctx + along(path, np.arange(k, dtype=np.int64) * stride)
        stride *= k
    grid["context"] = ctx
    derived = "parallel.data_parallel_size" not in vector
    if derived:
        tpp = grid["tp"] * grid["pp"]
        fill = _per_context(devices, ctx)
        grid["dp"] = np.where(fill % tpp == 0, fill // tpp, 0)
    grid["schedule"] = _schedules(grid["v"], ctx, contexts, base["parallel.schedule"])
    out = {} if lazy else {field: flat(a, sizes) for field, a in grid.items()}
    return PlanSet(out, contexts, grid)


def _per_context(devices: int | Sequence[int], ctx: np.ndarray) -> int | np.ndarray:
    """``devices`` as one count where every context has it, else each plan's context's
    count laid on ``ctx``."""
    if np.ndim(devices) == 0 or len(set(devices)) == 1:
        return int(np.ravel(devices)[0])
    return np.asarray(devices, dtype=np.int64)[ctx]


def microbatches(plans) -> np.ndarray:
    """Micro-batches per step of each plan, ``gbs // (mbs · DP)`` (0 where that is no whole
    batch, refused by :func:`plan_rules`; DP 0 read as 1)."""
    return plans["gbs"] // np.maximum(plans["mbs"] * np.maximum(plans["dp"], 1), 1)


def flat(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` broadcast to ``shape`` as a new flat array, in plan order (first axis slowest)."""
    a = np.asarray(a)
    out = np.empty(math.prod(shape), dtype=a.dtype)
    out.reshape(shape)[...] = a
    return out


def _schedules(v: np.ndarray, ctx: np.ndarray, contexts: list[dict], base: str) -> np.ndarray:
    per_ctx = np.array([SCHEDULE.index(c.get("parallel.schedule", base)) for c in contexts])
    sched = per_ctx[ctx]
    if all("parallel.schedule" not in c for c in contexts):
        plain = SCHEDULE.index("1f1b") if base == "interleaved" else SCHEDULE.index(base)
        sched = np.where(v >= 2, SCHEDULE.index("interleaved"), plain)
    return sched


def _code(field: str, value: Any) -> int:
    if field == "recompute":
        return RECOMPUTE.index(value)
    if field == "v":
        return 1 if value is None else int(value)
    if field == "dp" and value is None:
        return 0
    return int(value)


def context_overrides(context: Mapping[str, Any]) -> dict[str, Any]:
    """A context's overrides with the vector fields set to a plan every rule accepts (one
    device, one micro-batch), so building its base config tests the context alone."""
    neutral = {"parallel.tensor_model_parallel_size": 1,
               "parallel.pipeline_model_parallel_size": 1, "parallel.data_parallel_size": 1,
               "parallel.virtual_pipeline_model_parallel_size": None,
               "parallel.sequence_parallel": False, "parallel.zero_stage": 0,
               "parallel.schedule": "1f1b", "train.micro_batch_size": 1,
               "train.global_batch_size": 1}
    return {**neutral, **context}


def plan_rules(plans: PlanSet, ctx_cfgs: list, devices: int | Sequence[int],
               max_gpus: int | None,
               shaped: bool = False) -> list[tuple[str, np.ndarray]]:
    """``(reason, rejected mask)`` of the config's batch arithmetic (the rules that read DP,
    the micro-batch and the global batch: too many combinations to build each), then the
    search's ``max_gpus``. The software stack's rules are :func:`stack_plan_rules`; the
    config's other rules are judged by the config itself
    (:func:`~ddlsim.search.planconfig.group_rules`).

    Parameters
    ----------
    plans : the plans.
    ctx_cfgs : each context's base :class:`~ddlsim.config.RunConfig`, or None for a context
        whose config fails on the neutral plan (the rules that read the context pass its
        plans; :func:`check_plan_configs` judges them).
    devices : the system's devices, or each context's (:func:`enumerate_plans`).
    max_gpus : the search's limit on TP·PP·DP, or None.
    shaped : masks that broadcast to the grid's shape (:attr:`PlanSet.shape`) rather than
        one flag per plan, for plans with a grid.
    """
    f = plans if plans.grid is None else plans.grid  # the grid's: once per distinct value
    tp, pp, dp, mbs, gbs = (f[k] for k in ("tp", "pp", "dp", "mbs", "gbs"))
    sched = f["schedule"]
    inter = sched == SCHEDULE.index("interleaved")
    safe_dp = np.maximum(dp, 1)
    m = microbatches(f)
    from ..limits import BOUNDS
    most_mb = BOUNDS["microbatches"].high
    rules = [
        ("devices not a multiple of TP x PP", dp == 0),
        ("more ranks than the system has devices",
         tp * pp * dp > _per_context(devices, f["context"])),
        ("global batch not divisible by micro-batch x DP", gbs % np.maximum(mbs * safe_dp, 1) != 0),
        ("too many micro-batches", m > most_mb),
        *_interleaved_rules(f["context"], ctx_cfgs, inter, pp, m),
    ]
    if max_gpus is not None:
        rules.append((f"more than max_gpus = {max_gpus} GPUs", tp * pp * dp > max_gpus))
    return _laid_out(plans, rules, shaped)


def _interleaved_rules(context, ctx_cfgs: list, inter, pp, m) -> list[tuple[str, np.ndarray]]:
    """The interleaved schedule's grouping of the micro-batches as each context's stack runs it
    (:func:`~ddlsim.workloads.schedules.groups_refused`), one rule per distinct grouping: a
    context None passes."""
    from ..workloads.schedules import groups_refused
    rules: dict[tuple, np.ndarray] = {}
    for i, cfg in enumerate(ctx_cfgs):
        if cfg is None:
            continue
        key = (cfg.software.interleaved_groups, cfg.parallel.microbatch_group_size_per_vp_stage)
        here = inter & (context == i) if len(ctx_cfgs) > 1 else inter
        bad = here & groups_refused(key[0], pp, m, key[1])
        rules[key] = bad if key not in rules else rules[key] | bad
    return [(_GROUP_REASONS[rule] if given is None else
             f"interleaved: the micro-batches do not fit microbatch_group_size_per_vp_stage = "
             f"{given} (Megatron-Core's groups)", mask) for (rule, given), mask in rules.items()]


#: Why the interleaved schedule refuses a plan's micro-batches, per stack grouping.
_GROUP_REASONS = {
    "pipeline_size": "interleaved needs micro-batches divisible by PP",
    "megatron_core": "interleaved needs micro-batches divisible by PP",
    "torch_rounds": "interleaved needs micro-batches divisible by max(1, micro-batches // PP) "
                    "(torch pipelining's rounds)",
}


def _laid_out(plans: PlanSet, rules, shaped: bool) -> list[tuple[str, np.ndarray]]:
    """``rules``' masks one flag per plan, or as computed on the grid with ``shaped``."""
    if shaped and plans.grid is not None:
        return [(reason, np.asarray(mask, dtype=bool)) for reason, mask in rules]
    shape = np.shape(plans["tp"]) if plans.grid is None else plans.shape
    return [(reason, flat(np.asarray(mask, dtype=bool), shape)) for reason, mask in rules]


def stack_plan_rules(plans: PlanSet, ctx_cfgs: list,
                     shaped: bool = False) -> list[tuple[str, np.ndarray]]:
    """``(reason, rejected mask)`` of the software stack's rules (:mod:`ddlsim.stackrules`,
    the objects ``RunConfig`` applies) on the plans, once per distinct value on the grid's
    axes; none under ``what_if``, none for a context None; ``shaped`` as
    :func:`plan_rules` takes it."""
    f = plans if plans.grid is None else plans.grid
    sched = f["schedule"]
    rules = _stack_rules(f, ctx_cfgs, sched == SCHEDULE.index("interleaved"),
                         sched == SCHEDULE.index("1f1b"))
    return _laid_out(plans, rules, shaped)


def _stack_rules(f, ctx_cfgs: list, inter, plain,
                 what_ifs: bool = False) -> list[tuple[str, np.ndarray]]:
    """The software stack's rules (:mod:`ddlsim.stackrules`, the objects ``RunConfig``
    applies) on the plans' arrays, each context's own stack's on its plans (a
    ``system.software`` axis); none under ``what_if`` (the plans are predicted as what-ifs)
    unless ``what_ifs`` asks which plans they are, none for a context None (judged through
    its config) or one whose ranks run a program of their own (a GPT proxy:
    :func:`~ddlsim.stackrules.checks.runs_own_program`)."""
    from ..stackrules import PlanFacts, stack_rejections
    from ..stackrules.checks import runs_own_program
    from ..stackrules.facts import context_facts

    stacks: dict[str, list[int]] = {}   # each stack's contexts
    for i, c in enumerate(ctx_cfgs):
        if c is not None and (what_ifs or not c.software.what_if) and not runs_own_program(c):
            stacks.setdefault(c.software.name, []).append(i)
    if not stacks:
        return []
    ctx = f["context"]
    per_ctx = [context_facts(c) for c in ctx_cfgs]   # each context's own, once
    fixed = {k: np.array([d[k] for d in per_ctx])[ctx] for k in per_ctx[0]}
    etp = np.array([0 if c is None or c.parallel.expert_tensor_parallel_size is None
                    else c.parallel.expert_tensor_parallel_size for c in ctx_cfgs])[ctx]
    facts = PlanFacts.of(tp=f["tp"], pp=f["pp"], zero=f["zero"], sp=f["sp"].astype(bool),
                         interleaved=inter, one_f_one_b=plain, dp=f["dp"],
                         etp=np.where(etp > 0, etp, f["tp"]),   # unset: TP (ParallelConfig.etp)
                         selective=f["recompute"] == RECOMPUTE.index("selective"),
                         full_recompute=f["recompute"] == RECOMPUTE.index("full"), **fixed)
    whole = len(stacks) == 1 and len(next(iter(stacks.values()))) == len(ctx_cfgs)
    out = []
    for name, members in stacks.items():
        mine = True if whole else np.isin(ctx, members)
        out += [(reason, mask & mine) for reason, mask in stack_rejections(name, facts)]
    return out


#: The fields of a plan that the config's structural rules read (the rest is batch arithmetic,
#: which :func:`plan_rules` states on arrays)
STRUCTURAL = ("tp", "pp", "v", "sp", "zero", "schedule", "context")


def check_plan_configs(plans: PlanSet, alive: np.ndarray, build) -> tuple[dict, dict]:
    """The config's own validation of the plans at ``alive``, once per distinct combination
    of their :data:`STRUCTURAL` fields (on the first such plan, whose batch the array rules
    accepted).

    Parameters
    ----------
    plans : the plans.
    alive : positions of the plans to judge.
    build : ``build(overrides) -> RunConfig``, raising ConfigError.

    Returns
    -------
    (rejected, configs): ``{message: positions it rejects}``, and ``{context: the first
    config that validated}``.
    """
    rejected: dict[str, list[np.ndarray]] = {}
    configs: dict[int, object] = {}
    if not len(alive):
        return {}, configs
    keys = np.stack([plans[k][alive] for k in STRUCTURAL], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    from ..errors import ConfigError
    for j, i in enumerate(alive[first].tolist()):
        try:
            cfg = build(plans.overrides(i))
        except ConfigError as exc:
            rejected.setdefault(str(exc), []).append(alive[inverse == j])
        else:
            configs.setdefault(int(plans["context"][i]), cfg)
    return {r: np.concatenate(p) for r, p in rejected.items()}, configs


def what_if_plans(plans: PlanSet, ctx_cfgs: list) -> np.ndarray:
    """Per plan, whether its software stack cannot run it (a what-if, evaluated because the
    stack says ``what_if: true``): any rule of :mod:`ddlsim.stackrules` rejects it."""
    inter = plans["schedule"] == SCHEDULE.index("interleaved")
    plain = plans["schedule"] == SCHEDULE.index("1f1b")
    out = np.zeros(len(plans), dtype=bool)
    for _, mask in _stack_rules(plans, ctx_cfgs, inter, plain, what_ifs=True):
        out |= np.broadcast_to(mask, out.shape)
    return out

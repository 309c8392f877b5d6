"""One plan of a search as the config itself judges it.

The search builds one base config per context (its non-vectorised axis values) on a neutral
plan: one device, no pipeline, ZeRO-0 (:func:`~ddlsim.search.plans.context_overrides`). A
context value that needs more of the plan than that — ``overlap_p2p_comm: true`` (a
pipeline), ``tp_comm_overlap: bulk`` (TP and sequence parallelism), an axis
``schedule: [interleaved]`` (VPP ≥ 2, PP ≥ 2) — fails there although many of its plans are
valid. Such a context's plans are judged here by the config's own validation
(:func:`plan_config`, as ``ddlsim predict`` validates a config), once per distinct structural
combination (:func:`~ddlsim.search.plans.check_plan_configs`), and the first plan that
validates gives the context its base config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..config import ParallelConfig, RunConfig, TrainConfig
from ..configload import format_validation_error
from ..errors import ConfigError
from .plans import SCHEDULE, VECTOR_FIELDS, PlanSet, check_plan_configs, context_overrides

__all__ = ["plan_sections", "plan_config", "ContextBases", "judge_failed_contexts", "RULE_GROUPS",
           "group_rules", "first_clause"]

#: The sections a plan of the search sets itself; a context's other paths (``model.*``,
#: ``system.*``) are its model's and system's (:class:`ContextBases`).
PLAN_SECTIONS = ("parallel.", "train.")


def plan_sections(data: dict, base_dir: Any, overrides: Sequence[str]) -> dict:
    """The run config's ``parallel`` and ``train`` sections as mappings (presets resolved),
    with the ``--set`` overrides of those sections applied."""
    from ..configload import apply_overrides, resolve_section

    sections = {k: resolve_section(k, data[k], base_dir, expand=False)
                for k in ("parallel", "train") if k in data}
    return apply_overrides(sections, [o for o in overrides
                                      if str(o).startswith(("parallel.", "train."))])


class ContextBases:
    """The model and system of each plan's context, for :func:`plan_config`.

    A context that sets ``model.*`` or ``system.*`` fields (a layer count, the software
    stack, the cluster) is judged on its own model and system, validated on their own with
    the context's values, so even a context whose config fails on the neutral plan (a
    parallel option it needs more devices for) has them; a plan without such paths takes the
    run's ``base``. Each distinct context is validated once.
    """

    def __init__(self, data: dict, base_dir: Any, overrides: Sequence[str], base: Any):
        self._source = (data, base_dir, list(overrides))
        self.base = base
        self._memo: dict[tuple, Any] = {}

    def __call__(self, plan: Mapping[str, Any]) -> Any:
        """An object with the ``model`` and ``system`` of ``plan``'s context."""
        own = [(p, v) for p, v in plan.items() if not p.startswith(PLAN_SECTIONS)]
        if not own:
            return self.base
        key = tuple(sorted((p, repr(v)) for p, v in own))
        hit = self._memo.get(key)
        if hit is None:
            from types import SimpleNamespace

            from ..configload import validated_sections
            from ..sweeps import _setting
            data, base_dir, overrides = self._source
            try:
                parsed = validated_sections(data, [*overrides, *(_setting(p, v) for p, v in own)],
                                            base_dir, names=("model", "system"))
                hit = SimpleNamespace(model=parsed["model"], system=parsed["system"])
            except ConfigError as exc:
                hit = exc
            self._memo[key] = hit
        if isinstance(hit, ConfigError):
            raise ConfigError(str(hit))
        return hit


def plan_config(sections: dict, base: Any, plan: Mapping[str, Any],
                memo: dict | None = None) -> Any:
    """The :class:`~ddlsim.config.RunConfig` of one plan.

    Parameters
    ----------
    sections : :func:`plan_sections` of the run config.
    base : a config of the run (its model and system are the plan's), or a
        :class:`ContextBases`, which gives each plan its context's.
    plan : ``{config path: value}`` in the config's units, as
        :meth:`~ddlsim.search.plans.PlanSet.overrides` gives it.
    memo : a dict the caller keeps across plans: each distinct ``parallel`` and ``train``
        section is validated once (a section's model is frozen; the probes of
        :func:`group_rules` share most train sections), the run config every time.

    Returns
    -------
    RunConfig
        validated as :func:`~ddlsim.configload.build_config` validates a config.

    Raises
    ------
    ConfigError
        the config's own message for the plan.
    """
    if isinstance(base, ContextBases):
        base = base(plan)
    parts = dict(sections)   # the mappings on each plan path copied, the rest shared
    copied: set[tuple[str, ...]] = set()
    for path, value in plan.items():
        if not path.startswith(PLAN_SECTIONS):   # the context's model and system: in base
            continue
        keys = path.split(".")
        node = parts
        for depth, key in enumerate(keys[:-1], 1):
            if tuple(keys[:depth]) not in copied:
                node[key] = dict(node.get(key, {}))
                copied.add(tuple(keys[:depth]))
            node = node[key]
        node[keys[-1]] = value
    parsed = {}
    for name, schema in (("parallel", ParallelConfig), ("train", TrainConfig)):
        section = parts.get(name, {})
        # the values are the config's scalars, lists and mappings: one repr, one value
        key = None if memo is None else (name, repr(sorted(section.items())))
        got = None if key is None else memo.get(key)
        if got is None:
            try:
                got = schema.model_validate(section)
            except ValidationError as exc:
                got = ConfigError(format_validation_error(exc, name))
            if key is not None:
                memo[key] = got
        if isinstance(got, ConfigError):
            raise ConfigError(str(got))
        parsed[name] = got
    try:
        return RunConfig(model=base.model, system=base.system, **parsed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "config")) from None


def judge_failed_contexts(plans: PlanSet, ctx_cfgs: list, free: np.ndarray,
                          reject: Callable[[str, np.ndarray], None],
                          build: Callable[[Mapping[str, Any]], Any],
                          prepare: Callable[[Any], Any] | None = None) -> None:
    """Judge the plans of each context whose base config failed (a ConfigError in
    ``ctx_cfgs``) by the config itself, and give the context the first config that validates.

    Parameters
    ----------
    plans : the plans.
    ctx_cfgs : each context's base config or ConfigError; a failed context that has a valid
        plan gets that plan's config (updated in place).
    free : per plan, whether no rule rejected it yet.
    reject : ``reject(reason, mask)`` rejects the plans of ``mask`` not rejected yet.
    build : ``build(plan) -> RunConfig`` (:func:`plan_config` with its sections and base).
    prepare : called on each config a failed context gets (the vectorised family's
        ``prepare``, which refuses what it does not cover).
    """
    failed = [i for i, c in enumerate(ctx_cfgs) if isinstance(c, ConfigError)]
    if not failed:
        return
    alive = np.flatnonzero(free & np.isin(plans["context"], failed))
    rejected, configs = check_plan_configs(plans, alive, build)
    for text, positions in rejected.items():
        mask = np.zeros(len(plans), dtype=bool)
        mask[positions] = True
        reject(text, mask)
    for i, cfg in configs.items():
        if prepare is not None:
            prepare(cfg)
        ctx_cfgs[i] = cfg
    for i in failed:   # no plan of the context validates: the rest go with its own reason
        if isinstance(ctx_cfgs[i], ConfigError):
            reject(str(ctx_cfgs[i]), plans["context"] == i)


#: The plan fields that each group of the config's own rules reads beside the context: the
#: tensor group (heads, key/value heads and FFN divisible by TP; sequence parallelism and
#: TP; SP's sequence), the pipeline group (PP·VPP divides the layers; the interleaved
#: schedule's VPP and PP; VPP without it) and the sharding group (ZeRO-3 and PP; an explicit
#: ``overlap_grad_reduce`` with ZeRO-3). No config rule reads fields of two groups, except
#: the batch arithmetic (DP, micro-batch, global batch), which
#: :func:`~ddlsim.search.plans.plan_rules` states on arrays, and the other overlap options set
#: in ``parallel.*`` (a context with one that the neutral plan cannot take fails alone, and
#: :func:`judge_failed_contexts` judges its plans). The stacks' rules, which read within one
#: group too, are applied on arrays (:func:`~ddlsim.search.plans.stack_plan_rules`).
RULE_GROUPS = {"tensor": ("tp", "sp"), "pipeline": ("pp", "v", "schedule"),
               "sharding": ("zero", "pp")}


def _probe(context: Mapping[str, Any], fields: Sequence[str], values: Sequence[int]) -> dict:
    """The neutral plan of ``context`` (one device, one micro-batch per stage) with the
    group's ``fields`` set to ``values`` (PlanSet codes)."""
    path = {field: p for p, field in VECTOR_FIELDS.items()}
    plan = {**context_overrides(context), "parallel.schedule": "1f1b",
            "parallel.virtual_pipeline_model_parallel_size": None}
    for field, value in zip(fields, (int(x) for x in values)):
        if field == "schedule":
            plan["parallel.schedule"] = SCHEDULE[value]
        elif field == "v":
            plan[path["v"]] = None if value == 1 else value
        elif field == "sp":
            plan[path["sp"]] = bool(value)
        else:
            plan[path[field]] = value
    # one micro-batch per stage: the interleaved schedule's batch rule holds
    plan["train.global_batch_size"] = plan["parallel.pipeline_model_parallel_size"]
    return plan


def first_clause(message: str) -> str:
    """A config message up to its first ``; `` or ``. ``: what the plan breaks and why,
    without the advice ``ddlsim predict`` adds after it."""
    cuts = [i for i in (message.find("; "), message.find(". ")) if i >= 0]
    return message[:min(cuts)] if cuts else message


def group_rules(plans: PlanSet, ctx_cfgs: list, base: Any, sections: dict,
                shaped: bool = False, pending: np.ndarray | None = None
                ) -> list[tuple[str, np.ndarray]]:
    """``(reason, rejected mask)`` of the config's own rules, as ``RunConfig`` validates
    them: for each group of :data:`RULE_GROUPS`, the neutral plan of each context with the
    group's fields set, built once per distinct combination of them (on the grid's axes);
    a combination the config refuses rejects every plan that has it, with the config's
    message less its advice (:func:`first_clause`). The software stack's rules are left to
    :func:`~ddlsim.search.plans.stack_plan_rules` (built here as what-ifs), and contexts None
    to :func:`judge_failed_contexts`.

    Parameters
    ----------
    plans : the plans.
    ctx_cfgs : each context's base config, or None.
    base, sections : as :func:`plan_config` takes them.
    shaped : masks that broadcast to the grid's shape rather than one flag per plan
        (:func:`~ddlsim.search.plans.plan_rules`).
    pending : the plans no earlier rule rejected (flags in the grid's shape, or one per
        plan); a combination none of them has is not built (its plans have their reason).
    """
    from .plans import flat

    what_ifs: dict[int, Any] = {}          # each base (a context's) as a what-if, once
    verdicts: dict[str, str | None] = {}   # a probe asked by two groups is built once
    validated: dict = {}                   # and a section of several probes validated once

    def judge(plan: Mapping[str, Any]) -> str | None:
        """The config's message (less its advice) for ``plan``, or None when it validates."""
        # the values are the config's scalars, lists and mappings: one repr, one value
        key = repr(sorted(plan.items()))
        if key not in verdicts:
            try:
                own = base(plan) if isinstance(base, ContextBases) else base
                if id(own) not in what_ifs:
                    what_ifs[id(own)] = (own, _as_what_if(own))
                plan_config(sections, what_ifs[id(own)][1], plan, validated)
                verdicts[key] = None
            except ConfigError as exc:
                verdicts[key] = first_clause(str(exc))
        return verdicts[key]

    f = plans if plans.grid is None else plans.grid
    full = np.shape(plans["tp"]) if plans.grid is None else plans.shape
    shaped = shaped and plans.grid is not None
    out: list[tuple[str, np.ndarray]] = []
    for fields in RULE_GROUPS.values():
        arrays = np.broadcast_arrays(*(f[k] for k in fields), f["context"])
        rows = np.stack([a.reshape(-1) for a in arrays], axis=1)
        combos, inverse = np.unique(rows, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        wanted = _pending_combos(pending, arrays[0].shape, inverse, len(combos))
        verdict = np.full(len(combos), -1)
        texts: list[str] = []
        for j, combo in enumerate(combos.tolist()):
            if ctx_cfgs[combo[-1]] is None or not wanted[j]:
                continue
            text = judge(_probe(plans.contexts[combo[-1]], fields, combo[:-1]))
            if text is not None:
                if text not in texts:
                    texts.append(text)
                verdict[j] = texts.index(text)
        verdict = verdict[inverse].reshape(arrays[0].shape)
        out += [(text, verdict == k if shaped else flat(verdict == k, full))
                for k, text in enumerate(texts)]
    return out


def _pending_combos(pending: np.ndarray | None, shape: tuple[int, ...], inverse: np.ndarray,
                    combos: int) -> np.ndarray:
    """Per combination of a rule group, whether a plan ``pending`` holds has it (every one
    without ``pending``); ``shape``: the group's arrays' (the grid's, 1 on the axes the
    group does not read), ``inverse``: each of their cells' combination."""
    if pending is None:
        return np.ones(combos, dtype=bool)
    if pending.ndim == len(shape):  # the grid's flags: any over the axes the group ignores
        pending = _any_over(pending, [k for k, n in enumerate(shape) if n == 1])
    return np.bincount(inverse, weights=pending.reshape(-1), minlength=combos) > 0


def _any_over(flags: np.ndarray, axes: list[int]) -> np.ndarray:
    """``flags.any(axis=axes, keepdims=True)``, the reduced axes moved last first: numpy
    reduces inner axes of a grid whose last axis holds 2 values two flags at a time (~40x
    slower than one copy and a reduction over contiguous rows)."""
    kept = [k for k in range(flags.ndim) if k not in axes]
    out_shape = tuple(1 if k in axes else n for k, n in enumerate(flags.shape))
    rows = np.ascontiguousarray(flags.transpose(kept + axes))
    return rows.reshape(math.prod(out_shape), -1).any(axis=1).reshape(out_shape)


def _as_what_if(cfg: Any) -> Any:
    """``cfg``'s model, and its system with the software stack marked ``what_if`` (its
    rules not applied)."""
    from types import SimpleNamespace

    from ..software import SoftwareSpec

    spec = cfg.system.software
    spec = SoftwareSpec(stack=spec) if isinstance(spec, str) else spec
    system = cfg.system.model_copy(update={"software": spec.model_copy(update={"what_if": True})})
    return SimpleNamespace(model=cfg.model, system=system)

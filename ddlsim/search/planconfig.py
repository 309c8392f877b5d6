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

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from .plans import PlanSet, check_plan_configs

__all__ = ["plan_sections", "plan_config", "judge_failed_contexts"]


def plan_sections(data: dict, base_dir: Any, overrides: Sequence[str]) -> dict:
    """The run config's ``parallel`` and ``train`` sections as mappings (presets resolved),
    with the ``--set`` overrides of those sections applied."""
    from ..configload import apply_overrides, resolve_section

    sections = {k: resolve_section(k, data[k], base_dir, expand=False)
                for k in ("parallel", "train") if k in data}
    return apply_overrides(sections, [o for o in overrides
                                      if str(o).startswith(("parallel.", "train."))])


def plan_config(sections: dict, base: Any, plan: Mapping[str, Any]) -> Any:
    """The :class:`~ddlsim.config.RunConfig` of one plan.

    Parameters
    ----------
    sections : :func:`plan_sections` of the run config.
    base : a config of the run (its model and system are the plan's).
    plan : ``{config path: value}`` in the config's units, as
        :meth:`~ddlsim.search.plans.PlanSet.overrides` gives it.

    Returns
    -------
    RunConfig
        validated as :func:`~ddlsim.configload.build_config` validates a config.

    Raises
    ------
    ConfigError
        the config's own message for the plan.
    """
    from pydantic import ValidationError

    from ..config import ParallelConfig, RunConfig, TrainConfig
    from ..configload import format_validation_error

    parts = copy.deepcopy(sections)
    for path, value in plan.items():
        keys = path.split(".")
        node = parts.setdefault(keys[0], {})
        for key in keys[1:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    parsed = {}
    for name, schema in (("parallel", ParallelConfig), ("train", TrainConfig)):
        try:
            parsed[name] = schema.model_validate(parts.get(name, {}))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, name)) from None
    try:
        return RunConfig(model=base.model, system=base.system, **parsed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "config")) from None


def judge_failed_contexts(plans: PlanSet, ctx_cfgs: list, reason: np.ndarray,
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
    reason : per plan, the index of the reason that rejected it, or -1.
    reject : ``reject(reason, mask)`` rejects the plans of ``mask`` not rejected yet.
    build : ``build(plan) -> RunConfig`` (:func:`plan_config` with its sections and base).
    prepare : called on each config a failed context gets (the vectorised family's
        ``prepare``, which refuses what it does not cover).
    """
    failed = [i for i, c in enumerate(ctx_cfgs) if isinstance(c, ConfigError)]
    if not failed:
        return
    alive = np.flatnonzero((reason < 0) & np.isin(plans["context"], failed))
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

"""Search by the exact engine: every plan of a grid built and predicted as ``ddlsim predict``
would, for the families and plans that have no vectorised form.

A family becomes searchable by registering its workload builder (:mod:`ddlsim.workloads.
registry`): a plan here is a run config, so it is judged by the config's own validation and
the software stack's rules (the reason a plan is rejected is the error ``predict`` gives),
timed by :func:`ddlsim.predict` (the analytical engine) and its memory is the one
``predict`` reports. Nothing is written twice; the price is speed (milliseconds per plan
instead of microseconds), so the grid is bounded (:data:`EXACT_PLANS`).

The decoder families keep their vectorised tier (:mod:`.decoder`) for the plans it covers;
MoE models, context parallelism, the 2-D/2.5-D/3-D tensor modes, uneven pipeline splits and
data-parallel strategies other than ``ddp`` come here, as do ResNet, BERT, DLRM and CosmoFlow.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from .plans import VECTOR_FIELDS

__all__ = ["EXACT_PLANS", "evaluate_exact", "first_sentence", "plan_fields", "plan_outcome"]

#: The most plans a grid searched by the exact engine may have (each takes milliseconds).
EXACT_PLANS = 5000


def first_sentence(message: str, limit: int = 160) -> str:
    """A rejection reason: the first line of a config error, a stack rule's source left out
    (``… (rule NAME)``, as the vectorised tier words it: the rule's name, not its source, is
    what a reason must keep), cut at ``limit`` characters."""
    line = str(message).strip().splitlines()[0] if str(message).strip() else "rejected"
    line = re.sub(r"\(rule (\w+); source: .*", r"(rule \1)", line)
    if len(line) <= limit:
        return line
    rule = re.search(r" \(rule \w+\)$", line)      # kept whole: the cut falls before it
    tail = rule.group(0) if rule else ""
    return line[:limit - 1 - len(tail)] + "…" + tail


def evaluate_exact(data: dict, base_dir, overrides: Sequence[str], axes: Mapping[str, list],
                   constraints, objective: str = "time", price_per_gpu_hour: float | None = None,
                   progress: Callable[[int, int], None] | None = None, dask=None,
                   dask_workers: int | None = None):
    """Every plan of ``axes`` on ``data``, predicted by the exact analytical engine.

    Parameters and returns as :func:`ddlsim.search.evaluate.evaluate_grid` (a
    :class:`~ddlsim.search.evaluate.Grid`; ``frame.attrs["tier"] = "exact"``). With ``dask``
    (``"local"``, a scheduler address or a ``distributed.Client``: :func:`ddlsim.distributed.
    run_on_dask`) the plans are predicted as Dask tasks; the grid is the serial one.
    """
    from .ranking import DOES_NOT_FIT, Grid, rank

    sizes = [len(v) for v in axes.values()]
    total = math.prod(sizes)
    if total > EXACT_PLANS:
        raise ConfigError(f"the search grid has {total:,} plans ({' × '.join(map(str, sizes))}) "
                          f"and this model or plan has no vectorised tier, so each plan is "
                          f"predicted by the exact engine: at most {EXACT_PLANS:,} plans; "
                          "give fewer axis values")
    from ..sweeps import _setting
    fixed = [*overrides]
    if constraints.global_batch_size is not None and "train.global_batch_size" not in axes:
        fixed.append(_setting("train.global_batch_size", constraints.global_batch_size))
    combos = list(itertools.product(*axes.values()))
    items = [(i, [*fixed, *(_setting(p, v) for p, v in zip(axes, combo))])
             for i, combo in enumerate(combos)]
    shared = (data, base_dir, constraints.max_gpus)
    if dask is None:
        outcomes = []
        for item in items:
            outcomes.append(plan_outcome(*shared, item))
            if progress is not None:
                progress(len(outcomes), total)
    else:
        from ..distributed import run_on_dask
        outcomes = run_on_dask(plan_outcome, shared, items, dask, dask_workers,
                               describe=lambda item: "the plan " + ", ".join(item[1]),
                               progress=progress)
    rows, reasons, fields = [], {}, None
    for i, (combo, (why, row, plan_fields_)) in enumerate(zip(combos, outcomes)):
        if why is None:
            fields = plan_fields_
            if constraints.must_fit and not row["fits"]:
                why = DOES_NOT_FIT
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
            continue
        rows.append({"plan": i, **row, **dict(zip(axes, combo))})
    paths = [*VECTOR_FIELDS, "parallel.schedule"]
    frame = _frame(rows, [*paths, *(p for p in axes if p not in paths)], price_per_gpu_hour)
    frame = rank(frame, objective)
    frame.attrs["tier"] = "exact"
    if fields is not None:   # the family's own plan fields: the labels show those
        frame.attrs["plan_fields"] = list(fields)
    rejected = dict(sorted(reasons.items(), key=lambda x: -x[1]))
    return Grid(frame, rejected, total)


def plan_outcome(data: dict, base_dir, max_gpus: int | None,
                 item: tuple[int, list[str]]) -> tuple[str | None, dict | None, tuple | None]:
    """One plan of an exact grid (``item``: its index and ``--set`` overrides): ``(None,
    row, the family's plan fields)``, or ``(why, None, None)`` when its config or stack
    refuses it (the first sentence of the error). A task of :func:`evaluate_exact`."""
    from ..api import predict
    from ..configload import build_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = build_config(data, item[1], base_dir)
            if max_gpus is not None and cfg.world_size > max_gpus:
                raise ConfigError(f"more than max_gpus = {max_gpus} GPUs")
            result = predict(cfg, check_fit=False)
    except ConfigError as exc:
        return first_sentence(exc), None, None
    memory = result.memory
    row = {**plan_fields(cfg), "gpus": result.world_size,
           "iteration_time_s": result.iteration_time_s,
           "memory_per_device_bytes": memory.total, "capacity_bytes": memory.capacity,
           "fits": memory.fits, "tokens_per_s": result.tokens_per_s, "mfu": result.mfu}
    fields = cfg.family.plan_fields   # None: every plan field (the decoder families)
    return None, row, None if fields is None else tuple(fields)


def plan_fields(cfg) -> dict:
    """The plan's :data:`~.plans.VECTOR_FIELDS` and schedule as the config resolved them (a
    derived DP included), the columns every search frame has."""
    out = {}
    for path in [*VECTOR_FIELDS, "parallel.schedule"]:
        section, key = path.split(".")
        out[path] = getattr(getattr(cfg, section), key)
    return out


def _frame(rows: list[dict], paths: list[str], price: float | None):
    import pandas as pd

    from .ranking import METRICS, setting_column, with_costs

    frame = pd.DataFrame(rows, columns=["plan", *paths, *METRICS])
    for path in paths:
        column = setting_column(row.get(path) for row in rows)
        if not isinstance(column, list):
            frame[path] = column
    frame = with_costs(frame, frame["tokens_per_s"] * frame["iteration_time_s"], price)
    return frame.astype({"plan": np.int64}) if len(frame) else frame

""":func:`search`: the vectorised tier over a grid, then the best plans re-evaluated exactly.

The plans are ranked by the vectorised tier; the first ``top`` are predicted again by the
exact analytical engine (:func:`ddlsim.predict`) and, with ``verify="des"``, by the
discrete-event engine, serially or as Dask tasks (:mod:`ddlsim.distributed`). The frame is
ranked by the vectorised objective; the exact columns sit beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .evaluate import evaluate_grid
from .spec import SearchSpec, check_axes, parse_search_section

__all__ = ["search", "load_search", "plan_overrides", "exact_times", "VERIFY"]

#: What ``verify`` may name besides None.
VERIFY = ("des",)


def load_search(config: Any, limits: Any = None) -> tuple[dict, Any, SearchSpec]:
    """``(config mapping without its search section, its folder, the section)`` of a path,
    a mapping or a :class:`~ddlsim.config.RunConfig` (which has no section); ``limits``
    bounds the section's axes (:func:`~ddlsim.search.spec.parse_search_section`)."""
    from ..config import RunConfig
    from ..configload import read_document

    base_dir = None
    if isinstance(config, RunConfig):
        data = config.model_dump(mode="json")
    elif isinstance(config, (str, Path)):
        data, base_dir = read_document(config), Path(config).parent
    elif isinstance(config, dict):
        data = dict(config)
    else:
        raise ConfigError(f"a run config is a path, a mapping or a RunConfig; got "
                          f"{type(config).__name__}")
    if not isinstance(data, dict):
        raise ConfigError(f"{config}: a run config must be a mapping")
    section = data.pop("search", None)
    where = f"{config}: search" if isinstance(config, (str, Path)) else "search"
    return data, base_dir, parse_search_section(section, where, limits)


def _spec(spec: SearchSpec, axes, constraints, objective, price, top, limits,
          currency=None) -> SearchSpec:
    """The section's spec with the explicit arguments in its place."""
    update: dict[str, Any] = {}
    if axes is not None:
        if not isinstance(axes, Mapping):
            raise ConfigError(f"axes must be a mapping of config path to values; got "
                              f"{type(axes).__name__}")
        update["axes"] = parse_search_section({"axes": dict(axes)}, "search", limits).axes
    if constraints is not None:
        merged = {**spec.constraints.model_dump(), **dict(constraints)}
        update["constraints"] = parse_search_section({"constraints": merged}).constraints
    for key, value in (("objective", objective), ("price_per_gpu_hour", price), ("top", top),
                       ("currency", currency)):
        if value is not None:
            update[key] = value
    if not update:
        return spec
    return parse_search_section({**spec.model_dump(), **update}, limits=limits)


def search(config: Any, axes: Mapping[str, Sequence[Any]] | None = None, *,
           constraints: Mapping[str, Any] | None = None, objective: str | None = None,
           price_per_gpu_hour: float | None = None, top: int | None = None,
           verify: str | None = None, overrides: Sequence[str] = (), dask: Any = None,
           dask_workers: int | None = None,
           progress: Callable[[str, int, int], None] | None = None, limits: Any = None,
           currency: str | None = None):
    """Search the plans of ``config``: every combination of the axes, evaluated as arrays,
    the best ``top`` predicted again exactly.

    Parameters
    ----------
    config : a path to a run config (its ``search:`` section gives the defaults of the
        arguments below), a mapping, or a :class:`ddlsim.RunConfig`.
    axes : ``{"parallel.tensor_model_parallel_size": [1, 2, 4, 8], "train.recompute":
        ["none", "full"], …}``: any ``parallel.*`` or ``train.*`` field; values as in a config
        file, or a range string (``"1:64:*2"``).
    constraints : ``must_fit`` (default True), ``max_gpus``, ``global_batch_size`` (fixed).
    objective : ``"time"`` (default), ``"tokens_per_s"``, ``"mfu"`` or ``"cost"``.
    price_per_gpu_hour : price of one GPU for one hour, in ``currency``; adds the cost columns.
    currency : what the price is in (default the section's, ``"USD"``): the tables name it.
    top : plans re-evaluated by the exact engine (default 10).
    verify : ``"des"`` to also run the discrete-event engine on those plans.
    overrides : ``--set`` overrides applied first.
    dask, dask_workers : run the re-evaluations, and the plans of a grid that has no
        vectorised form (the exact tier), on Dask (``"local"``, an address or a
        ``distributed.Client``), as :func:`ddlsim.sweep` does; one cluster for both.
    progress : called with (stage, done, total); stage is ``"evaluate"`` or ``"verify"``.
    limits : :class:`ddlsim.limits.Limits`: ``search_plans`` bounds the grid (the product of
        the axes' lengths) and ``axis_values`` each axis, counted before anything is built;
        the base system's ``topology_links`` and every exact prediction's budgets as for
        :func:`ddlsim.predict`.

    Returns
    -------
    ddlsim.framehtml.ResultFrame
        A :class:`pandas.DataFrame` that Jupyter shows compactly (``.to_frame()``: the plain
        DataFrame). One row per evaluated plan, best first: ``rank``, ``plan`` (its index in the grid),
        the config paths of the plan, ``gpus``, ``iteration_time_s``, ``tokens_per_s``,
        ``mfu``, ``memory_per_device_bytes``, ``capacity_bytes``, ``fits``, ``pareto`` (on
        the front of time against memory), the cost columns with a price, and for the top
        plans ``exact_iteration_time_s``, ``exact_error`` (vectorised / exact − 1) and with
        ``verify="des"`` ``des_iteration_time_s``. ``frame.attrs`` holds ``rejected``
        (reason → plans), ``total`` (plans enumerated) and ``objective``.
    """
    from ..limits import Limits, check_budget, topology_links

    limits = limits if limits is not None else Limits()
    data, base_dir, spec = load_search(config, limits)
    spec = _spec(spec, axes, constraints, objective, price_per_gpu_hour, top, limits, currency)
    sizes = [len(v) for v in spec.axes.values()]
    check_budget({"search_plans": math.prod(sizes)}, limits,
                 f"the search grid ({' × '.join(map(str, sizes)) or 'no axes'})")
    if verify not in (None, *VERIFY):
        raise ConfigError(f"verify = {verify!r} is not allowed; choose None or "
                          f"{', '.join(VERIFY)}")
    from .evaluate import base_config
    base, fields = base_config(data, base_dir, overrides, spec.axes)
    written_dp = fields["parallel.data_parallel_size"]
    if written_dp is not None and "parallel.data_parallel_size" not in spec.axes:
        # a DP the config writes is kept, as a one-value axis, not derived over it
        spec = spec.model_copy(update={"axes": {**spec.axes,
                                                "parallel.data_parallel_size": [written_dp]}})
    check_budget({"topology_links": topology_links(base.system)}, limits)
    check_axes(spec.axes, base.model_dump(mode="json"),
               spec.constraints.global_batch_size is not None)
    if dask is None and dask_workers is not None:
        raise ConfigError("dask_workers (--dask-workers) applies only with dask='local'")
    step = None if progress is None else (lambda d, t: progress("evaluate", d, t))
    from ..distributed import dask_client
    with (nullcontext() if dask is None else dask_client(dask, dask_workers)) as client:
        # one cluster for the grid and the top plans
        grid = evaluate_grid(data, base_dir, overrides, spec.axes, spec.constraints,
                             spec.objective, spec.price_per_gpu_hour, step, client)
        frame = grid.frame
        k = min(spec.top, len(frame))
        if k:
            frame = _verified(frame, k, data, base_dir, overrides, verify, client, progress,
                              limits)
    from ..framehtml import ResultFrame

    frame, attrs = ResultFrame(frame), dict(frame.attrs)
    frame.attrs.update(attrs)
    frame.attrs.update(rejected=grid.rejected, total=grid.total, objective=spec.objective,
                       top=k, currency=spec.currency, price_per_gpu_hour=spec.price_per_gpu_hour)
    return frame


def plan_overrides(row, columns: Sequence[str]) -> list[str]:
    """The ``--set`` overrides that make the base config plan ``row`` of a search frame
    (``columns``: its config-path columns), e.g. to predict it with :func:`ddlsim.predict`."""
    from ..sweeps import _setting

    out = []
    for path in columns:
        value = row[path]
        value = value.item() if hasattr(value, "item") else value
        if path == "parallel.virtual_pipeline_model_parallel_size" and value == 1:
            value = None
        out.append(_setting(path, value))
    return out


def exact_times(source, engines: Sequence[str], sets: Sequence[str]) -> dict[str, float]:
    """``{engine: iteration time}`` of one plan (a Dask task's unit)."""
    from ..api import predict

    cfg = source.build(sets)
    return {e: predict(cfg, e, check_fit=False, limits=getattr(source, "limits", None))
            .iteration_time_s for e in engines}


def _verified(frame, k: int, data, base_dir, overrides, verify, client, progress, limits):
    from ..sweeps import _Source

    columns = [c for c in frame.columns if "." in c]
    items = [plan_overrides(frame.iloc[i], columns) for i in range(k)]
    source = _Source(data, overrides, limits)
    source.base_dir = base_dir
    engines = ["analytical", *([verify] if verify else [])]
    step = None if progress is None else (lambda d, t: progress("verify", d, t))
    if client is None:
        times = []
        for i, sets in enumerate(items, 1):
            times.append(exact_times(source, engines, sets))
            if step is not None:
                step(i, k)
    else:
        from ..distributed import run_on_dask
        times = run_on_dask(exact_times, (source, engines), items, client, None,
                            describe=lambda s: "the plan " + ", ".join(s), progress=step)
    frame = frame.copy()
    exact = [t["analytical"] for t in times] + [float("nan")] * (len(frame) - k)
    frame["exact_iteration_time_s"] = exact
    frame["exact_error"] = frame["iteration_time_s"] / frame["exact_iteration_time_s"] - 1
    if verify:
        frame[f"{verify}_iteration_time_s"] = ([t[verify] for t in times]
                                               + [float("nan")] * (len(frame) - k))
    return frame

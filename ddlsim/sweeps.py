"""What-if grids: every combination of a few config fields, each predicted exactly.

``ddlsim sweep CONFIG --set-range 'system.nic.bandwidth_Bps=1,10,100 Gb/s'`` and
:func:`sweep` run :func:`ddlsim.predict` on the product of the ranges, in a fixed order (the
first range varies slowest, the last fastest). A combination the config rules reject is not an
error of the sweep: its row says ``valid = False`` and the reason (the
:class:`~ddlsim.errors.ConfigError` message); a plan that does not fit in device memory is
predicted anyway and its row says ``fits = False``.

Ranges are read by :mod:`ddlsim.ranges` (``1,2,4``, ``100,200,400 Gb/s``, ``1:64:*2``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, did_you_mean
from .ranges import RANGE_FORMS, SweepError, parse_range, parse_ranges, parse_values

__all__ = ["sweep", "parse_range", "parse_ranges", "parse_values", "reason_counts", "SweepError", "MAX_RUNS",
           "RANGE_FORMS", "DOES_NOT_FIT"]

#: Most combinations a sweep runs unless ``limits.sweep_runs`` (``--limit sweep_runs=N``)
#: raises it: :class:`ddlsim.limits.Limits`'s default.
MAX_RUNS = 10_000
#: The reason of a plan that does not fit in memory when ``check_fit`` is True.
DOES_NOT_FIT = "the plan does not fit in device memory"
ENGINES = ("analytical", "des", "both")

def _lookup(tree: Any, path: str) -> Any:
    """The value at ``path`` in a config dump; KeyError naming the first missing key."""
    node = tree
    for i, key in enumerate(path.split(".")):
        if not isinstance(node, dict) or key not in node:
            known = sorted(node) if isinstance(node, dict) else []
            where = ".".join(path.split(".")[:i]) or "the config"
            raise KeyError(f"{where} has no field {key!r}{did_you_mean(key, known)}"
                           + (f"; its fields: {', '.join(known)}" if known else ""))
        node = node[key]
    return node


def _is_preset(path: str) -> bool:
    """``SECTION.preset`` or ``SECTION``: the section becomes each preset
    (:func:`ddlsim.configpresets.preset_section`), a field the resolved config does not have."""
    from .configpresets import preset_section
    return preset_section(path) is not None


def _same_field(a: str, b: str) -> bool:
    """Whether two paths name one field (``model`` and ``model.preset`` do)."""
    from .configpresets import preset_section
    a, b = a.strip(), b.strip()
    return a == b or (preset_section(a) is not None and preset_section(a) == preset_section(b))


def _json(value: Any) -> str:
    """``value`` as JSON (numpy scalars as Python numbers)."""
    return json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v))


def _setting(path: str, value: Any) -> str:
    """A ``--set`` override for ``value`` (JSON is YAML, so it reads back the same)."""
    return f"{path}={_json(value)}"


class _Source:
    """The config to sweep, read once: its mapping, the folder its paths start from, the
    ``--set`` overrides every combination gets, the work budgets every prediction runs under."""

    def __init__(self, config: Any, overrides: Sequence[str], limits: Any = None):
        from .config import RunConfig
        from .configload import read_document

        self.overrides = list(overrides)
        self.limits = limits
        self.base_dir = None
        if isinstance(config, RunConfig):
            self.data = config.model_dump(mode="json")
        elif isinstance(config, (str, Path)):
            self.data, self.base_dir = read_document(config), Path(config).parent
        elif isinstance(config, dict):
            self.data = config
        else:
            raise ConfigError(f"a run config is a path, a mapping or a RunConfig; got "
                              f"{type(config).__name__}")

    def build(self, sets: Iterable[str] = ()):
        from .configload import build_config
        return build_config(self.data, [*self.overrides, *sets], self.base_dir)


def _check_ranges(source: _Source, ranges: Mapping[str, Sequence[Any]],
                  limits: Any) -> dict[str, list[Any]]:
    """Ranges as lists, refused when empty, overlapping ``--set``, naming a field the config
    does not have, or giving more than ``limits.sweep_runs`` combinations (counted from the
    ranges' lengths)."""
    from .fieldcheck import check_field_values
    from .limits import check_budget

    if not ranges:
        raise SweepError("a sweep needs at least one range (--set-range PATH=VALUES)")
    total = 1
    for path, values in ranges.items():
        if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__"):
            raise SweepError(f"the range of {path!r} must be a list of values; got "
                             f"{type(values).__name__}")
        check_budget({"axis_values": len(values)}, limits, f"the range of {path!r}")
        if not values:
            raise SweepError(f"the range of {path!r} has no values; {RANGE_FORMS}")
        total *= len(values)
        fixed = [o for o in source.overrides if _same_field(str(o).partition("=")[0], path)]
        if fixed:
            raise SweepError(f"{path!r} is both swept and set ({fixed[0]!r}); drop one")
    sizes = " × ".join(str(len(v)) for v in ranges.values())
    check_budget({"sweep_runs": total}, limits, f"the sweep ({sizes})")
    ranges = {str(p): check_field_values(str(p), list(v), f"the range of {str(p)!r}")
              for p, v in ranges.items()}
    try:
        base = source.build().model_dump(mode="json")
    except ConfigError:  # valid only with swept values: each combination will say why
        return ranges
    for path in ranges:
        if _is_preset(path):
            continue
        try:
            _lookup(base, path)
        except KeyError as exc:
            raise SweepError(f"cannot sweep {path!r}: {exc.args[0]}") from None
    return ranges


def _si_values(source: _Source, path: str, values: list[Any]) -> list[Any]:
    """Each value as the config stores it (``"10 Gb/s"`` → 1.25e9), or as given when the
    config rejects it alone."""
    out = []
    for v in values:
        try:
            out.append(_lookup(source.build([_setting(path, v)]).model_dump(mode="json"), path))
        except (ConfigError, KeyError):
            out.append(v)
    return out


def _rows(source: _Source, combo: dict[str, Any], shown: dict[str, Any], engines: list[str],
          check_fit: bool) -> list[dict[str, Any]]:
    """One row per engine of one combination."""
    from .api import predict

    try:
        cfg = source.build(_setting(p, v) for p, v in combo.items())
    except ConfigError as exc:
        return [{**shown, "engine": e, "valid": False, "reason": str(exc)} for e in engines]
    rows = []
    for e in engines:
        try:
            result = predict(cfg, e, check_fit=False, limits=source.limits)
        except ConfigError as exc:
            rows.append({**shown, "engine": e, "valid": False, "reason": str(exc)})
            continue
        here = {p: v if _is_preset(p) else _lookup(result.config, p) for p, v in combo.items()}
        fits = bool(result.fits) or not check_fit
        rows.append({**here, **result.to_row(), "valid": fits,
                     "reason": None if fits else DOES_NOT_FIT})
    return rows


def _combo_rows(source: _Source, engines: list[str], check_fit: bool,
                item: tuple[dict[str, Any], dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of one combination ``item = (combo, shown values)`` (a Dask task's unit)."""
    return _rows(source, item[0], item[1], engines, check_fit)


def _describe(item: tuple[dict[str, Any], dict[str, Any]]) -> str:
    return "the combination " + ", ".join(f"{p}={_json(v)}" for p, v in item[0].items())


def sweep(config: Any, ranges: Mapping[str, Sequence[Any]], overrides: Sequence[str] = (),
          engine: str = "analytical", check_fit: bool = False, *, max_runs: int | None = None,
          limits: Any = None,
          progress: Callable[[int, int], None] | None = None, dask: Any = None,
          dask_workers: int | None = None):
    """Predict every combination of ``ranges`` on ``config``.

    Parameters
    ----------
    config : a path to a YAML/JSON run config, a mapping, or a :class:`ddlsim.RunConfig`.
    ranges : ``{field path: values}``, e.g. ``{"system.nic.bandwidth_Bps": ["1 Gb/s",
        "10 Gb/s"], "parallel.tensor_model_parallel_size": [1, 2, 4]}``; values as in a
        config file (units allowed). The first range varies slowest.
    overrides : ``--set`` overrides (``"section.key=value"``) applied to every combination.
    engine : ``"analytical"``, ``"des"`` or ``"both"`` (two rows per combination).
    check_fit : when True a plan that does not fit in memory is not valid (its reason is
        :data:`DOES_NOT_FIT`); its numbers are kept either way, with ``fits`` False.
    max_runs : most combinations allowed (short for ``limits.sweep_runs``).
    limits : :class:`ddlsim.limits.Limits`: ``sweep_runs`` and ``axis_values`` bound the
        sweep, counted before it starts; every prediction runs under the others.
    progress : called with (combinations done, total) as combinations complete.
    dask : None to run here; ``"local"`` (a :class:`distributed.LocalCluster` started for
        the sweep and closed after it), a scheduler address, or a :class:`distributed.Client`
        to run the combinations as Dask tasks (:mod:`ddlsim.distributed`). The frame is the
        same as without.
    dask_workers : worker processes of ``dask="local"`` (default 2).

    Returns
    -------
    ddlsim.framehtml.ResultFrame
        A :class:`pandas.DataFrame` that Jupyter shows compactly, with each row's breakdown
        as a bar (``.to_frame()``: the plain DataFrame). One row per combination (and
        engine), in sweep order: a column per swept path
        (SI values as the config stores them: ``system.nic.bandwidth_Bps`` in B/s;
        ``frame.attrs["typed"]`` maps them back to the text typed, ``"200 Gb/s"``), the
        columns of :meth:`ddlsim.Result.to_row` (empty for invalid combinations), ``valid``
        and ``reason`` (the config's message for an invalid combination, else None).

    Raises
    ------
    SweepError
        No range, an empty range, a path the config does not have, a path both swept and
        set.
    WorkTooLargeError
        More combinations than ``limits.sweep_runs`` (or ``max_runs``), or a range longer than
        ``limits.axis_values``.
    ddlsim.distributed.DistributedError
        Dask missing, the scheduler unreachable, or a combination that raised an error other
        than a :class:`~ddlsim.errors.ConfigError` on a worker (the message names it).
    """
    import pandas as pd

    if engine not in ENGINES:
        raise ConfigError(f"engine = {engine!r} is not allowed; choose from {', '.join(ENGINES)}")
    engines = ["analytical", "des"] if engine == "both" else [engine]
    limits = _sweep_limits(limits, max_runs)
    source = _Source(config, overrides, limits)
    ranges = _check_ranges(source, ranges, limits)
    paths = list(ranges)
    shown = {p: dict(zip(map(_json, v), _si_values(source, p, v)))
             for p, v in ranges.items()}
    items = [(combo, {p: shown[p][_json(v)] for p, v in combo.items()})
             for combo in (dict(zip(paths, v)) for v in itertools.product(*ranges.values()))]
    shared = (source, engines, check_fit)
    if dask is None:
        if dask_workers is not None:
            raise SweepError("dask_workers (--dask-workers) applies only with dask='local'")
        per_combo = []
        for i, item in enumerate(items, 1):
            per_combo.append(_combo_rows(*shared, item))
            if progress is not None:
                progress(i, len(items))
    else:
        from .distributed import run_on_dask
        per_combo = run_on_dask(_combo_rows, shared, items, dask, dask_workers,
                                describe=_describe, progress=progress)
    rows = [row for combo_rows in per_combo for row in combo_rows]
    columns = list(dict.fromkeys(c for r in rows for c in r if c not in ("valid", "reason")))
    from .framehtml import ResultFrame

    frame = ResultFrame(pd.DataFrame(rows, columns=[*columns, "valid", "reason"]))
    frame.attrs["typed"] = _typed(ranges, shown)
    return frame


def _typed(ranges: Mapping[str, list[Any]], shown: dict[str, dict[str, Any]]) -> dict:
    """``{path: {repr of the SI value: the text typed}}`` for values given with a unit
    (``"200 Gb/s"`` → 2.5e10): the table and the plot show what was typed, the frame's columns
    hold SI values (B/s, s, bytes) as the config stores them."""
    out: dict[str, dict[str, str]] = {}
    for path, values in ranges.items():
        for v in values:
            si = shown[path][_json(v)]
            if isinstance(v, str) and isinstance(si, (int, float)) and not isinstance(si, bool):
                out.setdefault(path, {})[repr(float(si))] = v
    return out


def _sweep_limits(limits: Any, max_runs: int | None) -> Any:
    """``limits`` (default ``Limits()``) with ``sweep_runs`` set to ``max_runs`` if given."""
    from dataclasses import replace

    from .limits import Limits

    limits = limits if limits is not None else Limits()
    if not isinstance(limits, Limits):
        raise ConfigError(f"limits must be a ddlsim.limits.Limits; got {type(limits).__name__}")
    return limits if max_runs is None else replace(limits, sweep_runs=max_runs)


def reason_counts(frame) -> list[tuple[str, int]]:
    """``(reason, rows)`` of the invalid rows, most frequent first, then in sweep order."""
    reasons = [r for r in frame["reason"] if isinstance(r, str)]
    first = {r: i for i, r in reversed(list(enumerate(reasons)))}
    return sorted(((r, reasons.count(r)) for r in first), key=lambda x: (-x[1], first[x[0]]))

"""What-if grids: every combination of a few config fields, each predicted exactly.

``ddlsim sweep CONFIG --set-range 'system.nic.bandwidth_Bps=1,10,100 Gb/s'`` and
:func:`sweep` run :func:`ddlsim.predict` on the product of the ranges, in a fixed order (the
first range varies slowest, the last fastest). A combination the config rules reject is not an
error of the sweep: its row says ``valid = False`` and the reason (the
:class:`~ddlsim.errors.ConfigError` message); a plan that does not fit in device memory is
predicted anyway and its row says ``fits = False``.

Range syntax (:func:`parse_values`), the value part of ``PATH=VALUES``:

* a comma list of YAML scalars: ``1,2,4``, ``ring,tree``, ``true,false``;
* when the last item carries a unit, every bare number before it takes the same unit:
  ``100,200,400 Gb/s`` is ``100 Gb/s, 200 Gb/s, 400 Gb/s`` (``10 Gb/s,1 GB/s`` mixes units);
* an inclusive integer range ``START:STOP[:STEP]``: ``1:8`` is 1, 2, …, 8, ``0:12:4`` is
  0, 4, 8, 12, and ``1:64:*2`` is geometric: 1, 2, 4, …, 64.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, did_you_mean

__all__ = ["sweep", "parse_range", "parse_ranges", "parse_values", "reason_counts", "SweepError", "MAX_RUNS",
           "RANGE_FORMS", "DOES_NOT_FIT"]

#: Most combinations a sweep runs unless ``limits.sweep_runs`` (``--limit sweep_runs=N``)
#: raises it: :class:`ddlsim.limits.Limits`'s default.
MAX_RUNS = 10_000
#: The allowed forms, as every message about a range states them.
RANGE_FORMS = ("a comma list of YAML values (1,2,4 or ring,tree or true,false), where a unit "
               "on the last item applies to every bare number (100,200,400 Gb/s), or an "
               "inclusive integer range START:STOP[:STEP] (1:8 is 1..8, 0:12:4 is 0,4,8,12, "
               "1:64:*2 is 1,2,4,...,64)")
#: The reason of a plan that does not fit in memory when ``check_fit`` is True.
DOES_NOT_FIT = "the plan does not fit in device memory"
ENGINES = ("analytical", "des", "both")

_INT_RANGE = re.compile(r"^\s*([-+]?\d+)\s*:\s*([-+]?\d+)\s*(?::\s*(\*?)\s*(\d+)\s*)?$")
_WITH_UNIT = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*"
                        r"(?P<unit>[A-Za-z\u00b5\u03bc][A-Za-z\u00b5\u03bc/]*)\s*$")
_RANGE_LIKE = re.compile(r"^[-+\d.*\s]*:[-+\d.*:\s]*[A-Za-z\u00b5\u03bc/\s]*$")
_PLAIN_INT = re.compile(r"^[-+]?[1-9]\d{0,17}$|^0$")
_NUMBER = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$")


class SweepError(ConfigError):
    """A range that cannot be read, a path the config does not have, or a sweep too large."""


def _refuse(option: str, problem: str) -> SweepError:
    return SweepError(f"{option}: {problem}; a range is {RANGE_FORMS}")


def _int_range(spec: str, option: str, limits: Any = None) -> list[int] | None:
    from .limits import check_budget

    m = _INT_RANGE.match(spec)
    if m is None:
        return None
    start, stop = int(m[1]), int(m[2])
    geometric, step = m[3] == "*", int(m[4] or 1)
    if step >= 1 and not geometric:  # counted before the list is built
        check_budget({"axis_values": max(stop - start, 0) // step + 1}, limits, option)
    if stop < start:
        raise _refuse(option, f"the integer range {spec!r} ends ({stop}) before it starts "
                              f"({start})")
    if geometric:
        if start < 1 or step < 2:
            raise _refuse(option, f"the geometric range {spec!r} needs START >= 1 and a factor "
                                  f">= 2")
        out = [start]
        while out[-1] * step <= stop:
            out.append(out[-1] * step)
        return out
    if step < 1:
        raise _refuse(option, f"the integer range {spec!r} needs a step >= 1")
    return list(range(start, stop + 1, step))


def _scalar(item: str, option: str) -> Any:
    from .documents import DocumentError, parse_yaml

    if _PLAIN_INT.match(item):  # the common case, without a YAML parser per item
        return int(item)
    if item.lstrip()[:1] in ("[", "{", "&", "*", "!", "|", ">"):
        raise _refuse(option, f"the item {item.strip()!r} is not a scalar value")
    try:
        value = parse_yaml(item, f"{option} item")
    except DocumentError:
        raise _refuse(option, f"the item {item.strip()!r} is not a YAML value") from None
    if isinstance(value, (list, dict)):
        raise _refuse(option, f"the item {item.strip()!r} is not a scalar value")
    return value


def parse_values(spec: str, option: str = "--set-range", limits: Any = None) -> list[Any]:
    """The values a range string names (the forms are in the module docstring).

    Parameters
    ----------
    spec : the text after ``PATH=``, e.g. ``"100,200,400 Gb/s"`` or ``"1:64:*2"``.
    option : how messages name the range.
    limits : :class:`ddlsim.limits.Limits` whose ``axis_values`` bounds the values, counted
        before any is built (default ``Limits()``).

    Returns
    -------
    list
        Integers for an integer range; YAML scalars (numbers, booleans, strings, null) for
        a list, numbers with a unit as strings (``"100 Gb/s"``).

    Raises
    ------
    SweepError
        An empty item, a collection, duplicated values, a bad integer range.
    WorkTooLargeError
        More values than ``limits.axis_values``.
    """
    from .limits import check_budget

    spec = str(spec)
    numbers = _int_range(spec, option, limits)
    if numbers is not None:
        return numbers
    check_budget({"axis_values": spec.count(",") + 1}, limits, option)
    items = [s.strip() for s in spec.split(",")]
    if not spec.strip() or any(not s for s in items):
        raise _refuse(option, f"{spec!r} has an empty item")
    ranged = [s for s in items if _RANGE_LIKE.match(s)]
    if ranged:
        raise _refuse(option, f"{ranged[0]!r} is not an integer range START:STOP[:STEP] "
                              "(integers without a unit, STEP >= 1 or *FACTOR >= 2, one range "
                              "alone)")
    unit = _WITH_UNIT.match(items[-1])
    if unit is not None:
        stray = [s for s in items if not (_NUMBER.match(s) or _WITH_UNIT.match(s))]
        if stray:
            raise _refuse(option, f"the unit {unit['unit']!r} of the last item applies to "
                                  f"numbers, but {stray[0]!r} is not one")
        values: list[Any] = [f"{s} {unit['unit']}" if _NUMBER.match(s) else s for s in items]
    else:
        values = [_scalar(s, option) for s in items]
    keys = [_json(v) for v in values]
    if len(set(keys)) != len(keys):
        twice = next(v for v, k in zip(values, keys) if keys.count(k) > 1)
        raise _refuse(option, f"the value {twice!r} is given twice")
    return values


def parse_range(text: str, option: str = "--set-range",
                limits: Any = None) -> tuple[str, list[Any]]:
    """``'PATH=VALUES'`` → ``(PATH, values)`` (:func:`parse_values`); PATH is
    ``section.key[.key…]`` as for ``--set``."""
    path, sep, spec = str(text).partition("=")
    path = path.strip()
    if not sep or len(path.split(".")) < 2 or not all(k.strip() for k in path.split(".")):
        raise _refuse(f"{option} {_short(text)}", "write PATH=VALUES with PATH a section and one or "
                                            "more keys joined by dots, e.g. "
                                            "'system.nic.bandwidth_Bps=100,200,400 Gb/s'")
    return path, parse_values(spec, f"{option} {_short(text)}", limits)


def _short(text: str, most: int = 60) -> str:
    """``text`` quoted, cut to ``most`` characters for a message."""
    text = str(text)
    return repr(text if len(text) <= most else f"{text[:most]}…")


def parse_ranges(texts: Iterable[str], option: str = "--set-range",
                 limits: Any = None) -> dict[str, list[Any]]:
    """``{PATH: values}`` of several ``PATH=VALUES`` strings (:func:`parse_range`), in order;
    a path given twice is refused."""
    ranges: dict[str, list[Any]] = {}
    for text in texts:
        path, values = parse_range(text, option, limits)
        if path in ranges:
            raise SweepError(f"{option} names {path!r} twice; give each field one range")
        ranges[path] = values
    return ranges


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
    """``SECTION.preset``: the section becomes each preset (ddlsim/configpresets.py), a
    field the resolved config does not have."""
    return path.count(".") == 1 and path.endswith(".preset")


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
        fixed = [o for o in source.overrides if str(o).partition("=")[0].strip() == path]
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
    pandas.DataFrame
        One row per combination (and engine), in sweep order: a column per swept path
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
    frame = pd.DataFrame(rows, columns=[*columns, "valid", "reason"])
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

"""Compare plans side by side: ``ddlsim compare A.yaml B.yaml`` or saved result JSONs.

Each input is a run config (predicted here, with the same ``--set`` overrides and engine for
every config) or a result saved by ``ddlsim predict -f json`` (one engine, or the
``{"analytical", "des", "difference"}`` mapping of ``--engine both``). The first run is the
baseline; every other run is shown with its absolute and relative difference from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import DDLSimError, OptionError, require
from .formatting import (format_bytes, format_change, format_count, format_flops,
                         format_percent, format_time)
from .simulator.result import Result
from .workloads.memory import PARTS as MEMORY_PARTS

__all__ = ["compare_inputs", "comparison_metrics", "comparison_payload", "render_comparison",
           "load_result_file", "Run"]

#: (label, result)
Run = tuple[str, Result]
_FORMATTERS: dict[str, Callable[[float], str]] = {
    "time": format_time, "count": format_count, "fraction": format_percent,
    "flops": format_flops, "bytes": format_bytes}


#: Most values a saved result JSON may hold (a DES result of 16,384 GPUs lists ~10^5 links).
MAX_RESULT_VALUES = 2_000_000


class ResultFileError(DDLSimError, ValueError):
    """A file given to compare is neither a run config nor a saved ddlsim result."""


def _saved_results(data: Any) -> list[tuple[str, dict]] | None:
    """The result mappings in a saved JSON, with a label suffix each, or None for a config."""
    if not isinstance(data, dict):
        return None
    if "iteration_time_s" in data:
        return [("", data)]
    both = [k for k in ("analytical", "des") if isinstance(data.get(k), dict)
            and "iteration_time_s" in data[k]]
    return [(f" ({k})", data[k]) for k in both] if both else None


def load_result_file(path: Path) -> list[tuple[str, Result]] | None:
    """The results saved in ``path`` (a ``predict -f json`` file), each with a label suffix,
    or None when ``path`` is not a saved result (then it is read as a run config).

    Raises
    ------
    ResultFileError
        When the file is a saved result with a missing or malformed field.
    """
    from .documents import DocumentError, parse_json
    from .textio import MAX_DATA_BYTES, read_text

    if path.suffix.lower() != ".json":
        return None
    text = read_text(path, what="result or config file", max_bytes=MAX_DATA_BYTES)
    try:
        data = parse_json(text, repr(str(path)), max_nodes=MAX_RESULT_VALUES)
    except DocumentError as exc:
        raise ResultFileError(str(exc)) from None
    saved = _saved_results(data)
    if saved is None:
        return None
    out = []
    for suffix, d in saved:
        _check_shape(d, f"{str(path)!r}{suffix}")
        try:
            result = Result.from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ResultFileError(f"{str(path)!r} looks like a saved ddlsim result but its "
                                  f"field {exc} is missing or malformed; save it again with "
                                  "ddlsim predict -f json") from None
        _check_saved(result, f"{str(path)!r}{suffix}")
        out.append((suffix, result))
    return out


#: What a saved result holds (``Result.to_dict``): key → kind; ``?`` marks an optional key.
#: ``tflops_per_device`` (TFLOP/s) is what files saved before 2026-11-29 hold instead of
#: ``flops_per_device`` (FLOP/s); one of the two is required. ``memory_per_device_bytes`` is
#: null when the memory is unknown (a trace read from Chakra files).
_SHAPE = {"engine": "text", "iteration_time_s": "number", "world_size": "whole",
          "samples_per_s": "number", "tokens_per_s": "number", "mfu": "number",
          "flops_per_device?": "number", "tflops_per_device?": "number", "breakdown": "mapping",
          "memory_per_device_bytes": "mapping or null", "comm_bytes?": "numbers",
          "samples?": "whole", "tokens?": "whole", "model_flops?": "number",
          "hardware_flops?": "number", "peak_flops_per_device?": "number",
          "parameter_count?": "whole", "per_class_time_s?": "numbers", "algorithms?": "mapping",
          "settings?": "mapping", "links?": "list", "critical_class?": "text"}
_BREAKDOWN = {"compute_s": "number", "optimizer_s": "number", "bubble_s": "number",
              "exposed_comm_s": "numbers", "host_s?": "number"}
_MEMORY = {k: "number" for k in ("weights", "gradients", "optimizer", "activations", "other",
                                 "capacity")} | {"stage?": "whole", "buffers?": "number",
                                                 "context?": "number"}


def _kind_ok(value: Any, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"number": number, "whole": number and float(value).is_integer(),
            "text": isinstance(value, str), "mapping": isinstance(value, dict),
            "mapping or null": value is None or isinstance(value, dict),
            "list": isinstance(value, list),
            "numbers": isinstance(value, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
            }[kind]


def _check_shape(d: dict, where: str) -> None:
    """Refuse a saved result with a key missing or of the wrong kind, naming it."""
    if "flops_per_device" not in d and "tflops_per_device" not in d:
        raise ResultFileError(f"{where} looks like a saved ddlsim result but has no "
                              "flops_per_device; save it again with ddlsim predict -f json")
    for shape, node, prefix in ((_SHAPE, d, ""), (_BREAKDOWN, d.get("breakdown"), "breakdown."),
                                (_MEMORY, d.get("memory_per_device_bytes"),
                                 "memory_per_device_bytes.")):
        if node is None and prefix:   # a null memory (checked above as allowed)
            continue
        for key, kind in shape.items():
            name, optional = key.rstrip("?"), key.endswith("?")
            if name not in node:
                if optional:
                    continue
                raise ResultFileError(f"{where} looks like a saved ddlsim result but has no "
                                      f"{prefix}{name}; save it again with ddlsim predict -f json")
            if not _kind_ok(node[name], kind):
                what = {"numbers": "a mapping of numbers", "whole": "a whole number"}.get(
                    kind, f"a {kind}")
                raise ResultFileError(f"{where}: {prefix}{name} = {_short(node[name])} is not "
                                      f"{what}; save it again with ddlsim predict -f json")


def _short(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[:most] + "…"


def _check_saved(r: Result, where: str) -> None:
    """Refuse a saved result whose numbers no prediction gives: a time that is not positive
    and finite, a rate, part or memory that is negative or not finite."""
    for key, value in (("iteration_time_s", r.iteration_time_s), ("world_size", r.world_size),
                       ("peak_flops_per_device", r.peak_flops_per_device)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ResultFileError(f"{where}: {key} = {value!r} is not a number a prediction "
                                  "gives (allowed: a finite number > 0); save it again with "
                                  "ddlsim predict -f json")
    b = r.breakdown
    values = {"samples_per_s": r.samples_per_s,
              "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
              "flops_per_device": r.flops_per_device, "breakdown.compute_s": b.compute_s,
              "breakdown.optimizer_s": b.optimizer_s, "breakdown.bubble_s": b.bubble_s,
              "breakdown.host_s": b.host_s,
              **{f"breakdown.exposed_comm_s.{k}": v for k, v in b.exposed_comm_s.items()},
              **{f"memory_per_device_bytes.{k}": getattr(r.memory, k)
                 for k in (*MEMORY_PARTS, "total", "capacity") if r.memory is not None}}
    for key, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ResultFileError(f"{where}: {key} = {value!r} is not a number a prediction "
                                  "gives (allowed: a finite number >= 0); save it again with "
                                  "ddlsim predict -f json")


def _labels(inputs: Sequence[Path], labels: Sequence[str] | None) -> list[str]:
    if labels:
        require(len(labels) == len(inputs), f"--label was given {len(labels)} time(s) for "
                                            f"{len(inputs)} inputs; give one label per input")
        require(len(set(labels)) == len(labels), "--label values must differ from each other")
        return list(labels)
    # a stem names its file unless another file has it too (one file twice: ``#2`` below)
    files = {p.stem: {str(q) for q in inputs if q.stem == p.stem} for p in inputs}
    names = [p.stem if len(files[p.stem]) == 1 else str(p) for p in inputs]
    names = _strip_common_prefix(names)
    return [n if names[:i].count(n) == 0 else f"{n} #{names[:i].count(n) + 1}"
            for i, n in enumerate(names)]


def _strip_common_prefix(names: list[str]) -> list[str]:
    """``wiki-gpt2-9ranks-ddp``, ``wiki-gpt2-9ranks-reduce_scatter`` → ``ddp``,
    ``reduce_scatter``: the shared prefix up to its last ``-`` or ``/`` is dropped; names all
    alike (one config compared with itself) are kept whole."""
    import os

    if len(set(names)) < 2:
        return names
    prefix = os.path.commonprefix(names)
    cut = max(prefix.rfind(c) for c in "-/") + 1
    if cut <= 0 or any(len(n) <= cut for n in names):
        return names
    return [n[cut:] for n in names]


def compare_inputs(inputs: Sequence[Path], overrides: Sequence[str], engine: str | None,
                   labels: Sequence[str] | None = None, *, calibration=None,
                   backend: str | None = None, allow_oom: bool = False,
                   limits=None) -> list[Run]:
    """The labelled runs to compare: saved results as they are, configs predicted.

    Parameters
    ----------
    inputs : run configs and/or saved result JSONs.
    overrides : ``--set`` overrides applied to every config.
    engine : ``analytical`` (default), ``des`` or ``both``, for configs.
    labels : one name per input (default: the file names).
    calibration, backend, allow_oom, limits : as for ``ddlsim predict``, for configs.
    """
    from .cli import run_predictions
    from .config import load_config

    require(len(inputs) > 0, "compare needs at least one input")
    names = _labels(inputs, labels)
    loaded = [(name, path, load_result_file(path)) for name, path in zip(names, inputs)]
    configs = [path for _, path, saved in loaded if saved is None]
    if not configs:
        given = [opt for opt, v in (("--set", overrides), ("--engine", engine),
                                    ("--calibration", calibration), ("--allow-oom", allow_oom))
                 if v]
        require(not given, f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to run "
                           "configs, but every input is a saved result")
    engines = ["analytical", "des"] if engine == "both" else [engine or "analytical"]
    runs: list[Run] = []
    for name, path, saved in loaded:
        if saved is not None:
            runs += [(name + suffix, r) for suffix, r in saved]
            continue
        cfg = load_config(path, list(overrides))
        results = run_predictions(cfg, engines, calibration=calibration, backend=backend,
                                  allow_oom=allow_oom, limits=limits)
        runs += [(name if len(results) == 1 else f"{name} ({r.engine})", r) for r in results]
    require(len(runs) >= 2, f"compare needs two runs or more; {len(runs)} given (pass another "
                            "input, or --engine both)")
    return runs


def comparison_metrics(results: Sequence[Result]) -> list[tuple[str, str, list[float]]]:
    """``(metric name, kind, value per result)``; kinds: time, count, fraction, flops, bytes,
    bool. The breakdown parts add up to the iteration time."""
    kinds = sorted({k for r in results for k in r.breakdown.exposed_comm_s})
    rows: list[tuple[str, str, Callable[[Result], float]]] = [
        ("iteration_time_s", "time", lambda r: r.iteration_time_s),
        ("samples_per_s", "count", lambda r: r.samples_per_s),
        ("tokens_per_s", "count", lambda r: r.tokens_per_s),
        ("mfu", "fraction", lambda r: r.mfu),
        ("flops_per_device", "flops", lambda r: r.flops_per_device),
        ("compute_s", "time", lambda r: r.breakdown.compute_s),
        ("optimizer_s", "time", lambda r: r.breakdown.optimizer_s)]
    rows += [(f"exposed_comm_{k}_s", "time",
              (lambda k: lambda r: r.breakdown.exposed_comm_s.get(k, 0.0))(k)) for k in kinds]
    rows += [("exposed_comm_total_s", "time", lambda r: sum(r.breakdown.exposed_comm_s.values())),
             ("bubble_s", "time", lambda r: r.breakdown.bubble_s),
             ("host_s", "time", lambda r: r.breakdown.host_s)]
    if all(r.memory is not None for r in results):   # unknown for a trace read from files
        rows += [("memory_total_bytes", "bytes", lambda r: r.memory.total),
                 ("memory_capacity_bytes", "bytes", lambda r: r.memory.capacity),
                 ("fits", "bool", lambda r: r.fits)]
    return [(name, kind, [get(r) for r in results]) for name, kind, get in rows]


def _relative(new: float, old: float) -> float | None:
    if old == 0 or not (math.isfinite(new) and math.isfinite(old)):
        return None
    return new / old - 1


def comparison_payload(runs: Sequence[Run]) -> dict[str, Any]:
    """The JSON of ``compare -f json``: the baseline label, every run's full result, and per
    metric the values, differences and relative differences from the baseline."""
    labels = [lab for lab, _ in runs]
    metrics = []
    for name, kind, values in comparison_metrics([r for _, r in runs]):
        entry: dict[str, Any] = {"metric": name, "values": dict(zip(labels, values))}
        if kind != "bool":
            entry["difference"] = {lab: v - values[0] for lab, v in zip(labels[1:], values[1:])}
            entry["relative"] = {lab: _relative(v, values[0])
                                 for lab, v in zip(labels[1:], values[1:])}
        metrics.append(entry)
    return {"baseline": labels[0], "labels": labels, "metrics": metrics,
            "runs": [{"label": lab, "result": r.to_dict()} for lab, r in runs]}


def _comparison_csv(runs: Sequence[Run]) -> str:
    import pandas as pd

    labels = [lab for lab, _ in runs]
    base = labels[0]
    rows = []
    for name, kind, values in comparison_metrics([r for _, r in runs]):
        row: dict[str, Any] = {"metric": name, **dict(zip(labels, values))}
        for lab, v in zip(labels[1:], values[1:]):
            numeric = kind != "bool"
            row[f"{lab} - {base}"] = v - values[0] if numeric else None
            row[f"{lab} / {base} - 1"] = _relative(v, values[0]) if numeric else None
        rows.append(row)
    return pd.DataFrame(rows).to_csv(index=False, lineterminator="\n")


_TITLES = {"iteration_time_s": "iteration time", "samples_per_s": "samples/s",
           "tokens_per_s": "tokens/s", "mfu": "MFU", "flops_per_device": "FLOP/s per device",
           "compute_s": "compute", "optimizer_s": "optimizer step",
           "exposed_comm_total_s": "exposed comm: total", "bubble_s": "pipeline bubble / wait",
           "host_s": "waiting for the host",
           "memory_total_bytes": "memory per device", "memory_capacity_bytes": "memory capacity",
           "fits": "fits in memory"}


def _signed(kind: str, diff: float) -> str:
    if kind == "fraction":  # a difference of two fractions: percentage points
        text = format_percent(diff).replace("%", " pp")
    else:
        text = _FORMATTERS[kind](diff)
    return text if text.startswith("-") or text.split(" ")[0] == "0" else "+" + text


def comparison_table(runs: Sequence[Run]):
    """A rich table: one column per run, then per later run its difference from the first
    and the relative change."""
    from rich.markup import escape
    from rich.table import Table

    labels = [lab for lab, _ in runs]
    t = Table(title=f"Comparison (baseline: {escape(labels[0])})", title_justify="left")
    t.add_column("", no_wrap=True)
    for lab in labels:
        t.add_column(escape(lab), justify="right")
    for lab in labels[1:]:
        t.add_column("Δ" if len(labels) == 2 else f"Δ {escape(lab)}", justify="right")
        t.add_column("change", justify="right")
    from .report import displayed

    results = [r for _, r in runs]
    for name, kind, values in comparison_metrics(results):
        if kind == "time" and name != "iteration_time_s":  # float residues shown as 0
            values = [displayed(v, r.iteration_time_s) for v, r in zip(values, results)]
        name = _TITLES.get(name) or name.removesuffix("_s").replace("exposed_comm_",
                                                                    "exposed comm: ")
        if kind == "bool":
            t.add_row(name, *["yes" if v else "[bold red]NO[/]" for v in values],
                      *[""] * (2 * (len(values) - 1)))
            continue
        if all(v == 0 for v in values):
            continue
        cells = [_FORMATTERS[kind](v) for v in values]
        for v in values[1:]:
            same = abs(v - values[0]) <= 1e-9 * abs(values[0])
            cells += ["0" if same else _signed(kind, v - values[0]), format_change(v, values[0])]
        t.add_row(name, *cells)
    return t


def render_comparison(runs: Sequence[Run], fmt: str):
    """The comparison as ``fmt``: a rich Table for ``table``, text for ``json`` and ``csv``."""
    if fmt == "json":
        from .report import dumps_json
        return dumps_json(comparison_payload(runs))
    if fmt == "csv":
        return _comparison_csv(runs)
    if fmt == "table":
        return comparison_table(runs)
    raise OptionError(f"--format {fmt!r} is not allowed; choose from table, json, csv")

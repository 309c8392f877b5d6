"""How ``ddlsim sweep`` shows a sweep: a rich table, a summary of the invalid combinations
per reason, CSV/JSON/Parquet files, a plot, and a progress bar for long sweeps."""

from __future__ import annotations

import io
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import OptionError
from .formatting import format_bandwidth, format_bytes, format_count, format_percent, format_time
from .sweeps import reason_counts, sweep

__all__ = ["sweep_table", "summary_text", "frame_text", "check_frame_output", "write_frame",
           "draw_sweep", "ProgressBar", "run_with_progress", "show"]

GIB = 2.0**30


def _value(path: str, v: Any, typed: dict | None = None) -> str:
    """A swept value as it was typed (``typed``: SI value → text, from ``frame.attrs``), else
    in the unit its path names (``_Bps``, ``_bytes``, ``_s``)."""
    if typed and path in typed:
        text = typed[path].get(_key(v))
        if text is not None:
            return text
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    for suffix, fmt in (("_Bps", format_bandwidth), ("_bytes", format_bytes), ("_s", format_time)):
        if path.endswith(suffix):
            return fmt(float(v))
    return format_count(v) if isinstance(v, float) else str(v)


def _key(v: Any) -> str:
    """A swept value as a lookup key (floats by their shortest repr)."""
    return repr(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)


def _header(path: str, paths: Sequence[str]) -> str:
    """The column name of a swept path: its last key without a unit suffix (the cells carry
    the unit), the whole path when two paths end alike."""
    short = path.rpartition(".")[2]
    if [q.rpartition(".")[2] for q in paths].count(short) > 1:
        return path
    for suffix in ("_Bps", "_bytes", "_s"):
        if short.endswith(suffix) and len(short) > len(suffix):
            return short[:-len(suffix)]
    return short


def sweep_table(frame, paths: Sequence[str], width: int | None = None):
    """A rich Table: the swept values (as typed), then iteration time, tokens/s, MFU, memory
    per device, fits, or the reason of an invalid combination; rows in sweep order.

    Cells never wrap and the layout is narrow (no outer box, one space between columns).
    When the columns need more than ``width`` characters, tokens/s and then MFU are left out
    (the caption says so; ``-f csv`` has every column) rather than cut.
    """
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    both = frame["engine"].nunique() > 1
    typed = frame.attrs.get("typed")
    number = {r: i for i, (r, _) in enumerate(reason_counts(frame), 1)}
    names = [_header(p, paths) for p in paths] + (["engine"] if both else []) + [
        "iteration", "tokens/s", "MFU", "memory", "fits", "valid"]
    rows = [_cells(row, paths, typed, both, number) for row in frame.to_dict(orient="records")]
    keep = list(range(len(names)))
    dropped = []
    for name in ("tokens/s", "MFU"):
        if width is None or _width(names, rows, keep) <= width:
            break
        keep.remove(names.index(name))
        dropped.append(name)
    caption = (f"{' and '.join(dropped)} left out at {width} columns (--width, or -f csv for "
               "every column)") if dropped else None
    t = Table(title=f"Sweep of {', '.join(paths)}", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, show_edge=False, padding=(0, 1, 0, 0), caption=caption,
              caption_justify="left")
    for i in keep:
        left = i < len(paths) and not _number_column(rows, i) or names[i] in ("engine", "valid")
        t.add_column(escape(names[i]), justify="left" if left else "right", no_wrap=True)
    for cells in rows:
        t.add_row(*(_styled(cells[i]) for i in keep))
    return t


def _cells(row: dict, paths: Sequence[str], typed, both: bool, number: dict) -> list[str]:
    """One row's cells as plain text (``!`` marks a cell to show in red)."""
    cells = [_value(p, row[p], typed) for p in paths] + ([str(row["engine"])] if both else [])
    if not _number(row.get("iteration_time_s")):
        return cells + ["-"] * 5 + [f"!no ({number[row['reason']]})"]
    valid = "yes" if row["valid"] else f"!no ({number[row['reason']]})"
    return cells + [format_time(row["iteration_time_s"]), format_count(row["tokens_per_s"]),
                    format_percent(row["mfu"]), format_bytes(row["memory_total_bytes"]),
                    "yes" if row["fits"] else "!NO", valid]


def _styled(cell: str) -> str:
    from rich.markup import escape

    return f"[red]{escape(cell[1:])}[/]" if cell.startswith("!") else escape(cell)


def _width(names: list[str], rows: list[list[str]], keep: list[int]) -> int:
    """Characters the kept columns take: the widest cell or header of each, plus two (padding and the separator)."""
    return sum(max([len(names[i])] + [len(r[i].lstrip("!")) for r in rows]) + 2 for i in keep) - 1


def _number_column(rows: list[list[str]], i: int) -> bool:
    return all(r[i][:1].isdigit() or r[i][:1] == "-" for r in rows)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def summary_text(frame) -> str:
    """``'9 runs: 3 valid (1 does not fit in device memory), 6 invalid:'`` and one line per
    reason, numbered as the table's ``valid`` column refers to them: ``'(1) 3 × …'``."""
    n, valid = len(frame), int(frame["valid"].sum())
    predicted = frame["iteration_time_s"].notna() if "iteration_time_s" in frame else []
    oom = int((~frame["fits"].astype(bool) & predicted).sum()) if "fits" in frame else 0
    text = f"{n} run{'s' if n != 1 else ''}: {valid} valid"
    if oom:
        text += f" ({oom} do{'es' if oom == 1 else ''} not fit in device memory)"
    counts = reason_counts(frame)
    if counts:
        text += f", {n - valid} invalid:" + "".join(f"\n  ({i}) {c} × {r}"
                                                    for i, (r, c) in enumerate(counts, 1))
    return text


def _records(frame) -> list[dict[str, Any]]:
    """Rows as plain Python values, missing ones as None."""
    plain = frame.astype(object)
    return plain.where(plain.notna(), None).to_dict(orient="records")


def frame_text(frame, fmt: str) -> str:
    """The sweep as CSV (full float precision) or JSON (a list of rows)."""
    if fmt == "json":
        from .report import dumps_json
        return dumps_json(_records(frame))
    return frame.to_csv(index=False, lineterminator="\n")


def check_frame_output(path: Path | None) -> None:
    """Refuse ``-o FILE.parquet`` before the run when pyarrow cannot be imported, and ``-o -``
    (use ``--format csv|json`` for standard output)."""
    if path is None:
        return
    if str(path) == "-":
        raise OptionError("-o - is not allowed for a sweep: the table goes to standard output; "
                          "use --format csv or --format json to print the rows there")
    if Path(path).suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise OptionError(f"-o {str(path)!r}: writing Parquet needs pyarrow, which is not "
                              "installed (pip install 'ddlsim[parquet]', or pip install pyarrow); or write CSV with -o "
                              f"{Path(path).with_suffix('.csv')}") from None


def write_frame(frame, path: Path, force: bool) -> None:
    """Write the sweep: Parquet for ``.parquet``, JSON rows for ``.json``, CSV otherwise."""
    from .textio import write_output

    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        data: Any = buf.getvalue()
    else:
        data = frame_text(frame, "json" if suffix == ".json" else "csv")
    write_output(path, data, force=force, what="--output file")


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _x_axis(frame, paths: Sequence[str]) -> str:
    for p in paths:
        if _numeric(list(frame[p])):
            return p
    raise OptionError(f"--plot draws against a numeric swept field, but none of "
                      f"{', '.join(paths)} is numeric")


def _unit(path: str) -> str:
    return next((u for s, u in (("_Bps", " (B/s)"), ("_bytes", " (bytes)"), ("_s", " (s)"))
                 if path.endswith(s)), "")


def _typed_scale(frame, path: str) -> tuple[float, str] | None:
    """``(SI per typed unit, unit)`` when every value of ``path`` was typed with one unit
    (``100,200,400 Gb/s`` → (1.25e8, "Gb/s")), so the plot's axis reads as the input did."""
    typed = frame.attrs.get("typed", {}).get(path, {})
    if not typed:
        return None
    units, scales = set(), set()
    for si, text in typed.items():
        number, _, unit = text.strip().partition(" ")
        try:
            scales.add(float(si) / float(number))
        except (ValueError, ZeroDivisionError):
            return None
        units.add(unit.strip())
    if len(units) != 1 or max(scales) > min(scales) * (1 + 1e-9):
        return None
    return scales.pop(), units.pop()


def draw_sweep(frame, paths: Sequence[str], path: Path, force: bool = False):
    """Iteration time (and memory per device when it varies) against the first numeric swept
    field, one line per combination of the other fields (and engine); log x for bandwidths
    and ranges spanning 8× or more. Invalid combinations are left out.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .figio import save_figure

    x = _x_axis(frame, paths)
    ok = frame[frame["iteration_time_s"].notna()]
    if ok.empty:
        raise OptionError("--plot: no combination of the sweep is valid, so there is nothing "
                          "to draw")
    keys = [p for p in paths if p != x] + (["engine"] if frame["engine"].nunique() > 1 else [])
    memory = ok["memory_total_bytes"].nunique() > 1
    fig = Figure(figsize=(8, 7 if memory else 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2 if memory else 1, 1, sharex=True, squeeze=False)[:, 0]
    groups = ok.groupby(keys, sort=False) if keys else [((), ok)]
    typed = frame.attrs.get("typed")
    scale, unit = _typed_scale(frame, x) or (1.0, _unit(x).strip(" ()"))
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={_value(k, v, typed)}" for k, v in zip(keys, key)) or None
        axes[0].plot(g[x] / scale, g["iteration_time_s"], marker="o", label=label)
        if memory:
            axes[1].plot(g[x] / scale, g["memory_total_bytes"] / GIB, marker="o", label=label)
    values = [float(v) for v in ok[x]]
    if x.endswith("_Bps") or (min(values) > 0 and max(values) >= 8 * min(values)):
        for ax in axes:
            ax.set_xscale("log")
    axes[0].set_ylabel("iteration time (s)")
    if memory:
        axes[1].plot(ok[x] / scale, ok["memory_capacity_bytes"] / GIB, "k--", lw=1,
                     label="capacity")
        axes[1].set_ylabel("memory per device (GiB)")
    name = next((x[:-len(u)] for u in ("_Bps", "_bytes", "_s") if x.endswith(u)), x)
    axes[-1].set_xlabel(f"{name} ({unit})" if unit else x)
    if keys and len(groups) <= 12:
        axes[0].legend(fontsize=8)
    if memory:
        axes[-1].legend(fontsize=8)
    model = ok["model"].iloc[0] if "model" in ok else ""
    fig.suptitle(f"ddlsim sweep: {model} on {ok['system'].iloc[0]}")
    save_figure(fig, path, force=force, what="--plot file", dpi=120)
    return fig


class ProgressBar:
    """A rich progress bar on stderr, shown once the sweep has run for ``delay_s``; call it
    with (done, total); ``close()`` removes it."""

    def __init__(self, delay_s: float = 1.0):
        self.start = time.monotonic()
        self.delay_s = delay_s
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.start < self.delay_s or done >= total:
                return
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("sweep", total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def run_with_progress(config: Any, ranges: dict[str, list[Any]], overrides: Sequence[str],
                      engine: str, check_fit: bool, max_runs: int | None,
                      dask: str | None = None, dask_workers: int | None = None,
                      limits: Any = None):
    """:func:`ddlsim.sweeps.sweep` with a :class:`ProgressBar` on stderr (on a Dask cluster
    when ``dask`` is given: ``"local"`` or a scheduler address)."""
    bar = ProgressBar()
    try:
        return sweep(config, ranges, overrides, engine, check_fit, max_runs=max_runs,
                     limits=limits, progress=bar, dask=dask, dask_workers=dask_workers)
    finally:
        bar.close()


def show(frame, paths: Sequence[str], fmt: str, console) -> None:
    """Print the sweep on ``console`` as a table and its summary, or as ``fmt`` text on
    standard output with the summary on stderr."""
    from rich.console import Console

    from .textio import write_output

    if fmt == "table":
        console.print(sweep_table(frame, paths, console.width))
        console.print(summary_text(frame), highlight=False)
        return
    write_output("-", frame_text(frame, fmt), what="standard output")
    Console(stderr=True, highlight=False).print(summary_text(frame))

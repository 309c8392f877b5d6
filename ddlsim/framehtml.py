"""Sweep and search results in Jupyter: a compact HTML table, a sweep's rows with their
breakdown as stacked bars.

:func:`ddlsim.sweep` and :func:`ddlsim.search` return a :class:`ResultFrame`: a
:class:`pandas.DataFrame` in every way (same columns, SI values), whose ``_repr_html_`` shows
the few columns a person reads (swept values as typed, the plan in words, time, MFU, memory,
validity) instead of 40 raw ones. :meth:`ResultFrame.to_frame` gives the plain DataFrame.
"""

from __future__ import annotations

from html import escape
from typing import Any

import pandas as pd

from .formatting import format_bytes, format_percent, format_time

__all__ = ["ResultFrame", "frame_html"]

#: Rows shown in HTML; the rest are counted.
MAX_ROWS = 50
_PARTS = ("compute_s", "optimizer_s", "exposed_comm_dp_s", "exposed_comm_tp_s",
          "exposed_comm_pp_s", "exposed_comm_ep_s", "exposed_comm_cp_s", "bubble_s", "host_s")
_COLOURS = ("#4c72b0", "#8172b3", "#dd8452", "#55a868", "#c44e52", "#937860", "#da8bc3",
            "#bbbbbb", "#b07aa1")


class ResultFrame(pd.DataFrame):
    """A DataFrame of sweep or search rows that Jupyter shows compactly (:func:`frame_html`)."""

    @property
    def _constructor(self):
        return ResultFrame

    def to_frame(self) -> pd.DataFrame:
        """The rows as a plain :class:`pandas.DataFrame` (attrs kept)."""
        out = pd.DataFrame(self)
        out.attrs = dict(self.attrs)
        return out

    def _repr_html_(self) -> str | None:
        html = frame_html(self)
        return html if html is not None else pd.DataFrame._repr_html_(self)


def _bar(row: dict, scale: float) -> str:
    """A row's breakdown as a stacked bar, ``scale`` seconds to the full width."""
    cells = []
    for part, colour in zip(_PARTS, _COLOURS):
        v = row.get(part)
        if isinstance(v, (int, float)) and v == v and v > 0:
            label = escape(f"{part[:-2].replace('_', ' ')}: {format_time(v)}")
            cells.append(f"<div title='{label}' style='width:{100 * v / scale:.3f}%;"
                         f"background:{colour};height:100%'></div>")
    return ("<div style='display:flex;width:12em;height:0.8em;border:1px solid #ccc'>"
            f"{''.join(cells)}</div>")


def _cell(value: Any, fmt) -> str:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return fmt(value) if ok else "-"


def frame_html(frame: pd.DataFrame) -> str | None:
    """The compact HTML of a sweep frame (``attrs["typed"]`` present) or a search frame
    (a ``pareto`` column), or None for any other frame (pandas' own view then)."""
    if "iteration_time_s" not in frame:
        return None
    rows = frame.head(MAX_ROWS).to_dict(orient="records")
    if "pareto" in frame and "rank" in frame:
        from .search.report import _context_columns, hidden_parts, plan_label

        extra, hide = _context_columns(frame), hidden_parts(frame)
        heads = ["#", "plan", "iteration", "MFU", "memory", "Pareto"]
        body = [[str(r["rank"]), plan_label(r, extra, short=False, hide=hide),
                 _cell(r["iteration_time_s"], format_time), _cell(r["mfu"], format_percent),
                 _cell(r["memory_per_device_bytes"], format_bytes), "*" if r["pareto"] else ""]
                for r in rows]
        bars = None
    elif "valid" in frame and "typed" in frame.attrs:
        from .sweepreport import _value

        paths = [c for c in frame.columns if "." in c]
        typed = frame.attrs.get("typed")
        scale = max([v for v in frame["iteration_time_s"] if v == v] or [1.0])
        heads = [*paths, "engine", "iteration", "MFU", "memory", "valid", "breakdown"]
        body = [[*(_value(p, r[p], typed) for p in paths), str(r["engine"]),
                 _cell(r["iteration_time_s"], format_time), _cell(r["mfu"], format_percent),
                 _cell(r.get("memory_total_bytes"), format_bytes),
                 "yes" if r["valid"] else f"no: {r['reason']}"] for r in rows]
        bars = [_bar(r, scale) for r in rows]
    else:
        return None
    head = "".join(f"<th>{escape(h)}</th>" for h in heads)
    lines = []
    for i, cells in enumerate(body):
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells)
        lines.append(f"<tr>{tds}{f'<td>{bars[i]}</td>' if bars else ''}</tr>")
    more = len(frame) - len(rows)
    tail = f"<p>… {more:,} more rows (frame.to_frame() has them all)</p>" if more > 0 else ""
    return f"<table><tr>{head}</tr>{''.join(lines)}</table>{tail}"

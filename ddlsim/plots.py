"""Pictures of predictions, as PNG files a newcomer opens without a browser.

* :func:`draw_timeline` — a Gantt chart of one iteration: one row per rank class (its first
  rank), an upper lane for the compute stream and a lower lane for the communication streams,
  coloured by what runs (compute, optimizer step, communication per group kind, point-to-point
  transfers), idle time on the compute stream shaded.
* :func:`draw_breakdown` — stacked bars of where each result's iteration time goes.

matplotlib is imported only here, when a picture is drawn, and drawn on a plain
:class:`~matplotlib.figure.Figure` with the Agg canvas (no pyplot, no display, no global
figure registry). Files are written with :func:`ddlsim.textio.write_output`.

Readability at scale: a lane is cut into :data:`COLUMNS` time columns (about a pixel each)
and drawn as the share of each column that every kind occupies, stacked (one filled step
patch per lane and kind, rasterized). Where ops are longer than a column this is the usual
Gantt bar; where a column holds several (a 1 ms tensor-parallel all-reduce between 10 ms
GEMMs of a 20 s iteration) each kind keeps its true share instead of one hiding the other.
The patches drawn are bounded (lanes × kinds), whatever the number of spans: GPT-3 175B with
16 stages and 192 micro-batches draws in about a second.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DDLSimError
from .simulator.result import Result, Span
from .textio import check_output, write_output
from .units import format_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_timeline", "draw_breakdown", "PlotError", "COLUMNS"]

#: Time columns per lane (about one per pixel of the axes): a lane is drawn as the share of
#: each column every kind occupies.
COLUMNS = 1600

IDLE = "idle (waiting)"
P2P = "send/recv"
#: Colour per category (the ``Span.kind`` values, sends and receives together).
COLOURS = {"compute": "#4c72b0", "optimizer": "#8172b3", "tp": "#55a868", "dp": "#dd8452",
           "pp": "#c44e52", "ep": "#937860", P2P: "#da8bc3", "cp": "#ccb974",
           "world": "#64b5cd", "other": "#8c8c8c", IDLE: "#e3e3e3", "host": "#b07aa1"}
_ORDER = ("compute", "optimizer", "tp", "dp", "pp", "ep", "cp", P2P, "world", "other")
_SPARE = ("#64b5cd", "#b07aa1", "#9c755f", "#bab0ac", "#59a14f")


class PlotError(DDLSimError, ValueError):
    """A result cannot be drawn as asked (no spans to draw, labels that do not match)."""


def draw_timeline(result: Result, path: str | Path | None, *, force: bool = False,
                  title: str | None = None) -> "Figure":
    """Draw one iteration of ``result`` as a Gantt chart and write it to ``path``.

    Parameters
    ----------
    result : a prediction with spans: the DES's (every rank or one per class) or the
        analytical engine's (``predict(..., record_spans=True)``). Each rank class is drawn
        once, from its first rank that has spans.
    path : the file: PNG, or PDF/SVG by its suffix (``-``: PNG on standard output); None
        draws without writing.
    force : replace an existing regular file.
    title : the title; default: model, engine and iteration time.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn (x axis time in s, or ms below a second; one y tick per class).

    Raises
    ------
    PlotError
        ``result`` has no spans.
    ddlsim.textio.OutputFileError
        ``path`` exists and ``force`` is false, or cannot be written.
    """
    if path is not None:
        check_output(path, force, what="timeline")
    rows = _rows(result.spans)
    if not rows:
        raise PlotError(f"the {result.engine} result has no spans to draw a timeline from; "
                        "predict with record_spans=True (analytical engine) or with the DES "
                        "and spans other than 'none'")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    end = max(result.iteration_time_s, max(s.end_s for _, _, spans in rows for s in spans))
    end = end if end > 0 else 1e-3   # an empty iteration still gets an axis
    scale, unit = (1e3, "ms") if end < 1.0 else (1.0, "s")
    fig = Figure(figsize=(12, 1.6 + 0.42 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    comm_kinds = _comm_categories(rows)
    edges = [end * j / COLUMNS for j in range(COLUMNS + 1)]
    drawn: set[str] = set()
    for i, (_, _, spans) in enumerate(rows):
        drawn |= _draw_row(ax, i, spans, comm_kinds, edges, scale)
    ax.set_yticks(range(len(rows)), [f"{name} (rank {rank})" for name, rank, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, end * scale * 1.005)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("rank class")
    ax.set_title(title if title is not None else _timeline_title(result), loc="left")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    handles = [Patch(color=_colour(k), label=k) for k in _sorted(drawn)]
    lanes = ("upper lane: compute stream\nlower lane: communication" if comm_kinds
             else "compute stream")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False,
              title=lanes, title_fontsize=8, fontsize=9, alignment="left")
    _save(fig, path, force, "timeline")
    return fig


def draw_breakdown(results: Sequence[Result], path: str | Path | None, *,
                   labels: Sequence[str] | None = None, force: bool = False) -> "Figure":
    """Stacked bars of each result's iteration time: compute, optimizer step, exposed
    communication per group kind, pipeline bubble and the wait for the host (the parts of
    ``Result.breakdown``,
    which add up to the iteration time).

    Parameters
    ----------
    results : one bar per result.
    path : the file: PNG, or PDF/SVG by its suffix (``-``: PNG on standard output); None
        draws without writing.
    labels : one label per bar; default: the model and engine of each result.
    force : replace an existing regular file.

    Returns
    -------
    matplotlib.figure.Figure
        One stacked bar per result (y axis in seconds), its total written above it.
    """
    results = list(results)
    if not results:
        raise PlotError("draw_breakdown needs at least one result")
    if labels is not None and len(labels) != len(results):
        raise PlotError(f"draw_breakdown got {len(labels)} labels for {len(results)} results; "
                        "give one label per result")
    if path is not None:
        check_output(path, force, what="breakdown plot")
    from matplotlib.figure import Figure

    names = list(labels) if labels is not None else _default_labels(results)
    parts = _breakdown_parts(results)
    fig = Figure(figsize=(max(5.0, 1.6 + 1.3 * len(results)), 5.0), layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(results)))
    bottom = [0.0] * len(results)
    for name, values in parts.items():
        colour = COLOURS[IDLE] if name == "bubble" else _colour(name.removeprefix("exposed "))
        ax.bar(x, values, 0.6, bottom=bottom, label=name, color=colour,
               edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, values)]
    for xi, r in zip(x, results):
        ax.annotate(format_time(r.iteration_time_s), (xi, r.iteration_time_s),
                    xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
    ax.set_xticks(x, names)
    ax.set_ylabel("time per iteration (s)")
    ax.set_ylim(0, max(r.iteration_time_s for r in results) * 1.12)
    ax.set_title("Where the iteration time goes", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=9,
              reverse=True)
    _save(fig, path, force, "breakdown plot")
    return fig


# ---------------------------------------------------------------------------- timeline parts
def _rows(spans: Sequence[Span]) -> list[tuple[str, int, list[Span]]]:
    """(class name, representative rank, its spans) per class, in order of first rank."""
    rep: dict[str, int] = {}
    for s in spans:
        key = s.class_name or f"rank {s.rank}"
        rep[key] = min(rep.get(key, s.rank), s.rank)
    out: dict[str, list[Span]] = {key: [] for key in sorted(rep, key=rep.get)}
    for s in spans:
        key = s.class_name or f"rank {s.rank}"
        if rep[key] == s.rank:
            out[key].append(s)
    return [(key, rep[key], rows) for key, rows in out.items()]


def _category(kind: str) -> str | None:
    """What a span's colour stands for; None for a stream waiting on another (idle)."""
    if kind == "wait":
        return None
    if kind in ("send", "recv"):
        return P2P
    return kind or "other"


def _comm_categories(rows) -> list[str]:
    cats = {_category(s.kind) for _, _, spans in rows for s in spans if s.stream != "compute"}
    return _sorted(cats - {None})


def _sorted(cats) -> list[str]:
    return sorted(cats, key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k))


def _colour(cat: str) -> str:
    if cat in COLOURS:
        return COLOURS[cat]
    return _SPARE[sum(map(ord, cat)) % len(_SPARE)]   # stable across runs (no hash seed)


def _draw_row(ax, i: int, spans: list[Span], comm_kinds: list[str], edges,
              scale: float) -> set[str]:
    """Both lanes of row ``i``; returns the categories drawn. The compute lane stacks each
    kind's share of every column (kinds exclude each other on one stream); the communication
    lane has a band per kind, filled in every column where that kind runs at all (streams of
    one kind may overlap)."""
    import numpy as np

    lanes: dict[tuple[bool, str], list[tuple[float, float]]] = {}
    for s in spans:
        cat = _category(s.kind)
        if cat is not None and s.end_s > s.start_s:
            lanes.setdefault((s.stream == "compute", cat), []).append((s.start_s, s.end_s))
    busy = _union([iv for (on_compute, _), ivs in lanes.items() if on_compute for iv in ivs])
    last = max((s.end_s for s in spans if _category(s.kind) not in (None, P2P)), default=0.0)
    compute_lane = [(c, _occupancy(_union(lanes[True, c]), edges))
                    for c in _sorted(c for on, c in lanes if on)]
    compute_lane.append((IDLE, _occupancy(_gaps(busy, 0.0, last), edges)))
    drawn = set()
    x = np.asarray(edges) * scale
    height = 0.40 if comm_kinds else 0.84   # the compute lane fills a row without comm lane
    top = np.full(len(edges) - 1, i - 0.42)
    for cat, frac in compute_lane:      # one lane, shares stacked from its top
        if frac.any():
            _steps(ax, x, top, top + height * frac, _colour(cat))
            drawn.add(cat)
        top = top + height * frac
    band = 0.40 / max(1, len(comm_kinds))
    for cat in comm_kinds:
        if (False, cat) not in lanes:
            continue
        busy_cols = _occupancy(_union(lanes[False, cat]), edges) > 0   # a Gantt's 1-pixel bar
        y0 = np.full(len(edges) - 1, i + 0.02 + band * comm_kinds.index(cat))
        _steps(ax, x, y0, y0 + band * busy_cols, _colour(cat))
        drawn.add(cat)
    return drawn


def _steps(ax, x, lo, hi, colour: str) -> None:
    """Fill between two step functions (value j over [x[j], x[j+1])) as one polygon."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    xx = np.repeat(x, 2)[1:-1]
    verts = np.concatenate([np.column_stack([xx, np.repeat(hi, 2)]),
                            np.column_stack([xx[::-1], np.repeat(lo, 2)[::-1]])])
    ax.add_collection(PolyCollection([verts], facecolors=colour, linewidths=0,
                                     rasterized=True), autolim=False)


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering what ``iv`` covers."""
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _gaps(iv: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """What [start, end) minus the sorted disjoint intervals ``iv`` leaves."""
    out, t = [], start
    for a, b in iv:
        if a > t:
            out.append((t, min(a, end)))
        t = max(t, b)
    if end > t:
        out.append((t, end))
    return [(a, b) for a, b in out if b > a]


def _occupancy(iv: list[tuple[float, float]], edges):
    """Share of each bin ``[edges[j], edges[j+1])`` that the disjoint sorted intervals cover:
    differences of their cumulative length, interpolated at the edges."""
    import numpy as np

    if not iv:
        return np.zeros(len(edges) - 1)
    ab = np.asarray(iv, dtype=float)
    covered = np.cumsum(ab[:, 1] - ab[:, 0])
    xs = ab.ravel()
    ys = np.empty_like(xs)
    ys[1::2] = covered
    ys[0::2] = covered - (ab[:, 1] - ab[:, 0])
    f = np.interp(edges, xs, ys)
    return np.clip(np.diff(f) / np.diff(edges), 0.0, 1.0)


def _model_name(result: Any) -> str | None:
    cfg = getattr(result, "config", None)
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if isinstance(model, dict):
        return model.get("name")
    return model if isinstance(model, str) else None


def _timeline_title(result: Result) -> str:
    engine = {"des": "discrete-event engine"}.get(result.engine, f"{result.engine} engine")
    head = " · ".join(x for x in (_model_name(result), engine) if x)
    return (f"{head} · one iteration: {format_time(result.iteration_time_s)} "
            f"(critical class {result.critical_class})")


# ---------------------------------------------------------------------------- breakdown parts
def _breakdown_parts(results: list[Result]) -> dict[str, list[float]]:
    """Part name → value per result, in stacking order; parts zero in every result omitted."""
    kinds: list[str] = []
    for r in results:
        kinds += [k for k in r.breakdown.exposed_comm_s if k not in kinds]
    parts = {"compute": [r.breakdown.compute_s for r in results],
             "optimizer": [r.breakdown.optimizer_s for r in results]}
    for k in _sorted(kinds):
        parts[f"exposed {k}"] = [r.breakdown.exposed_comm_s.get(k, 0.0) for r in results]
    parts["bubble"] = [r.breakdown.bubble_s for r in results]
    parts["host"] = [r.breakdown.host_s for r in results]
    return {k: v for k, v in parts.items() if any(v)}


def _default_labels(results: list[Result]) -> list[str]:
    return [" · ".join(x for x in (_model_name(r), r.engine) if x) or f"result {i + 1}"
            for i, r in enumerate(results)]


def _save(fig, path, force: bool, what: str) -> None:
    if path is None:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    suffix = Path(str(path)).suffix.lower().lstrip(".")
    buf = io.BytesIO()
    fig.savefig(buf, format=suffix if suffix in ("pdf", "svg") else "png", dpi=120)
    write_output(path, buf.getvalue(), force=force, what=what)

"""How a :class:`~ddlsim.simulator.result.Result` shows itself: a one-line ``repr`` and, in
Jupyter, a compact HTML table with the breakdown as a stacked bar (``_repr_html_``)."""

from __future__ import annotations

from html import escape
from typing import Any

from ..formatting import format_bytes, format_count, format_percent, format_time

__all__ = ["result_repr", "result_html", "breakdown_parts"]

#: Colours of the breakdown's parts (the same hues as ddlsim.plots' bars).
_COLOURS = {"compute": "#4c72b0", "optimizer": "#8172b3", "dp": "#dd8452", "tp": "#55a868",
            "pp": "#c44e52", "ep": "#937860", "cp": "#da8bc3", "bubble": "#bbbbbb",
            "host": "#8c8c8c"}


def breakdown_parts(r: Any) -> list[tuple[str, float]]:
    """``(name, seconds)`` of the parts that add up to the iteration time, non-zero ones only:
    compute, optimizer, exposed communication per group kind, pipeline bubble, the wait for
    the host."""
    b = r.breakdown
    parts = [("compute", b.compute_s), ("optimizer", b.optimizer_s),
             *((f"exposed {k}", v) for k, v in sorted(b.exposed_comm_s.items())),
             ("bubble", b.bubble_s), ("host", b.host_s)]
    return [(name, float(v)) for name, v in parts if v > 0]


def _names(r: Any) -> tuple[str, str]:
    cfg = r.config or {}
    model = (cfg.get("model") or {}).get("name") or "model"
    system = (cfg.get("system") or {}).get("name") or "system"
    return str(model), str(system)


def result_repr(r: Any) -> str:
    """``<Result analytical: 812 ms per iteration, 9 ranks, MFU 3.29%, 1.89 GiB per device
    (fits); gpt2-124m on cpu-10gbe>``: what a result is, in one line."""
    model, system = _names(r)
    memory = ("memory unknown" if r.memory is None else f"{format_bytes(r.memory.total)} per "
              f"device ({'fits' if r.fits else 'DOES NOT FIT'})")
    return (f"<Result {r.engine}: {format_time(r.iteration_time_s)} per iteration, "
            f"{r.world_size:,} ranks, MFU {format_percent(r.mfu)}, {memory}; {model} on "
            f"{system}>")


def result_html(r: Any) -> str:
    """A compact HTML table of ``r`` (time, rates, memory) and its breakdown as a stacked
    bar whose segments are the parts' shares of the iteration time."""
    model, system = _names(r)
    rows = [("iteration", format_time(r.iteration_time_s)),
            ("tokens/s", format_count(r.tokens_per_s)), ("MFU", format_percent(r.mfu)),
            ("memory per device", "unknown" if r.memory is None else
             f"{format_bytes(r.memory.total)} of {format_bytes(r.memory.capacity)}"
             + ("" if r.fits else " — DOES NOT FIT")),
            ("ranks", f"{r.world_size:,}")]
    cells = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th>"
                    f"<td style='text-align:right'>{escape(v)}</td></tr>" for k, v in rows)
    total = max(r.iteration_time_s, 1e-300)
    bar, legend = [], []
    for name, seconds in breakdown_parts(r):
        colour = _COLOURS.get(name.removeprefix("exposed "), "#999999")
        share = 100 * seconds / total
        label = escape(f"{name}: {format_time(seconds)} ({share:.1f}%)")
        bar.append(f"<div title='{label}' style='width:{share:.3f}%;background:{colour};"
                   "height:100%'></div>")
        legend.append(f"<span style='color:{colour}'>&#9632;</span> {label}")
    return (f"<div><b>{escape(r.engine)}</b>: {escape(model)} on {escape(system)}"
            f"<table>{cells}</table>"
            "<div style='display:flex;width:24em;height:0.9em;border:1px solid #888'>"
            f"{''.join(bar)}</div><div style='font-size:85%'>{' &nbsp; '.join(legend)}</div>"
            "</div>")

"""Human-readable reports of results (rich tables), and the strict JSON every result is
saved as. Every number goes through :mod:`ddlsim.formatting`."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .config import RunConfig
from .errors import DDLSimError
from .formatting import (format_bandwidth, format_bytes, format_change, format_count,
                         format_flops, format_percent, format_time)
from .simulator.result import Result
from .workloads.memory import PARTS as _MEMORY_PARTS

__all__ = ["render_results", "group_links", "dumps_json", "find_non_finite", "displayed",
           "RESIDUE"]

#: Parts of the iteration below this fraction of it are shown as 0 (and their rows hidden):
#: floating-point residues of summed times, far below any modelled effect.
RESIDUE = 1e-9


def find_non_finite(obj: Any, path: str = "") -> tuple[str, float] | None:
    """The first ``(dotted key, value)`` in ``obj`` that is a NaN or an infinity, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "(top level)", obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(
        obj, (list, tuple)) else ()
    for k, v in items:
        found = find_non_finite(v, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def dumps_json(payload: Any) -> str:
    """``payload`` as indented JSON text ending with a newline; never ``Infinity``/``NaN``.

    Raises
    ------
    DDLSimError
        Naming the first key whose value is not finite.
    """
    bad = find_non_finite(payload)
    if bad:
        raise DDLSimError(f"the result holds a non-finite number at {bad[0]} ({bad[1]}), which "
                          "JSON cannot carry; an input value is infinite or out of range")
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"


def _header(console: Console, cfg: RunConfig) -> None:
    s = cfg.system
    console.print(f"[bold]{escape(cfg.family.summary(cfg.model))}[/]", highlight=False)
    console.print(f"on {s.nodes}×{s.devices_per_node} {escape(s.device.name)} "
                  f"({escape(s.name)}) — {escape(cfg.family.plan_summary(cfg))}",
                  highlight=False)
    from .planinfo import kernels_line   # what the software stack switches on and off
    line = kernels_line(cfg)
    if line:
        console.print(escape(line), highlight=False)
    from .stackrules import what_if_note
    note = what_if_note(cfg)   # set only under system.software.what_if (else refused)
    if note:
        console.print(f"[bold yellow]WHAT-IF:[/] {escape(note.removeprefix('what-if: '))} "
                      "(system.software.what_if: true)", highlight=False)


def _iteration_table(results: Sequence[Result]) -> Table:
    main = Table(title="Iteration", title_justify="left")
    main.add_column("")
    for r in results:
        main.add_column(r.engine, justify="right")
    if len(results) == 2:
        main.add_column("des − analytical", justify="right")

    def row(label: str, values: list[float], fmt) -> None:
        cells = [fmt(v) for v in values]
        if len(values) == 2:
            cells.append(format_change(values[1], values[0]))
        main.add_row(label, *cells)

    row("iteration time", [r.iteration_time_s for r in results], format_time)
    if any(r.interval_s for r in results):
        main.add_row("  95% interval", *[f"{format_time(r.interval_s[0])} – "
                                          f"{format_time(r.interval_s[1])}" if r.interval_s
                                          else "" for r in results])
    row("samples/s", [r.samples_per_s for r in results], format_count)
    row("tokens/s", [r.tokens_per_s for r in results], format_count)
    row("MFU", [r.mfu for r in results], format_percent)
    row("FLOP/s per device", [r.flops_per_device for r in results], format_flops)
    return main


def _breakdown_table(results: Sequence[Result]) -> Table:
    bd = Table(title="Where the time goes (critical rank)", title_justify="left")
    bd.add_column("part")
    for r in results:
        bd.add_column(r.engine, justify="right")
        bd.add_column("share", justify="right")
    parts = [("compute", lambda r: r.breakdown.compute_s),
             ("optimizer step", lambda r: r.breakdown.optimizer_s)]
    kinds = sorted({k for r in results for k in r.breakdown.exposed_comm_s})
    parts += [(f"exposed comm: {k}", (lambda k: lambda r: r.breakdown.exposed_comm_s.get(k, 0.0))(k))
              for k in kinds]
    parts.append(("pipeline bubble / wait", lambda r: r.breakdown.bubble_s))
    parts.append(("waiting for the host", lambda r: r.breakdown.host_s))
    for label, get in parts:
        shown = [displayed(get(r), r.iteration_time_s) for r in results]
        if not any(shown):
            continue
        cells = []
        for r, v in zip(results, shown):
            share = v / r.iteration_time_s if r.iteration_time_s else 0.0
            cells += [format_time(v), format_percent(share)]
        bd.add_row(label, *cells)
    return bd


def displayed(part_s: float, iteration_s: float) -> float:
    """``part_s`` as the report shows it: 0 when below :data:`RESIDUE` of the iteration
    (the rounding residue of a sum of times, e.g. a bubble of 1.7e-18 s in 94 ms)."""
    return 0.0 if abs(part_s) < RESIDUE * iteration_s else part_s


def _comm_table(cfg: RunConfig, results: Sequence[Result]) -> Table:
    """Bytes per device and iteration of every group kind with bytes in any result."""
    cm = Table(title="Communication per device and iteration", title_justify="left")
    cm.add_column("group")
    for r in results:
        cm.add_column("bytes" if len(results) == 1 else f"bytes ({r.engine})", justify="right")
    labels = cfg.family.group_labels(cfg)
    kinds = [k for r in results for k, v in r.comm_bytes.items() if v]
    for k in dict.fromkeys(kinds):
        cm.add_row(escape(labels.get(k, k)),
                   *[format_bytes(r.comm_bytes.get(k, 0.0)) for r in results])
    return cm


def _memory_table(cfg: RunConfig, r: Result) -> Table:
    from .api import memory_owner

    mem = Table(title=f"Memory per device ({memory_owner(cfg, r.memory)})",
                title_justify="left")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    for k in _MEMORY_PARTS:
        if k == "context":  # what the caching allocator holds (max_memory_reserved), then
            mem.add_row("reserved", format_bytes(r.memory.reserved))  # what it does not
        mem.add_row(k, format_bytes(getattr(r.memory, k)))
    mark = "" if r.fits else " [bold red]✗ does not fit[/]"
    mem.add_row("[bold]total[/]", f"[bold]{format_bytes(r.memory.total)}[/]{mark}")
    mem.add_row("capacity", format_bytes(r.memory.capacity))
    return mem


def _fit_banner(console: Console, r: Result) -> None:
    if not r.fits:
        console.print(f"[bold red]DOES NOT FIT:[/] {format_bytes(r.memory.total)} per device "
                      f"against a capacity of {format_bytes(r.memory.capacity)} (predicted with "
                      "--allow-oom; fits: false)", highlight=False)


def render_results(console: Console, cfg: RunConfig, results: list[Result], links: int = 0) -> None:
    """Print ``results`` (one engine, or analytical and DES side by side) as tables.

    Parameters
    ----------
    console : where to print.
    cfg : the run config the results predict.
    results : one or two results of the same config.
    links : rows of the busiest-links table (groups of identical links), DES results only.
    """
    _header(console, cfg)
    _fit_banner(console, results[0])
    console.print(_iteration_table(results))
    console.print(_breakdown_table(results))
    r = results[0]
    console.print(_comm_table(cfg, results))
    console.print(_memory_table(cfg, r))
    if r.algorithms:
        al = Table(title="Collective algorithms chosen", title_justify="left")
        al.add_column("group.op[size]")
        al.add_column("algorithm / backend")
        for k, v in sorted(r.algorithms.items()):
            al.add_row(escape(k), escape(v))
        console.print(al)
    _backend_notes(console, results)
    for res in results:
        if links and res.links:
            console.print(links_table(res, links))


def _backend_notes(console: Console, results: Sequence[Result]) -> None:
    for res in results:
        single = res.extra.get("single_backend_time_s")
        if single:
            parts = ", ".join(f"{b} alone {format_time(t)}" for b, t in sorted(single.items()))
            gain = format_percent(res.extra["gain_over_best_single_backend"])
            console.print(f"Backend mix ({res.engine}): {format_time(res.iteration_time_s)} with "
                          f"the fastest backend per operation; {escape(parts)}; gain over the "
                          f"best single backend {gain}", highlight=False)
        if res.extra.get("interval_note"):
            console.print(f"[dim]{escape(str(res.extra['interval_note']))}[/]", highlight=False)


def _tier(link: str) -> str:
    """Where a link ``u->v`` lies: ``in node``, ``node→fabric``, ``fabric→node`` or ``fabric``
    (vertices inside a node are named ``node<i>/…``, see :mod:`ddlsim.topologies.build`)."""
    u, _, v = link.partition("->")
    inside_u, inside_v = "/" in u, "/" in v
    if inside_u and inside_v:
        return "in node"
    if inside_u:
        return "node→fabric"
    if inside_v:
        return "fabric→node"
    return "fabric"


_KIND_NAMES = {"nvlink": "NVLink", "pcie": "PCIe", "shm": "shm", "nic": "NIC", "fabric": "fabric"}


def group_links(links: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Links with the same kind, tier, bandwidth, utilisation, busy time and bytes, as one
    group each, busiest first: ``{"kind", "tier", "count", "example", "bandwidth_Bps",
    "busy_s", "utilisation", "bytes"}``."""
    groups: dict[tuple, dict[str, Any]] = {}
    for ln in links:
        name = str(ln["link"])
        key = (ln.get("kind", ""), _tier(name), float(ln["bandwidth_Bps"]),
               round(float(ln["utilisation"]), 9), round(float(ln["busy_s"]), 12),
               round(float(ln["bytes"])))
        g = groups.get(key)
        if g is None:
            groups[key] = {"kind": key[0], "tier": key[1], "count": 1, "example": name,
                           "bandwidth_Bps": key[2], "busy_s": float(ln["busy_s"]),
                           "utilisation": float(ln["utilisation"]), "bytes": float(ln["bytes"])}
        else:
            g["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["utilisation"], -g["bytes"], g["example"]))


def links_table(result: Result, rows: int) -> Table:
    """The ``rows`` busiest groups of identical links of a DES result."""
    groups = group_links(result.links)
    lt = Table(title=f"Busiest links ({result.engine}), identical links grouped",
               title_justify="left")
    for col in ("links", "count", "util.", "bandwidth", "busy", "bytes"):
        lt.add_column(col, justify="left" if col == "links" else "right", no_wrap=True)
    for g in groups[:rows]:
        kind = _KIND_NAMES.get(g["kind"], g["kind"])
        where = kind if kind == g["tier"] else f"{kind}, {g['tier']}"
        lt.add_row(where, f"×{g['count']}", format_percent(g["utilisation"]),
                   format_bandwidth(g["bandwidth_Bps"]), format_time(g["busy_s"]),
                   format_bytes(g["bytes"]))
    if len(groups) > rows:
        lt.caption = f"{len(groups) - rows} more group(s) of {len(result.links)} links in all"
    return lt

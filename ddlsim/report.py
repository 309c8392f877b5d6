"""Human-readable reports of results (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .config import RunConfig
from .simulator.result import Result
from .units import format_bytes, format_time

__all__ = ["render_results"]


def _pct(x: float, total: float) -> str:
    return f"{100 * x / total:5.1f}%" if total else ""


def render_results(console: Console, cfg: RunConfig, results: list[Result], links: int = 0) -> None:
    p, t, s = cfg.parallel, cfg.train, cfg.system
    console.print(
        f"[bold]{cfg.model.name}[/] on {s.nodes}×{s.devices_per_node} {s.device.name} "
        f"({s.name}) — TP{p.tp} × PP{p.pp}{f'(v{p.vpp})' if p.vpp > 1 else ''} × DP{cfg.dp} = "
        f"{cfg.world_size} ranks, {p.schedule}, ZeRO-{p.zero_stage}, dp_strategy {p.dp_strategy}, "
        f"micro-batch {t.micro_batch_size} × {cfg.num_microbatches} per replica, "
        f"global batch {t.global_batch_size}, seq {t.seq_length}, {t.dtype}, recompute {t.recompute}",
        highlight=False)
    main = Table(title="Iteration", title_justify="left")
    main.add_column("")
    for r in results:
        main.add_column(r.engine, justify="right")
    if len(results) == 2:
        main.add_column("des − analytical", justify="right")

    def row(label: str, values: list[float], fmt, diff: bool = True) -> None:
        cells = [fmt(v) for v in values]
        if len(values) == 2:
            a, d = values
            cells.append(f"{100 * (d - a) / a:+.1f}%" if diff and a else "")
        main.add_row(label, *cells)

    row("iteration time", [r.iteration_time_s for r in results], format_time)
    if results[0].interval_s:
        main.add_row("  95% interval", *[f"{format_time(r.interval_s[0])} – {format_time(r.interval_s[1])}"
                                          if r.interval_s else "" for r in results])
    row("samples/s", [r.samples_per_s for r in results], lambda v: f"{v:,.1f}")
    row("tokens/s", [r.tokens_per_s for r in results], lambda v: f"{v:,.0f}")
    row("MFU", [r.mfu for r in results], lambda v: f"{100 * v:.1f}%")
    row("TFLOP/s per device", [r.tflops_per_device for r in results], lambda v: f"{v:.1f}")
    console.print(main)

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
    for label, get in parts:
        if all(get(r) == 0 for r in results):
            continue
        cells = []
        for r in results:
            cells += [format_time(get(r)), _pct(get(r), r.iteration_time_s)]
        bd.add_row(label, *cells)
    console.print(bd)

    r = results[0]
    cm = Table(title="Communication per device and iteration", title_justify="left")
    cm.add_column("group")
    cm.add_column("bytes", justify="right")
    for k, v in r.comm_bytes.items():
        if v:
            cm.add_row(k, format_bytes(v))
    mem = Table(title=f"Memory per device (pipeline stage {r.memory.stage})", title_justify="left")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    for k in ("weights", "gradients", "optimizer", "activations", "other"):
        mem.add_row(k, format_bytes(getattr(r.memory, k)))
    mem.add_row("[bold]total[/]", f"[bold]{format_bytes(r.memory.total)}[/]")
    mem.add_row("capacity", format_bytes(r.memory.capacity))
    console.print(cm)
    console.print(mem)
    if r.algorithms:
        al = Table(title="Collective algorithms chosen", title_justify="left")
        al.add_column("group.op[size]")
        al.add_column("algorithm / backend")
        for k, v in sorted(r.algorithms.items()):
            al.add_row(k, v)
        console.print(al)
    for res in results:
        single = res.extra.get("single_backend_time_s")
        if single:
            parts = ", ".join(f"{b} alone {format_time(t)}" for b, t in sorted(single.items()))
            console.print(f"Backend mix ({res.engine}): {format_time(res.iteration_time_s)} with the "
                          f"fastest backend per operation; {parts}; gain over the best single "
                          f"backend {100 * res.extra['gain_over_best_single_backend']:.1f}%",
                          highlight=False)
        if res.extra.get("interval_note"):
            console.print(f"[dim]{res.extra['interval_note']}[/]", highlight=False)
    for res in results:
        if links and res.links:
            lt = Table(title=f"Busiest links ({res.engine})", title_justify="left")
            for col in ("link", "kind", "bandwidth", "busy", "utilisation", "bytes"):
                lt.add_column(col, justify="right" if col != "link" else "left")
            for ln in res.links[:links]:
                lt.add_row(str(ln["link"]), str(ln.get("kind", "")),
                           f"{ln['bandwidth_Bps'] / 1e9:.2f} GB/s", format_time(ln["busy_s"]),
                           f"{100 * ln['utilisation']:.1f}%", format_bytes(ln["bytes"]))
            console.print(lt)

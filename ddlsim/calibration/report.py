"""Show a profile: a rich table of the fitted segments and a log-log plot per operation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.table import Table

from ..figio import save_figure
from ..formatting import format_bytes
from .outputs import guard_output
from .profile import CalibrationProfile, CommEntry
from .schema import OPS, CalibrationError, busbw_factor

__all__ = ["comm_table", "compute_table", "plot_profile"]


def _with_ci(value: str, ci: str | None) -> str:
    return f"{value}\n[dim]{ci}[/]" if ci else value


def _gbps(beta: float) -> str:
    """1/β in GB/s (10⁹ B/s), 3 significant digits."""
    return f"{1e-9 / beta:.3g}" if beta > 1e-15 else "∞"


def comm_table(profile: CalibrationProfile) -> Table:
    """One row per segment: which curve, from which size, α (µs) and 1/β (GB/s) with their
    95 % intervals below, and the bus bandwidth f(n)/β comparable with nccl-tests' busbw."""
    t = Table(title="Communication: t = α + β·S per segment")
    for col in ("curve", "from", "α µs", "1/β GB/s", "busbw GB/s", "err"):
        t.add_column(col, justify="left" if col == "curve" else "right", no_wrap=True)
    for e in profile.doc.comm:
        name = f"{e.backend} {e.op}{' stream' if e.variant else ''}\n{e.scope} " \
               f"{e.ranks}r/{e.nodes}n"
        f = busbw_factor(e.op, e.ranks)
        for i, s in enumerate(e.segments):
            a_ci = (f"{s.alpha_ci_s[0] * 1e6:.3g}–{s.alpha_ci_s[1] * 1e6:.3g}"
                    if s.alpha_ci_s else None)
            b_ci = (f"{_gbps(s.beta_ci_s_per_B[1])}–{_gbps(s.beta_ci_s_per_B[0])}"
                    if s.beta_ci_s_per_B else None)
            t.add_row(name if i == 0 else "", format_bytes(s.min_bytes),
                      _with_ci(f"{s.alpha_s * 1e6:.3g}", a_ci),
                      _with_ci(_gbps(s.beta_s_per_B), b_ci),
                      _gbps(s.beta_s_per_B / f) if f > 0 else "—",
                      f"{s.rel_rmse:.1%}" if s.rel_rmse is not None else "—")
    return t


def compute_table(profile: CalibrationProfile) -> Table:
    """One row per compute fit: R_max, x_half, η_max when the peak is known."""
    t = Table(title="Compute: R(x) = R_max · x/(x + x_half), x = FLOPs per call")
    for col in ("backend", "device", "kind", "dtype", "R_max", "x_half", "η_max", "rel. RMSE"):
        t.add_column(col)
    for c in profile.doc.compute:
        eta = (f"{100 * c.rate_max_flops_per_s / c.peak_flops_per_s:.3g}%" if c.peak_flops_per_s
               else "—")
        t.add_row(c.backend, c.device, c.kind, c.dtype,
                  f"{c.rate_max_flops_per_s / 1e12:.3g} TFLOP/s", f"{c.x_half_flops:.3g} FLOP",
                  eta, f"{c.rel_rmse:.1%}" if c.rel_rmse is not None else "—")
    return t


def _curves(e: CommEntry) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each segment's line over its size range (the last one to 8 GiB without points)."""
    sizes = [b for b in (e.points.bytes if e.points else []) if b > 0]
    top = max(sizes + [s.max_bytes or 0 for s in e.segments]) or 2.0 ** 33
    starts = [max(s.min_bytes, 1.0) for s in e.segments] + [max(top, 2.0)]
    out = []
    for s, lo, hi in zip(e.segments, starts[:-1], starts[1:]):
        x = np.geomspace(lo, max(hi, lo * 1.01), 50)
        out.append((x, s.alpha_s + s.beta_s_per_B * x))
    return out


def plot_profile(profile: CalibrationProfile, path: str | Path, force: bool = False) -> Path:
    """Measured points against fitted curves, log-log, one panel per operation; PNG/PDF/SVG."""
    from matplotlib.figure import Figure  # object API: no pyplot state, no backend switch

    out = guard_output(path, force)
    ops = [op for op in OPS if any(e.op == op for e in profile.doc.comm)]
    if not ops:
        raise CalibrationError("the profile has no communication entries to plot")
    cols = min(3, len(ops))
    rows = -(-len(ops) // cols)
    fig = Figure(figsize=(5 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, op in zip(axes.flat, ops):
        for j, e in enumerate(x for x in profile.doc.comm if x.op == op):
            color = f"C{j % 10}"
            label = f"{e.backend} {e.scope} {e.ranks}r/{e.nodes}n" + (" stream" if e.variant
                                                                      else "")
            if e.points:
                pts = [(b, t) for b, t in zip(e.points.bytes, e.points.time_s) if b > 0]
                ax.scatter(*zip(*pts), s=10, color=color, alpha=0.6) if pts else None
            for k, (x, y) in enumerate(_curves(e)):
                ax.plot(x, y, color=color, label=label if k == 0 else None)
        ax.set(xscale="log", yscale="log", title=op, xlabel="message size (B)",
               ylabel="time (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, out, force=force, what="plot file")
    return out

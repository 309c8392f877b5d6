"""``ddlsim search CONFIG``: the vectorised tier over a grid of plans, the best re-checked exactly.

Registered on the main app by :func:`register` (two lines in :mod:`ddlsim.cli`); everything
heavy is imported when the command runs, so the CLI's cold start does not pay for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cliutil import (OptionError, check_dask_workers, check_outputs, guarded,
                      refuse_overwriting_inputs, require)

__all__ = ["register", "search_command", "StageProgress"]

FORMATS = ("table", "json", "csv")
OBJECTIVES = ("time", "tokens_per_s", "mfu", "cost")


class StageProgress:
    """A rich progress bar on stderr per stage (``evaluate``, ``verify``), shown once a stage
    has run for ``delay_s``; call it with (stage, done, total)."""

    def __init__(self, delay_s: float = 1.0):
        self.delay_s = delay_s
        self.start: dict[str, float] = {}
        self.bar = None
        self.tasks: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        self.start.setdefault(stage, now)
        if stage not in self.tasks:
            if now - self.start[stage] < self.delay_s and done < total:
                return
            if done >= total and now - self.start[stage] < self.delay_s:
                return
            if self.bar is None:
                from rich.console import Console
                from rich.progress import Progress

                self.bar = Progress(console=Console(stderr=True), transient=True)
                self.bar.start()
            label = {"evaluate": "evaluating plans", "verify": "exact re-evaluation"}[stage]
            self.tasks[stage] = self.bar.add_task(label, total=total)
        self.bar.update(self.tasks[stage], completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def search_command(
    config: Annotated[Path, typer.Argument(help="Run config with a search: section (YAML/JSON).")],
    top: Annotated[Optional[int], typer.Option(
        help="Plans re-evaluated by the exact engine and shown (default: the section's, 10).")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="Write every evaluated plan: CSV, Parquet (.parquet) or JSON (.json).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        help="Draw the Pareto front of time against memory and the best plan's breakdown (PNG).")] = None,
    verify: Annotated[Optional[str], typer.Option(
        help="Also run the DES on the top plans: des.")] = None,
    axis: Annotated[Optional[list[str]], typer.Option(
        "--axis", help="PATH=VALUES, as sweep's --set-range; replaces the section's axes.")] = None,
    objective: Annotated[Optional[str], typer.Option(
        help="time, tokens_per_s, mfu or cost (needs --price-per-gpu-hour).")] = None,
    price_per_gpu_hour: Annotated[Optional[float], typer.Option(
        help="Price of one GPU for one hour: adds cost columns.")] = None,
    currency: Annotated[Optional[str], typer.Option(
        help="What --price-per-gpu-hour is in (default: the section's, USD).")] = None,
    max_gpus: Annotated[Optional[int], typer.Option(help="Most GPUs a plan may use.")] = None,
    allow_oom: Annotated[bool, typer.Option(
        help="Keep plans over device memory (must_fit: false).")] = False,
    overrides: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override a field of the base config.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json or csv (all plans)")] = "table",
    force: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
    dask: Annotated[Optional[str], typer.Option(
        help="Run the exact re-evaluations, and a grid the exact engine searches (no "
             "vectorised form), on Dask: 'local' or a scheduler address.")] = None,
    dask_workers: Annotated[Optional[int], typer.Option(
        help="Worker processes of --dask local (default 2).")] = None,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="Raise a work budget, e.g. --limit search_plans=2e7 (names: "
                        "search_plans, axis_values, and predict's for the exact and DES "
                        "re-evaluations: ranks, topology_links, des_rank_ops, …).")] = None,
    width: Annotated[Optional[int], typer.Option(
        help="Characters per line of the tables (default: the terminal's, 80 when piped).")] = None,
) -> None:
    """Search the plans of CONFIG's search: section: enumerate, reject invalid plans (counted
    per reason), evaluate the rest as arrays, rank, re-evaluate the top K exactly."""
    from . import sweepreport
    from .limits import Limits
    from .search import run as search_run
    from .search import report

    require(fmt in FORMATS, f"--format {fmt!r} is not allowed; choose from {', '.join(FORMATS)}")
    require(objective is None or objective in OBJECTIVES,
            f"--objective {objective!r} is not allowed; choose from {', '.join(OBJECTIVES)}")
    require(verify in (None, "des"), f"--verify {verify!r} is not allowed; choose des")
    require(dask_workers is None or dask == "local",
            "--dask-workers applies only with --dask local")
    check_dask_workers(dask_workers)
    require(not force or output is not None or plot is not None,
            "--force lets an output file be replaced, but no output file is named (-o, --plot)")
    sweepreport.check_frame_output(output)
    refuse_overwriting_inputs([config], output=output, plot=plot)
    check_outputs(force, output=output, plot=plot)
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise OptionError(f"--plot needs matplotlib, which cannot be imported ({exc})") from None
    limits = Limits.from_strings(limit)
    axes = None
    if axis:
        from .sweeps import parse_ranges
        axes = parse_ranges(axis, "--axis", limits)
    constraints = {}
    if max_gpus is not None:
        constraints["max_gpus"] = max_gpus
    if allow_oom:
        constraints["must_fit"] = False
    bar = StageProgress()
    try:
        frame = search_run.search(config, axes, constraints=constraints or None,
                                  objective=objective, price_per_gpu_hour=price_per_gpu_hour,
                                  top=top, verify=verify, overrides=overrides or [],
                                  dask=dask, dask_workers=dask_workers, progress=bar,
                                  limits=limits, currency=currency)
    finally:
        bar.close()
    if output is not None:
        sweepreport.write_frame(report.plan_text_frame(frame), output, force)
    if plot is not None and len(frame):
        report.draw_search(frame, _best_result(config, frame, overrides or [], limits), plot,
                           force)
    _show(frame, fmt, width)


def _best_result(config: Path, frame, overrides: list[str], limits):
    """The exact result of the best plan (for the breakdown panel)."""
    from .api import predict
    from .configload import build_config
    from .search.run import plan_overrides, load_search

    data, base_dir, _ = load_search(config, limits)
    columns = [c for c in frame.columns if "." in c]
    cfg = build_config(data, [*overrides, *plan_overrides(frame.iloc[0], columns)], base_dir)
    return predict(cfg, check_fit=False, limits=limits)


def _show(frame, fmt: str, width: int | None = None) -> None:
    from rich.console import Console

    from .search import report
    from .sweepreport import frame_text
    from .textio import write_output

    if fmt != "table":
        write_output("-", frame_text(report.plan_text_frame(frame), fmt),
                     what="standard output")
        err = Console(stderr=True, highlight=False)
        err.print(report.summary_text(frame, err.width))
        return
    require(width is None or width >= 40, f"--width {width} is too narrow for a table; give "
                                          "40 or more")
    out = Console(width=width)
    if len(frame):
        out.print(report.ranked_table(frame, max(frame.attrs.get("top", 10), 1), out.width))
        out.print(report.pareto_table(frame, width=out.width))
    out.print(report.summary_text(frame, out.width), highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``search`` to ``app`` (wrapped by :func:`ddlsim.cliutil.guarded`)."""
    app.command("search")(guarded(search_command))

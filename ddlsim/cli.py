"""The ``ddlsim`` command line: predict, compare, comm, sweep, search, presets, topology, calibrate.

Every command answers a bad input or option with one ``error:`` paragraph and exit status 2
(:func:`ddlsim.cliutil.guarded`); an option that does not apply with the others is refused,
never ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ._version import __version__
from .clioutput import (csv_text, emit, out, prediction_payload, recording_console,
                        table_console, table_text)
from .cliutil import (OnceGroup, OptionError, check_outputs, guarded, refuse_negative,
                      refuse_overwriting_inputs, require, warn_unused_devices,
                      check_dask_workers)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  cls=OnceGroup, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Predict how long one training iteration takes on a cluster, and why.")
FORMATS = ("table", "json", "csv")
ENGINES = ("analytical", "des", "both")

Sets = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a field, e.g. --set parallel.tensor_model_parallel_size=4, or "
                  "replace a section by a preset, e.g. --set model=llama-3-70b")]
Engine = Annotated[str, typer.Option(help="analytical, des, or both")]
Format = Annotated[str, typer.Option("--format", "-f", help="table, json or csv")]
Output = Annotated[Optional[Path], typer.Option("-o", "--output",
                                                help="Write the result here ('-': stdout).")]
Force = Annotated[bool, typer.Option(help="Replace existing output files.")]
Calibration = Annotated[Optional[Path], typer.Option(help="Calibration profile (YAML).")]
Backend = Annotated[Optional[str], typer.Option(
    help="With --calibration: backend to use, or 'auto' for the fastest per operation.")]
AllowOOM = Annotated[bool, typer.Option(
    help="Predict even if the plan exceeds device memory (the result says fits: false).")]
Width = Annotated[Optional[int], typer.Option(
    help="Characters per line of the table (default: the terminal's, 80 when piped).")]
LimitOption = Annotated[Optional[list[str]], typer.Option(
    "--limit", help="Raise a work budget, e.g. --limit des_rank_ops=1e8 (names: "
                    "pipeline_steps, ranks, topology_links, trace_ops, des_rank_ops, sweep_runs, "
                    "search_plans, axis_values; docs/robustness.md).")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddlsim {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", "-V", help="Print the version and exit.", is_eager=True,
        callback=_version)] = False) -> None:
    """Predict how long one training iteration takes on a cluster, and why."""


def check_choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse ``value`` for ``option`` unless it is one of ``allowed``."""
    require(value in allowed, f"{option} {value!r} is not allowed; choose from "
                              f"{', '.join(allowed)}")


def _check_predict_options(fmt: str, engine: str, backend, calibration, trace, links,
                           timeline) -> None:
    """Refuse option values and combinations of ``predict`` that would be ignored."""
    check_choice("--format", fmt, FORMATS)
    check_choice("--engine", engine, ENGINES)
    refuse_negative(links=links)
    des = engine in ("des", "both")
    require(trace is None or des, "--trace needs --engine des or --engine both: the analytical "
                                  "engine records no network flows")
    require(links is None or des, "--links needs --engine des or --engine both: only the DES "
                                  "measures each link")
    require(links is None or fmt == "table", f"--links sets the rows of the busiest-links table, "
            f"which only --format table prints; --format {fmt} always holds every link")
    require(backend is None or calibration is not None,
            "--backend needs --calibration: it picks a backend of the calibration profile")
    require(timeline is None or engine != "both", "--timeline draws one engine's timeline; "
            "with it choose --engine analytical or --engine des, not both")


def _check_force(force: bool, **paths) -> None:
    """Check the output paths now; refuse ``--force`` when there is no file to replace."""
    names = ", ".join("-o" if k == "output" else f"--{k}" for k in paths)
    require(not force or any(p not in (None, Path("-")) for p in paths.values()),
            f"--force lets an output file be replaced, but no output file is named ({names})")
    check_outputs(force, **paths)


def run_predictions(cfg, engines: list[str], *, calibration, backend, allow_oom: bool,
                    trace: Path | None = None, force: bool = False,
                    record_spans: bool = False, **predict_options) -> list:
    """One result per engine of ``cfg`` (DES options only for the DES); ``predict_options``
    go to :func:`ddlsim.api.predict` for every engine."""
    from .api import predict as run_predict

    warn_unused_devices(cfg)
    results = []
    for e in engines:
        opts = {"trace_path": trace, "force": force} if e == "des" and trace is not None else {}
        if e == "des":   # an estimate before a long run, a progress bar during it (stderr)
            from .simulator.des.progress import ConsoleProgress
            opts["progress"] = ConsoleProgress()
        results.append(run_predict(cfg, e, calibration=calibration, backend=backend,
                                   check_fit=not allow_oom, record_spans=record_spans,
                                   **predict_options, **opts))
    return results


def _plots(*paths: Path | None):
    """``ddlsim.plots`` when a picture is asked for (matplotlib is imported only then), so a
    missing library is reported before a long run; None otherwise."""
    if all(p is None for p in paths):
        return None
    try:
        from . import plots
    except ImportError as exc:
        raise OptionError(f"drawing needs ddlsim.plots and matplotlib, which cannot be "
                          f"imported here ({exc})") from None
    return plots


@app.command()
@guarded
def predict(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or JSON).")],
    fmt: Format = "table",
    output: Output = None,
    overrides: Sets = None,
    engine: Engine = "analytical",
    calibration: Calibration = None,
    backend: Backend = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="DES: write a Chrome/Perfetto trace JSON.")] = None,
    links: Annotated[Optional[int], typer.Option(
        help="DES, table: list the N busiest groups of identical links.")] = None,
    timeline: Annotated[Optional[Path], typer.Option(
        help="Draw the iteration's timeline per rank class (PNG, PDF, SVG).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        help="Draw the breakdown as a stacked bar (PNG, PDF, SVG).")] = None,
    allow_oom: AllowOOM = False,
    force: Force = False,
    limit: LimitOption = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="A HuggingFace config.json (path, or a bundled name such as "
                        "llama-2-70b) replacing CONFIG's model section.")] = None,
) -> None:
    """Predict the iteration time of CONFIG, with its breakdown and memory per device."""
    from .config import load_config
    from .report import dumps_json

    _check_predict_options(fmt, engine, backend, calibration, trace, links, timeline)
    refuse_overwriting_inputs([config, calibration, model], output=output, trace=trace,
                              timeline=timeline, plot=plot)
    _check_force(force, output=output, trace=trace, timeline=timeline, plot=plot)
    plots = _plots(timeline, plot)
    from .limits import Limits

    limits = Limits.from_strings(limit)
    cfg = load_config(config, overrides or [], model=model)
    engines = ["analytical", "des"] if engine == "both" else [engine]
    results = run_predictions(cfg, engines, calibration=calibration, backend=backend,
                              allow_oom=allow_oom, trace=trace, force=force,
                              record_spans=timeline is not None, limits=limits)
    if timeline is not None:
        plots.draw_timeline(results[0], timeline, force=force)
    if plot is not None:
        plots.draw_breakdown(results, plot, labels=[r.engine for r in results], force=force)
    if fmt == "json":
        text = dumps_json(prediction_payload(results))
    elif fmt == "csv":
        text = csv_text(results)
    else:
        text = None
    if text is not None:
        emit(text, output, force)
        return
    from .report import render_results
    if output is None:
        render_results(out, cfg, results, links or 0)
        return
    console = recording_console()
    render_results(console, cfg, results, links or 0)
    emit(console.export_text(), output, force)


@app.command()
@guarded
def compare(
    inputs: Annotated[list[Path], typer.Argument(
        help="Two or more run configs (YAML/JSON), or result JSONs saved by predict -f json.")],
    overrides: Sets = None,
    engine: Annotated[Optional[str], typer.Option(
        help="Configs only: analytical (default), des, or both.")] = None,
    labels: Annotated[Optional[list[str]], typer.Option(
        "--label", help="Name of each input, in order (default: the file names).")] = None,
    fmt: Format = "table",
    output: Output = None,
    plot: Annotated[Optional[Path], typer.Option(
        help="Draw the breakdowns as stacked bars (PNG, PDF, SVG).")] = None,
    calibration: Calibration = None,
    backend: Backend = None,
    allow_oom: AllowOOM = False,
    force: Force = False,
    limit: LimitOption = None,
) -> None:
    """Compare plans side by side: their breakdowns, with absolute and relative differences
    from the first. --set applies to every config compared."""
    from .compare import compare_inputs, render_comparison
    from .limits import Limits

    check_choice("--format", fmt, FORMATS)
    if engine is not None:
        check_choice("--engine", engine, ENGINES)
    require(backend is None or calibration is not None,
            "--backend needs --calibration: it picks a backend of the calibration profile")
    refuse_overwriting_inputs([*inputs, calibration], output=output, plot=plot)
    _check_force(force, output=output, plot=plot)
    plots = _plots(plot)
    runs = compare_inputs(inputs, overrides or [], engine, labels, calibration=calibration,
                          backend=backend, allow_oom=allow_oom,
                          limits=Limits.from_strings(limit))
    if plot is not None:
        plots.draw_breakdown([r for _, r in runs], plot, labels=[lab for lab, _ in runs],
                             force=force)
    text = render_comparison(runs, fmt)
    if output is None and fmt == "table":
        out.print(text)
        return
    emit(text if isinstance(text, str) else table_text(text), output, force)


@app.command()
@guarded
def comm(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or JSON).")],
    overrides: Sets = None,
    fmt: Format = "table",
    per: Annotated[str, typer.Option(
        "--per", help="rank: one row per rank and op; class: one per rank class and op.")] = "rank",
    output: Output = None,
    force: Force = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="A HuggingFace config.json replacing CONFIG's model section.")] = None,
    diff_mpip: Annotated[Optional[Path], typer.Option(
        "--diff-mpip", help="An mpiP report of a real run: print calls and sent bytes per "
                            "rank and call, ddlsim's beside mpiP's; exit 1 if any differ.")] = None,
    iterations: Annotated[int, typer.Option(
        help="With --diff-mpip: iterations the profiled run made.")] = 1,
) -> None:
    """Print one iteration's communication per rank as an MPI profiler (mpiP) reports it:
    calls, send and receive bytes per operation, group, peer and root (docs/comm.md)."""
    from .api import build_workload
    from .commprofile import comm_profile, render_profile
    from .config import load_config

    check_choice("--format", fmt, FORMATS)
    check_choice("--per", per, ("rank", "class"))
    refuse_overwriting_inputs([config, model, diff_mpip], output=output)
    _check_force(force, output=output)
    cfg = load_config(config, overrides or [], model=model)
    workload = build_workload(cfg)
    if diff_mpip is not None:  # docs/comm.md, "Checking a real run against it"
        from .commdiff import diff_report
        text, ok = diff_report(comm_profile(workload, "rank"), diff_mpip, iterations, fmt)
        emit(text, output, force)
        if not ok:
            raise typer.Exit(1)
        return
    frame = comm_profile(workload, per)
    emit(render_profile(frame, fmt, per=per, world_size=workload.world_size), output, force)


@app.command()
@guarded
def sweep(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or JSON).")],
    ranges: Annotated[list[str], typer.Option(
        "--set-range", help="PATH=VALUES: 1,2,4 | '100,200,400 Gb/s' (the last item's unit "
                            "applies to all) | START:STOP[:STEP] inclusive, STEP may be *N.")],
    overrides: Sets = None,
    engine: Engine = "analytical",
    allow_oom: Annotated[bool, typer.Option(help="Plans over device memory are valid.")] = False,
    max_runs: Annotated[Optional[int], typer.Option(
        help="Most combinations allowed (as --limit sweep_runs=N; default 10,000).")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="Write every row: CSV, or Parquet (.parquet) or JSON (.json).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        help="Draw iteration time (and memory) against the first numeric swept field.")] = None,
    fmt: Format = "table",
    force: Force = False,
    dask: Annotated[Optional[str], typer.Option(
        help="Run on Dask: 'local' (a local cluster) or a scheduler address.")] = None,
    dask_workers: Annotated[Optional[int], typer.Option(
        help="Worker processes of --dask local (default 2).")] = None,
    limit: LimitOption = None,
    width: Width = None,
) -> None:
    """Predict every combination of the --set-range values (first range slowest): a table,
    invalid combinations with their reason, counts per reason."""
    from . import sweepreport as report
    from .limits import Limits
    from .sweeps import parse_ranges

    check_choice("--format", fmt, FORMATS)
    check_choice("--engine", engine, ENGINES)
    report.check_frame_output(output)
    refuse_overwriting_inputs([config], output=output, plot=plot)
    _check_force(force, output=output, plot=plot)
    _plots(plot)
    limits = Limits.from_strings(limit)
    require(max_runs is None or limits.sweep_runs == Limits().sweep_runs,
            "--max-runs and --limit sweep_runs= set the same budget; give one")
    parsed = parse_ranges(ranges, limits=limits)
    require(dask_workers is None or dask == "local", "--dask-workers applies only with "
                                                      "--dask local")
    check_dask_workers(dask_workers)
    frame = report.run_with_progress(config, parsed, overrides or [], engine, not allow_oom,
                                     max_runs, dask, dask_workers, limits)
    if output is not None:
        report.write_frame(frame, output, force)
    if plot is not None:
        report.draw_sweep(frame, list(parsed), plot, force)
    report.show(frame, list(parsed), fmt, table_console(width))


from .cligroups import register as _register_groups  # noqa: E402  (presets, topology, calibrate)
from .searchcli import register as _register_search  # noqa: E402  (ddlsim search)
from .hostmemory import keep_freed_memory  # noqa: E402
_register_groups(app)
_register_search(app)


def main() -> None:
    keep_freed_memory()  # the command owns its process: freed C heap stays for the next call
    app()


__all__ = ["app", "main", "run_predictions"]


if __name__ == "__main__":
    main()

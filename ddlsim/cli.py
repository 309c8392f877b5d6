"""The ``ddlsim`` command line: predict, presets, topology, calibrate."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import DDLSimError
from .units import format_bytes, format_time

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Predict how long one training iteration takes on a cluster, and why.")
out = Console()
err = Console(stderr=True)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _write_new(path: Path, text: str, force: bool) -> None:
    """Write ``text`` to ``path`` without overwriting the user's file unless ``force``."""
    if path.exists() and not force:
        raise DDLSimError(f"{path} already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@app.command()
def predict(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or JSON).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="table or json")] = "table",
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the result here.")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override a field, e.g. --set parallel.tensor_model_parallel_size=4")] = None,
    engine: Annotated[str, typer.Option(help="analytical, des, or both")] = "analytical",
    calibration: Annotated[Optional[Path], typer.Option(help="Calibration profile (YAML).")] = None,
    backend: Annotated[Optional[str], typer.Option(
        help="With --calibration: backend to use, or 'auto' for the fastest per operation.")] = None,
    trace: Annotated[Optional[Path], typer.Option(help="DES: write a Chrome/Perfetto trace JSON.")] = None,
    links: Annotated[int, typer.Option(help="DES: list the N busiest links.")] = 0,
    allow_oom: Annotated[bool, typer.Option(help="Predict even if the plan exceeds device memory.")] = False,
    force: Annotated[bool, typer.Option(help="Overwrite existing output files.")] = False,
    limit: Annotated[Optional[list[str]], typer.Option(
        "--limit", help="Raise a work budget, e.g. --limit des_rank_ops=1e8 (names: "
                        "pipeline_steps, ranks, topology_links, trace_ops, des_rank_ops).")] = None,
) -> None:
    """Predict the iteration time of CONFIG, with its breakdown and memory per device."""
    try:
        from .api import predict as run_predict
        from .config import load_config
        from .limits import Limits

        if fmt not in ("table", "json"):
            raise DDLSimError(f"--format {fmt!r} is not a format; allowed: table, json")
        if engine not in ("analytical", "des", "both"):
            raise DDLSimError(f"--engine {engine!r} is not an engine; allowed: analytical, des, both")
        for p in (output, trace):
            if p is not None and p.exists() and not force:
                raise DDLSimError(f"{p} already exists; pass --force to overwrite it")
        limits = Limits.from_strings(limit)
        cfg = load_config(config, overrides or [])
        engines = ["analytical", "des"] if engine == "both" else [engine]
        opts = {"trace_path": trace, "force": force} if "des" in engines else {}
        results = [run_predict(cfg, e, calibration=calibration, backend=backend,
                               check_fit=not allow_oom, limits=limits, **(opts if e == "des" else {}))
                   for e in engines]
    except DDLSimError as exc:
        _fail(exc)
        return
    if fmt == "json":
        payload = results[0].to_dict() if len(results) == 1 else {
            r.engine: r.to_dict() for r in results}
        if len(results) == 2:
            a, d = results
            payload["difference"] = {"iteration_time_s": d.iteration_time_s - a.iteration_time_s,
                                     "relative": d.iteration_time_s / a.iteration_time_s - 1}
        text = json.dumps(payload, indent=2, sort_keys=False)
        if output:
            _write_new(output, text + "\n", force)
        else:
            sys.stdout.write(text + "\n")
        return
    from .report import render_results
    console = Console(record=output is not None, width=110) if output else out
    render_results(console, cfg, results, links)
    if output:
        _write_new(output, console.export_text(), force)


@app.command()
def presets(
    section: Annotated[Optional[str], typer.Argument(help="model, parallel, train or system")] = None,
) -> None:
    """List the presets a config section may name, with their sources."""
    from .presets import SECTIONS, list_presets

    try:
        if section is not None and section not in SECTIONS:
            raise DDLSimError(f"unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
        tables = list_presets(section)
    except DDLSimError as exc:
        _fail(exc)
        return
    for sec, entries in tables.items():
        t = Table(title=f"{sec} presets", title_justify="left")
        t.add_column("name", style="bold")
        t.add_column("summary")
        t.add_column("source", overflow="fold")
        for name, v in entries.items():
            t.add_row(name, _summary(sec, v), str(v.get("source", "")))
        out.print(t)


def _summary(section: str, v: dict) -> str:
    if section == "model":
        return (f"L={v['num_hidden_layers']} h={v['hidden_size']} heads={v['num_attention_heads']} "
                f"V={v['vocab_size']}")
    if section == "system":
        d = v["device"]
        return f"{v['nodes']}×{v['devices_per_node']} {d['name']}, {v['nics_per_node']}×{v['nic']['bandwidth_Bps']} NIC"
    return ", ".join(f"{k}={x}" for k, x in v.items() if k != "source")


def _mount_subapps() -> None:
    from .calibration.cli import app as calibrate_app
    from .topologies.cli import app as topology_app

    app.add_typer(topology_app, name="topology", help="Build, summarise and draw cluster topologies.")
    app.add_typer(calibrate_app, name="calibrate",
                  help="Run microbenchmarks, read existing results, fit cost profiles.")


_mount_subapps()


def main() -> None:
    app()


__all__ = ["app", "main", "format_time", "format_bytes"]


if __name__ == "__main__":
    main()

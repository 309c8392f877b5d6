"""``ddlsim topology show SPEC``: build a topology and print what it holds."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from .. import formatting
from ..errors import DDLSimError

__all__ = ["app", "read_spec"]

app = typer.Typer(help="Clusters as graphs: build, summarise and draw topologies.",
                  no_args_is_help=True, add_completion=False)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


@app.callback()
def _topology() -> None:
    """Clusters as graphs: build, summarise and draw topologies."""


@app.command()
def show(
    spec: str = typer.Argument(..., help="A system preset name (dgx-a100, cpu-10gbe, …) or a "
                                         "YAML file holding a system section or topology spec."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Override the number of nodes."),
    draw_to: Optional[Path] = typer.Option(None, "--draw", help="Also draw the graph to this PNG."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table or json."),
    force: bool = typer.Option(False, help="Replace an existing --draw file."),
    limit: Optional[list[str]] = typer.Option(
        None, "--limit", help="Raise the work budget, e.g. --limit topology_links=1e7."),
) -> None:
    """Build the topology of SPEC and print its summary (devices, links, bisection)."""
    try:
        if draw_to is not None:
            from ..textio import check_output
            check_output(draw_to, force, what="--draw file")
        elif force:
            raise DDLSimError("--force applies to the --draw file; without --draw there is "
                              "nothing to replace")
        data = read_spec(spec)
        if nodes is not None:
            data = _with_nodes(data, nodes)
        from ..limits import Limits, check_topology
        from .build import build_topology
        from .report import draw, summary
        from .spec import parse_spec

        check_topology(parse_spec({"preset": data} if isinstance(data, str) else data),
                       Limits.from_strings(limit))
        topo = build_topology(data)
        info = summary(topo)
        if draw_to is not None:
            draw(topo, draw_to, force=force)
    except (DDLSimError, OSError) as exc:
        Console(stderr=True).print(f"error: {exc}", markup=False, highlight=False, style="red")
        raise typer.Exit(code=2) from None
    console = Console()
    if fmt is OutputFormat.json:
        console.print_json(json.dumps(info))
    else:
        _print_tables(console, info)
    if draw_to is not None:
        console.print(f"drawn to {draw_to}", markup=False)


def read_spec(spec: str) -> str | dict[str, Any]:
    """A preset name as is, or the mapping in the YAML/JSON file ``spec`` (its ``system``
    section when the file is a whole run config), read as :func:`ddlsim.config.read_document`
    reads a run config (bounded, UTF-8, strict YAML)."""
    from ..documents import parse_document
    from ..errors import ConfigError
    from ..textio import read_text

    path = Path(spec)
    if not path.exists() and not path.is_symlink():
        if path.suffix in (".yaml", ".yml", ".json"):
            raise ConfigError(f"topology spec file {spec!r} does not exist")
        return spec
    text = read_text(path, what="topology spec file")
    data = parse_document(text, spec, path.suffix.lower() == ".json")
    if isinstance(data, dict) and "system" in data:
        data = data["system"]
    if not isinstance(data, (dict, str)):
        raise ConfigError(f"{spec!r} must hold a mapping (a system section or topology spec) "
                          f"or a preset name; got {type(data).__name__}")
    return data


def _with_nodes(data: str | dict[str, Any], nodes: int) -> dict[str, Any]:
    if isinstance(data, str):
        return {"preset": data, "nodes": nodes}
    return {**data, "nodes": nodes}


def _print_tables(console: Console, info: dict[str, Any]) -> None:
    overview = Table(title=f"topology {info['name']}", show_header=False)
    bisection = info["bisection_bandwidth_Bps"]
    shape = f"{info['nodes']} × {info['devices_per_node']} = {info['devices']}"
    rows = [("nodes × devices", shape),
            ("intra-node", str(info["intra_node"])), ("NICs per node", str(info["nics_per_node"])),
            *((k, str(v)) for k, v in info["vertices"].items()),
            *((f"fabric.{k}", _show(k, v)) for k, v in info["fabric"].items()),
            ("bisection", formatting.format_bandwidth(bisection) if bisection else "—"),
            ("bisection method", info["bisection_method"])]
    for key, value in rows:
        overview.add_row(key, value)
    links = Table(title="links (per direction)")
    for column in ("kind", "count", "bandwidth", "latency"):
        links.add_column(column)
    for kind, row in info["links"].items():
        links.add_row(kind, str(row["count"]),
                      ", ".join(formatting.format_bandwidth(b) for b in row["bandwidth_Bps"]),
                      ", ".join(formatting.format_time(t) for t in row["latency_s"]))
    console.print(overview)
    console.print(links)


def _show(key: str, value: Any) -> str:
    if key.endswith("_Bps") and isinstance(value, float):
        return formatting.format_bandwidth(value)
    return str(value)

"""``ddlsim traces``: read profiles and traces, write and read Chakra execution traces.

Mounted on the main app by :mod:`ddlsim.cligroups`; heavy imports happen inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["app"]

app = typer.Typer(help="Traces in, traces out: PyTorch profiler, Chakra ET, MPI call logs.",
                  no_args_is_help=True, add_completion=False)

Sets = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Change the profiled plan into the target, e.g. --set "
                  "parallel.data_parallel_size=8 (as predict's --set).")]
Format = Annotated[str, typer.Option("--format", "-f", help="table or json")]
Output = Annotated[Optional[Path], typer.Option("-o", "--output",
                                                help="Write the report here ('-': stdout).")]
Force = Annotated[bool, typer.Option(help="Replace existing output files.")]
Engine = Annotated[str, typer.Option(help="analytical or des")]


@app.callback()
def _traces() -> None:
    """Traces in, traces out: PyTorch profiler, Chakra ET, MPI call logs (docs/traces.md)."""


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    from ..cliutil import require
    require(value in allowed, f"{option} {value!r} is not allowed; allowed: {', '.join(allowed)}")


def _emit(text: str, output: Path | None, force: bool) -> None:
    from ..textio import write_output
    write_output("-" if output is None else output, text, force=force, what="--output file")


def kineto(
    config: Annotated[Path, typer.Argument(help="Run config of the profiled run (YAML/JSON).")],
    trace: Annotated[Path, typer.Argument(help="The profiler's Chrome JSON (.json or .json.gz), "
                                               "exported with with_stack=True (or, without "
                                               "it, of a model whose blocks FSDP2 shards).")],
    overrides: Sets = None,
    engine: Engine = "analytical",
    fmt: Format = "table",
    output: Output = None,
    force: Force = False,
    layer_module: Annotated[Optional[str], typer.Option(
        "--layer-module", help="Regular expression for the transformer layer's module class "
                               "(default: block$|layer$|decoderlayer|transformerlayer).")] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        help="Calibration profile whose fitted collective costs replace the system's.")] = None,
    profiler_overhead: Annotated[Optional[Path], typer.Option(
        "--profiler-overhead", help="The profiler's cost per event on the profiled machine "
                                    "(JSON of benchmarks/kineto_overhead.py), taken off each "
                                    "op's measured time.")] = None,
) -> None:
    """Predict with compute measured by a PyTorch profiler trace of one training step: the
    profiled step re-predicted, then the plan changed by --set (more data-parallel ranks,
    another network) with the same measured per-op times (docs/traces.md)."""
    from ..cliutil import refuse_overwriting_inputs
    from .kineto import read_kineto
    from .kineto_labels import ModuleRules
    from .kineto_overhead import load_overhead
    from .render import render_measured
    from .replay import predict_measured

    _choice("--format", fmt, ("table", "json"))
    _choice("--engine", engine, ("analytical", "des"))
    refuse_overwriting_inputs([config, trace, calibration, profiler_overhead], output=output)
    if output is not None:
        from ..textio import check_output
        check_output(output, force, what="--output file")
    rules = ModuleRules() if layer_module is None else ModuleRules(layer=_regex(layer_module))
    overhead = None if profiler_overhead is None else load_overhead(profiler_overhead)
    measured = read_kineto(trace, rules, overhead)
    result = predict_measured(config, measured, overrides or [], engine, calibration)
    _emit(render_measured(result, fmt, changed=bool(overrides)), output, force)


def export_chakra(
    config: Annotated[Path, typer.Argument(help="Run config (YAML or JSON).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for PREFIX.RANK.et and "
                                                    "PREFIX.comm_groups.json.")],
    overrides: Sets = None,
    prefix: Annotated[str, typer.Option(help="File name prefix.")] = "ddlsim",
    force: Force = False,
) -> None:
    """Write CONFIG's iteration as Chakra execution traces, one per rank, with ddlsim's
    compute times, for ASTRA-sim or any Chakra reader (docs/traces.md)."""
    from ..api import build_workload
    from ..config import load_config
    from .chakra import export_chakra as export
    from .replay import _cost

    cfg = load_config(config, overrides or [])
    workload = build_workload(cfg)
    paths = export(workload, _cost(cfg, workload), out, prefix, force=force)
    print(f"wrote {len(paths) - 1} rank traces and {paths[-1].name} to {out}")


def predict_chakra(
    source: Annotated[Path, typer.Argument(help="Directory of PREFIX.RANK.et files, or one "
                                                "of them.")],
    system: Annotated[str, typer.Option(help="System to predict on: a preset name or a YAML "
                                             "file with a system section.")],
    nodes: Annotated[Optional[int], typer.Option(help="Override the system's nodes.")] = None,
    comm_groups: Annotated[Optional[Path], typer.Option(
        "--comm-groups", help="{\"pg_name\": [ranks]} JSON (default: "
                              "PREFIX.comm_groups.json beside the traces).")] = None,
    engine: Engine = "analytical",
    fmt: Format = "table",
    output: Output = None,
    force: Force = False,
) -> None:
    """Read Chakra execution traces and predict their iteration on SYSTEM: compute takes the
    nodes' durations, communication ddlsim's network model (docs/traces.md)."""
    from ..cliutil import refuse_overwriting_inputs
    from .chakra_read import read_chakra
    from .render import render_result
    from .replay import predict_workload

    _choice("--format", fmt, ("table", "json"))
    _choice("--engine", engine, ("analytical", "des"))
    refuse_overwriting_inputs([source, comm_groups], output=output)
    if output is not None:
        from ..textio import check_output
        check_output(output, force, what="--output file")
    result = predict_workload(read_chakra(source, comm_groups), _system(system, nodes), engine)
    _emit(render_result(result, fmt, f"Chakra traces {source}"), output, force)


def replay_mpi(
    source: Annotated[Path, typer.Argument(help="Directory of PREFIX.RANK.jsonl MPI call logs "
                                                "(python -m ddlsim.traces.mpirecord writes them).")],
    system: Annotated[str, typer.Option(help="System to replay on: a preset name or a YAML "
                                             "file with a system section.")],
    nodes: Annotated[Optional[int], typer.Option(help="Override the system's nodes.")] = None,
    window: Annotated[Optional[str], typer.Option(
        help="CALL:FIRST:LAST: replay from the FIRST-th CALL of each rank (from 0) up to the "
             "LAST-th, e.g. barrier:2:4.")] = None,
    iterations: Annotated[int, typer.Option(
        help="Iterations the replayed span holds: times are also given per iteration.")] = 1,
    calibration: Annotated[Optional[Path], typer.Option(
        help="Calibration profile whose fitted collective costs replace the system's.")] = None,
    engine: Engine = "analytical",
    fmt: Format = "table",
    output: Output = None,
    force: Force = False,
) -> None:
    """Replay MPI call logs on SYSTEM: the time between a rank's calls is its measured work,
    the calls are timed by ddlsim's network model (docs/traces.md)."""
    from ..cliutil import OptionError, refuse_overwriting_inputs
    from .mpilog import measured_span, read_mpilog
    from .render import render_replay
    from .replay import predict_workload

    _choice("--format", fmt, ("table", "json"))
    _choice("--engine", engine, ("analytical", "des"))
    if iterations < 1:
        raise OptionError(f"--iterations {iterations}: give a count >= 1")
    refuse_overwriting_inputs([source, calibration], output=output)
    if output is not None:
        from ..textio import check_output
        check_output(output, force, what="--output file")
    span = _window(window)
    result = predict_workload(read_mpilog(source, span), _system(system, nodes), engine,
                              calibration=calibration)
    _emit(render_replay(result, measured_span(source, span), iterations, fmt,
                        f"MPI logs {source}"), output, force)


def _window(text: str | None) -> tuple[str, int, int] | None:
    from ..cliutil import OptionError
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
        raise OptionError(f"--window {text!r}: write CALL:FIRST:LAST, e.g. barrier:2:4")
    return parts[0], int(parts[1]), int(parts[2])


def _system(spec: str, nodes: int | None):
    from ..topologies.cli import read_spec
    data = read_spec(spec)
    data = {"preset": data} if isinstance(data, str) else dict(data)
    if nodes is not None:
        data["nodes"] = nodes
    return data


def _regex(text: str) -> str:
    import re
    from ..cliutil import OptionError
    try:
        re.compile(text)
    except re.error as e:
        raise OptionError(f"--layer-module {text!r} is not a regular expression ({e})") from None
    return text


def register(parent: typer.Typer) -> None:
    """Mount ``traces`` on ``parent``, every command wrapped by :func:`ddlsim.cliutil.guarded`."""
    from ..cliutil import guarded
    app.command("kineto")(guarded(kineto))
    app.command("export-chakra")(guarded(export_chakra))
    app.command("predict-chakra")(guarded(predict_chakra))
    app.command("replay-mpi")(guarded(replay_mpi))
    parent.add_typer(app, name="traces", help="Traces in, traces out: PyTorch profiler (Kineto), "
                                              "Chakra execution traces, MPI call logs.")

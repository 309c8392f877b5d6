"""``ddlsim import SOURCE…``: write the ddlsim run config that users' configs mean.

Registered by :func:`register` (one line in :mod:`ddlsim.cligroups`); the readers are
imported when the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..cliutil import OptionError, guarded

__all__ = ["register", "import_command", "render_yaml"]


def import_command(
    sources: Annotated[Optional[list[Path]], typer.Argument(
        show_default=False,
        help="Megatron-LM launch script or command line (text), Megatron-MoE-ModelZoo run "
             "script (with --repo) or model YAML, DeepSpeed ds_config.json, torchtitan TOML, "
             "Hugging Face model folder or config.json; several combine.")] = None,
    output: Annotated[str, typer.Option(
        "-o", "--output", help="The ddlsim YAML to write ('-': standard output).")] = "-",
    system: Annotated[Optional[str], typer.Option(
        help="System preset (ddlsim presets system), e.g. dgx-h100.")] = None,
    nodes: Annotated[Optional[int], typer.Option(
        help="Nodes of the system (replaces the launcher's --nnodes).")] = None,
    software: Annotated[Optional[str], typer.Option(
        help="Software stack (ddlsim presets software); a ds_config implies deepspeed.")] = None,
    kind: Annotated[Optional[str], typer.Option(
        "--from", help="Read every source as: megatron, modelzoo, deepspeed, torchtitan or hf "
                       "(default: from the file).")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option(
        help="An argument to leave out rather than refuse (listed in the YAML as ignored).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option(
        "--set", help="section.key=value applied to the result, as predict's --set.")] = None,
    repo: Annotated[Optional[Path], typer.Option(
        help="The Megatron-MoE-ModelZoo checkout a ModelZoo run script runs in.")] = None,
    env: Annotated[Optional[list[str]], typer.Option(
        help="NAME=value: a variable of the environment a ModelZoo launcher runs in.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
    arguments: Annotated[Optional[str], typer.Option(
        "--arguments", metavar="READER",
        help="List the arguments a reader maps (megatron, modelzoo, deepspeed, torchtitan, "
             "hf), one a line, instead of importing.")] = None,
) -> None:
    """Read users' configs (Megatron-LM arguments, DeepSpeed, torchtitan, Hugging Face) and
    write the ddlsim run config they mean; every argument is mapped, declared without effect,
    or refused by name."""
    from ..textio import check_output, write_output
    from . import import_config

    if arguments is not None:
        _list_arguments(arguments, sources)
        return
    if not sources:
        raise OptionError("give the files to import (a Megatron-LM script, a ds_config.json, a "
                          "torchtitan TOML, a Hugging Face folder; `ddlsim import --help`), or "
                          "--arguments READER to list what a reader maps")
    _check_not_an_input(output, sources)
    check_output(output, force, what="-o file")
    imported = import_config(list(sources), kind=kind, system=system, nodes=nodes,
                             software=software, ignore=tuple(ignore or ()),
                             overrides=tuple(overrides or ()), repo=repo,
                             env=tuple(env or ()))
    write_output(output, render_yaml(imported), force=force, what="-o file")


def _list_arguments(reader: str, sources: list[Path] | None) -> None:
    """``--arguments READER``: print what the reader maps, one a line."""
    from ..errors import did_you_mean
    from . import importers
    if sources:
        raise OptionError(f"--arguments lists what a reader maps and imports nothing; give it "
                          f"without files (got {len(sources)})")
    table = importers()
    if reader not in table:
        raise OptionError(f"--arguments {reader!r} is not a reader"
                          f"{did_you_mean(reader, table)}; allowed: {', '.join(table)}")
    typer.echo("\n".join(table[reader].known()))


def _check_not_an_input(output: str, sources: list[Path]) -> None:
    if output == "-":
        return
    target = os.path.realpath(output)
    for s in sources:
        inputs = [s, s / "config.json"] if s.is_dir() else [s]
        if any(os.path.realpath(i) == target for i in inputs):
            raise OptionError(f"-o {output} is an input of this command ({s}); write the "
                              "ddlsim config to another file")


def render_yaml(imported) -> str:
    """The run config as YAML, headed by what became of every source argument."""
    import yaml

    from .._version import __version__

    lines = [f"# Written by `ddlsim import` (ddlsim {__version__}). What became of each "
             "argument:"]
    for d in imported.drafts:
        if not d.notes:
            continue
        lines.append(f"# {d.source}:")
        lines += [f"#   {' '.join(arg.split())} -> {' '.join(outcome.split())}"
                  for arg, outcome in d.notes]
    sw = imported.config.get("system", {}).get("software")
    if sw is None:
        lines.append("# system.software is not set: ddlsim's default stack applies "
                     "(ddlsim presets software; --software to choose)")
    body = yaml.safe_dump(imported.config, sort_keys=False, default_flow_style=False,
                          allow_unicode=True, width=100)
    return "\n".join(lines) + "\n" + body


def register(app: typer.Typer) -> None:
    """Add ``import`` to ``app``."""
    app.command("import")(guarded(import_command))

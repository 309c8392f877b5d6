"""``ddlsim presets`` and the ``topology`` and ``calibrate`` command groups.

Registered on the main app by :func:`register` (two lines in :mod:`ddlsim.cli`); everything
heavy is imported when a command runs, so the CLI's cold start does not pay for it.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .cliutil import guarded, require

__all__ = ["register", "presets_command"]


def presets_command(
    section: Annotated[Optional[str], typer.Argument(
        help="model, parallel, train, system or software")] = None,
    name: Annotated[Optional[str], typer.Argument(
        help="one preset or stack of the section: all its values, with their sources")] = None,
) -> None:
    """List the presets a config section may name, with their sources, and the software
    stacks ``system.software`` may name; with a NAME, print that one in full (YAML, as a
    config would write it)."""
    from .cli import check_choice
    from .clioutput import out
    from .presets import SECTIONS, list_presets

    if section is not None:
        check_choice("section", section, (*SECTIONS, "software"))
    if name is not None:
        out.print(_preset_yaml(section, name), end="", markup=False, highlight=False,
                  soft_wrap=True)
        return
    from .cliutil import print_records

    if section in (None, "software"):
        print_records(out, "software stacks (system.software)", *_software_rows())
    if section == "software":
        return
    for sec, entries in list_presets(section).items():
        family = {}
        if sec == "model":
            from .presets import model_preset_families
            family = model_preset_families()
        columns = ["name", *(["family"] if sec == "model" else []), "summary", "source"]
        rows = [[name, *([family[name]] if sec == "model" else []), _summary(sec, name, v),
                 str(v.get("source", ""))] for name, v in entries.items()]
        print_records(out, f"{sec} presets", columns, rows)


def _preset_yaml(section: str, name: str) -> str:
    """The preset ``name`` of ``section`` as YAML, in the order of its file: a model as its
    family reads it (a bundled ``config.json`` read into its fields, its summary line first),
    a software stack with its fields (each a value and its source) and its rules."""
    import yaml

    head = ""
    if section == "software":
        from .software import stack_entry
        entry = stack_entry(name)
    elif section == "model":
        from .configload import resolve_section
        from .configpresets import preset_alias
        name = preset_alias(section, name)
        entry = resolve_section("model", name)
        head = f"# {name}: {_summary(section, name, entry)}\n"
    else:
        from .presets import get_preset
        entry = get_preset(section, name)
    return head + yaml.safe_dump({name: entry}, sort_keys=False, allow_unicode=True,
                                 width=100)


def _software_rows() -> tuple[list[str], list[list[str]]]:
    """The named software stacks: the attention kernel, the GEMM library (which picks the
    device's matmul ceiling), the overlaps on, and where the attention default comes from
    (every field's source is in ddlsim/data/software.yaml): (columns, rows)."""
    from .software import resolve_software, stacks

    columns = ["name", "attention", "GEMM library", "overlaps on", "ZeRO-3 gathers",
               "source of the attention default"]
    rows = []
    for name in stacks():
        sw = resolve_software(name)
        on = [k if v is True else f"{k}={v}" for k, v in sw.overlap.items()
              if not k.startswith("zero3_") and v is not False and v != "off"]
        rows.append([name, sw.attention, sw.gemm_library, ", ".join(on), _zero3_cell(sw),
                     sw.sources["attention"]])
    return columns, rows


def _zero3_cell(sw) -> str:
    """``per layer, 1 layer ahead`` or ``per tensor, 1 module ahead; kept under 1e+05
    elements, …; host per rank: …``."""
    from .workloads.decoder.zero3 import zero3_phrase
    text = zero3_phrase(sw)
    if sw.zero3_gather != "per_layer":
        text += (f"; kept under {sw.zero3_persistence_threshold:.0e} elements, reused within "
                 f"{sw.zero3_max_reuse_distance:.0e}")
    if sw.zero3_host_python_op or sw.zero3_host_copy or sw.zero3_host_gather_call:
        text += (f"; host per rank: {sw.zero3_host_python_op * 1e6:g} µs a Python op, "
                 f"{sw.zero3_host_copy * 1e6:g} µs a copy_, and "
                 f"{sw.zero3_host_gather_call * 1e6:g} µs per gather")
    if sw.zero3_reduce_bucket_size:
        text += (f"; gradients over {sw.zero3_reduce_bucket_size:.0e} elements issued after "
                 "their module")
    return text


def _summary(section: str, name: str, v: dict) -> str:
    if section == "model":  # the family's one line (bundled config.json files are read)
        from .config import validate_model
        from .configload import resolve_section
        from .workloads.registry import get_family

        import warnings
        with warnings.catch_warnings():  # a listing: keys a bundled file has are no news
            warnings.simplefilter("ignore")
            model = validate_model(resolve_section("model", name))
        return get_family(model.architecture).summary(model).removeprefix(f"{name}: ")
    if section == "system":
        d = v["device"]
        return f"{v['nodes']}×{v['devices_per_node']} {d['name']}, {v['nics_per_node']}×{v['nic']['bandwidth_Bps']} NIC"
    return ", ".join(f"{k}={x}" for k, x in v.items() if k != "source")


def _calibrate_checks(name: str):
    """Options of ``ddlsim calibrate NAME`` that apply only with another one."""
    def check(kw: dict) -> None:
        if name == "show":
            require(not kw.get("force") or kw.get("plot") is not None,
                    "--force applies to the --plot file; without --plot there is nothing to "
                    "replace")
        if name == "compute":
            require(kw.get("attention") or kw.get("max_seq") == 1024,
                    "--max-seq applies to the attention benchmark; add --attention")
        if name == "fit":
            require(kw.get("bootstrap") or not kw.get("seed"),
                    "--seed seeds the bootstrap, which --bootstrap 0 turns off")
            given = [f"--{k}" for k in ("op", "backend", "ranks", "nodes", "scope")
                     if kw.get(k) is not None]
            require(kw.get("format") not in ("ddlsim", "ddlsim-compute") or not given,
                    f"{', '.join(given)} describe(s) nccl-tests or OSU files; --format "
                    f"{kw.get('format')} files record them in their rows")
    return check


def _mount_subapps(app: typer.Typer) -> None:
    """Mount ``topology`` and ``calibrate``, every command wrapped by :func:`guarded`."""
    from .calibration.cli import app as calibrate_app
    from .topologies.cli import app as topology_app

    for sub in (topology_app, calibrate_app):
        for command in sub.registered_commands:
            name = command.name or command.callback.__name__
            checks = _calibrate_checks(name) if sub is calibrate_app else None
            command.callback = guarded(command.callback, checks)
    app.add_typer(topology_app, name="topology", help="Build, summarise and draw cluster topologies.")
    app.add_typer(calibrate_app, name="calibrate",
                  help="Run microbenchmarks, read existing results, fit cost profiles.")


def register(app: typer.Typer) -> None:
    """Add ``presets`` to ``app`` and mount ``topology`` and ``calibrate``, every command
    wrapped by :func:`ddlsim.cliutil.guarded`."""
    app.command("presets")(guarded(presets_command))
    _mount_subapps(app)
    from .traces.cli import register as register_traces  # ddlsim traces (docs/traces.md)
    register_traces(app)
    from .importers.cli import register as register_import   # ddlsim import
    register_import(app)

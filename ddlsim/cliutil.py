"""What every ``ddlsim`` command shares: one-paragraph errors (exit 2), warnings on stderr,
and the checks that no option is silently ignored."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.markup import escape

from .errors import DDLSimError, OptionError, require  # noqa: F401  (re-exported)

__all__ = ["OptionError", "guarded", "require", "refuse_negative", "check_outputs",
           "refuse_overwriting_inputs", "OnceGroup", "print_records", "warn_unused_devices",
           "check_dask_workers", "EXIT_ERROR", "EXIT_BUG"]

#: Exit status of a refused input or option (one ``error:`` paragraph on stderr).
EXIT_ERROR = 2
#: Exit status of an internal error (a bug in ddlsim): one paragraph too, never a traceback
#: unless ``DDLSIM_DEBUG=1``.
EXIT_BUG = 3

#: Errors that mean "this input cannot be used": answered with one paragraph and status 2.
_INPUT_ERRORS: tuple[type[BaseException], ...] = (DDLSimError, OSError, ValueError,
                                                  RecursionError, MemoryError, OverflowError)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _paragraph(text: str) -> str:
    """``text`` as one paragraph: no blank lines, no trailing space."""
    return "\n".join(line for line in str(text).strip().splitlines() if line.strip())


def _is_input_error(exc: BaseException) -> bool:
    if isinstance(exc, _INPUT_ERRORS):
        return True
    yaml = sys.modules.get("yaml")
    return yaml is not None and isinstance(exc, yaml.YAMLError)


def _describe(exc: BaseException) -> str:
    """The message of an input error; OS and decoding errors name the file and the cause."""
    if isinstance(exc, OSError) and not isinstance(exc, DDLSimError) and exc.strerror:
        where = f"{exc.filename!r}: " if exc.filename else ""
        return f"{where}{exc.strerror} (errno {exc.errno})"
    if isinstance(exc, UnicodeDecodeError):
        return (f"an input is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
                f"{exc.start} cannot be decoded as {exc.encoding}; save the file as UTF-8")
    if isinstance(exc, RecursionError):
        return "an input is nested too deeply to be read"
    if isinstance(exc, MemoryError):
        return "an input needs more memory than is available"
    return str(exc) or type(exc).__name__


def _report_warnings(caught: Iterable[warnings.WarningMessage]) -> None:
    seen: set[str] = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        if text and text not in seen:
            seen.add(text)
            _stderr().print(f"[yellow]warning:[/] {escape(text)}")


def guarded(fn: Callable[..., Any],
            check: Callable[[dict[str, Any]], None] | None = None) -> Callable[..., Any]:
    """Wrap a command: ddlsim's errors and unreadable input print ``error: …`` (one
    paragraph) and exit 2; any other exception prints one paragraph naming it as a bug and
    exits 3 (``DDLSIM_DEBUG=1`` re-raises it); every warning raised meanwhile prints as one
    ``warning: …`` line on stderr, even when the command fails.

    Before the command runs, every integer option must be >= 0 (they are all counts, sizes
    or seeds), and ``check(options)`` may refuse options that do not apply together.
    """
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            try:
                refuse_negative(**{k: v for k, v in kwargs.items()
                                   if isinstance(v, int) and not isinstance(v, bool)})
                if check is not None:
                    check(kwargs)
                return fn(*args, **kwargs)
            except (typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 — the CLI answers every input
                if os.environ.get("DDLSIM_DEBUG"):
                    raise
                if _is_input_error(exc):
                    message, code = _describe(exc), EXIT_ERROR
                else:
                    message = (f"internal error ({type(exc).__name__}: {exc}); this is a bug "
                               "in ddlsim: please report it with the command line (run it with "
                               "DDLSIM_DEBUG=1 for the traceback)")
                    code = EXIT_BUG
                _report_warnings(caught)
                caught.clear()
                _stderr().print(f"[bold red]error:[/] {escape(_paragraph(message))}")
                raise typer.Exit(code) from None
            finally:
                _report_warnings(caught)
    return run


def refuse_negative(**counts: int | None) -> None:
    """Refuse a negative count, naming its option (``links=-3`` → ``--links -3``)."""
    for name, value in counts.items():
        if value is not None and value < 0:
            raise OptionError(f"--{name.replace('_', '-')} {value} is negative; give a count "
                              ">= 0")


def check_outputs(force: bool, **paths: Path | str | None) -> None:
    """Check every output path before a long run (see :func:`ddlsim.textio.check_output`);
    two options may not name the same file."""
    from .textio import check_output

    given = {k: p for k, p in paths.items() if p is not None}
    seen: dict[str, str] = {}
    for name, path in given.items():
        option = "--" + name.replace("_", "-")
        if str(path) != "-":
            key = os.path.realpath(path)
            if key in seen:
                raise OptionError(f"{option} and {seen[key]} name the same file {str(path)!r}; "
                                  "give each output its own path")
            seen[key] = option
        check_output(path, force, what=f"{option} file")


def refuse_overwriting_inputs(inputs: Iterable[Path | str | None], **outputs: Path | str | None
                              ) -> None:
    """Refuse an output that is one of the command's own inputs (the same file by path,
    link or hard link), with or without ``--force``: a command never writes over what it
    reads.

    Parameters
    ----------
    inputs : the files the command reads (None and ``-`` are skipped).
    outputs : option name → output path (``output`` is shown as ``-o``).
    """
    read = [Path(p) for p in inputs if p is not None and str(p) != "-"]
    for name, path in outputs.items():
        if path is None or str(path) == "-":
            continue
        for source in read:
            if _same_file(Path(path), source):
                option = "-o" if name == "output" else "--" + name.replace("_", "-")
                raise OptionError(f"{option} {str(path)!r} is the input {str(source)!r}; a "
                                  "command never writes over its own input, even with --force: "
                                  "give the output another path")


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def repeated_option(command: Any, args: list[str]) -> str | None:
    """The first option of ``command`` that takes one value and appears twice in ``args``
    (``-o a -o b``, ``--model=x --model y``), or None. Click keeps the last; ddlsim refuses.
    The value after an option is skipped (``--set -o`` is a value, not ``-o``)."""
    once: dict[str, str] = {}
    takes: dict[str, int] = {}  # option → values it takes
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        flag = param.is_flag or getattr(param, "count", False)
        for opt in param.opts + param.secondary_opts:
            takes[opt] = 0 if flag else max(param.nargs, 1)
            if not flag and not param.multiple:
                once[opt] = "/".join(param.opts)
    seen: set[str] = set()
    i = 0
    while i < len(args) and args[i] != "--":
        name, eq, _ = args[i].partition("=") if args[i].startswith("--") else (args[i], "", "")
        i += 1
        if name not in takes:
            continue
        i += 0 if eq else takes[name]
        key = once.get(name)
        if key is not None:
            if key in seen:
                return key
            seen.add(key)
    return None


def _click_exceptions() -> Any:
    """click's exception classes as typer raises them: typer 0.2x vendors click as
    ``typer._click``; earlier releases use click itself."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


#: Options users type from other tools, and how ddlsim's commands write them (an unknown
#: option is still refused: the message says what to write).
_OPTION_WORDS = {
    "--json": "--format json", "--csv": "--format csv", "--table": "--format table",
    "--des": "--engine des", "--analytical": "--engine analytical",
    "--gpus": "--set system.nodes=N (GPUs are nodes × devices per node)",
    "--nodes": "--set system.nodes=N", "--config": "as the first argument (ddlsim predict "
                                                     "CONFIG)",
    "--tp": "--set parallel.tensor_model_parallel_size=N",
    "--pp": "--set parallel.pipeline_model_parallel_size=N",
    "--dp": "--set parallel.data_parallel_size=N",
}


def _option_word(name: str, ctx: Any) -> str | None:
    """How the command of ``ctx`` writes the unknown option ``name`` users typed from another
    tool (:data:`_OPTION_WORDS`), if it takes the option that says it."""
    meant = _OPTION_WORDS.get(name)
    if meant is None or not meant.startswith("--"):
        return meant
    takes = {o for p in getattr(getattr(ctx, "command", None), "params", ()) for o in p.opts}
    return meant if meant.split()[0] in takes else None


class OnceGroup(TyperGroup):
    """A command group that refuses an option taking one value given twice (click would keep
    the last one silently): ``error: -o/--output is given twice; give it once``, exit 2; and
    answers a command line click cannot parse (an unknown option or command, a missing or
    extra argument, a value of the wrong type) with one ``error:`` paragraph and exit 2, as
    every other refused input, instead of click's usage box."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        errors = _click_exceptions()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except getattr(errors, "NoArgsIsHelpError", ()) as exc:   # a group called bare
            if exc.format_message():   # typer prints its help itself and leaves this empty
                _stderr().print(escape(exc.format_message()))
            sys.exit(exc.exit_code)
        except errors.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "ddlsim"
            message = exc.format_message().rstrip(".")
            if isinstance(exc, errors.NoSuchOption) and (
                    meant := _option_word(exc.option_name, exc.ctx)):
                message = f"no such option: {exc.option_name}; it is written {meant}"
            _stderr().print(f"[bold red]error:[/] {escape(where)}: "
                            f"{escape(message[:1].lower() + message[1:])} (`{escape(where)} "
                            "-h` lists what it takes)")
            sys.exit(EXIT_ERROR)
        except errors.ClickException as exc:   # a file click could not open, …
            _stderr().print(f"[bold red]error:[/] {escape(exc.format_message())}")
            sys.exit(exc.exit_code)
        except typer.Abort:
            _stderr().print("[bold red]error:[/] aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        target, target_args = command, rest
        if isinstance(command, TyperGroup) and rest:  # a group's command (calibrate fit)
            target, target_args = command.get_command(ctx, rest[0]), rest[1:]
        if target is not None and not isinstance(target, TyperGroup):
            twice = repeated_option(target, target_args)
            if twice is not None:
                _stderr().print(f"[bold red]error:[/] {escape(twice)} is given twice; it "
                                "takes one value, so give it once")
                raise typer.Exit(EXIT_ERROR)
        return name, command, rest


def print_records(console: Console, title: str, columns: list[str], rows: list[list[str]],
                  min_table_width: int = 120) -> None:
    """Print ``rows`` as a table when ``console`` is at least ``min_table_width`` wide, else
    as one indented block per row (the first column as its heading, then ``column: value``
    lines that wrap under their indent), so long sources stay readable at 80 columns."""
    from rich.padding import Padding
    from rich.table import Table

    if console.width >= min_table_width:
        t = Table(title=title, title_justify="left")
        for i, name in enumerate(columns):
            t.add_column(name, style="bold" if i == 0 else None, overflow="fold")
        for row in rows:
            t.add_row(*(escape(c) for c in row))
        console.print(t)
        return
    console.print(f"[bold]{escape(title)}[/]")
    for row in rows:
        console.print(Padding(f"[bold]{escape(row[0])}[/]", (0, 0, 0, 2)))
        for name, cell in zip(columns[1:], row[1:]):
            if cell:
                console.print(Padding(f"{escape(name)}: {escape(cell)}", (0, 0, 0, 4)),
                              highlight=False)


def warn_unused_devices(cfg: Any) -> None:
    """Warn when the plan leaves half the system's devices or more unused (``--set
    parallel.pipeline_model_parallel_size=8`` on a plan of 1,024 ranks with its data
    parallelism fixed runs on 512): a smaller plan is allowed, but never silently."""
    import warnings

    from .errors import DDLSimWarning

    world, devices = cfg.world_size, cfg.system.num_devices
    if 2 * world <= devices:
        p = cfg.parallel
        warnings.warn(f"the plan runs on {world:,} of the system's {devices:,} devices "
                      f"(TP {p.tp} × CP {p.cp} × PP {p.pp} × DP {cfg.dp}); to use them all, "
                      "raise parallel.data_parallel_size or leave it unset (it then fills the "
                      "system)", DDLSimWarning, stacklevel=3)


def check_dask_workers(workers: int | None) -> None:
    """Refuse ``--dask-workers`` above 4 × this machine's cores: a local cluster of more
    processes than that only adds memory (each worker imports ddlsim, ~150 MB) and start-up
    time; 10^20 of them was a machine brought to its knees, not a sweep."""
    cores = os.cpu_count() or 1
    require(workers is None or workers <= 4 * cores,
            f"--dask-workers {workers} is more than 4 × the {cores} cores of this machine "
            f"({4 * cores}); a local cluster gains nothing past its cores")

"""Where the commands' results go: the terminal, a file, a recorded table's text, JSON or CSV.

Used by :mod:`ddlsim.cli` and :mod:`ddlsim.cligroups`; rich is the only library imported here,
so the CLI's cold start stays light (``tests/test_cli_startup.py``).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .cliutil import require

#: The terminal the commands print on.
out = Console()


class NullFile:
    """A file that drops what is written (the recording console keeps the text)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def recording_console() -> Console:
    """A console 110 characters wide, without colour, that records what is printed on it and
    writes nothing."""
    return Console(record=True, width=110, file=NullFile(), color_system=None)


def emit(text: str, output: Path | None, force: bool) -> None:
    """Write ``text`` to ``output`` (stdout when None or ``-``); ``force`` replaces a file."""
    from .textio import write_output
    write_output("-" if output is None else output, text, force=force, what="--output file")


def table_text(renderable) -> str:
    """The plain text of ``renderable`` printed on a :func:`recording_console`."""
    console = recording_console()
    console.print(renderable)
    return console.export_text()


def table_console(width: int | None) -> Console:
    """The console tables print on: ``out``, or one ``width`` characters wide (``--width``,
    at least 40)."""
    if width is None:
        return out
    require(width >= 40, f"--width {width} is too narrow for a table; give 40 or more")
    return Console(width=width)


def prediction_payload(results: list) -> dict:
    """The JSON of ``predict -f json``: one result's mapping, or with two engines
    ``{"analytical": …, "des": …, "difference": …}``."""
    if len(results) == 1:
        return results[0].to_dict()
    a, d = results
    return {"analytical": a.to_dict(), "des": d.to_dict(),
            "difference": {"iteration_time_s": d.iteration_time_s - a.iteration_time_s,
                           "relative": d.iteration_time_s / a.iteration_time_s - 1}}


def csv_text(results: list, labels: list[str] | None = None) -> str:
    """One CSV row per result (:meth:`Result.to_row` columns), full float precision."""
    from .report import find_non_finite
    from .simulator.result import results_frame

    frame = results_frame(results, labels)
    bad = find_non_finite(frame.to_dict(orient="list"))
    require(bad is None, f"the result holds a non-finite number in column "
                         f"{bad[0].split('.')[0] if bad else ''}; an input value is infinite")
    return frame.to_csv(index=False, lineterminator="\n")


__all__ = ["out", "NullFile", "recording_console", "emit", "table_text", "table_console",
           "prediction_payload", "csv_text"]

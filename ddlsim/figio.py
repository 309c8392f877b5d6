"""Saving a matplotlib figure the way every ddlsim output is written (through
:func:`ddlsim.textio.write_output`: atomic, symlink-following, FIFO- and device-aware)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from .errors import DDLSimError

__all__ = ["save_figure"]


def save_figure(fig: Any, path: str | Path, *, force: bool = False, what: str = "figure",
                **savefig: Any) -> Path:
    """Render ``fig`` in memory, in the format its suffix names (PNG without one), and write
    it to ``path``.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : output path; ``-`` is standard output.
    force : replace an existing regular file.
    what : how error messages name the file (e.g. ``"--draw file"``).
    savefig : passed to ``Figure.savefig`` (``dpi``, ``bbox_inches``…).

    Raises
    ------
    DDLSimError
        For a suffix matplotlib cannot write, or a path that cannot be written.
    """
    from .textio import check_output, write_output

    check_output(path, force, what=what)
    suffix = Path(str(path)).suffix.lower().lstrip(".")
    allowed = fig.canvas.get_supported_filetypes()
    fmt = suffix or "png"
    if fmt not in allowed:
        raise DDLSimError(f"{what} {str(path)!r}: matplotlib cannot write {suffix!r} files; "
                          f"use one of {', '.join('.' + k for k in sorted(allowed))}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, **savefig)
    write_output(path, buf.getvalue(), force=force, what=what)
    return Path(path)

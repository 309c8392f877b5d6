"""Writing files without losing the user's: refuse to overwrite unless asked, write atomically.

Also the provenance helpers (sha256 of inputs, a description of this machine) that every
output carries.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import socket
import sys
from pathlib import Path

import pandas as pd
import yaml

from .._version import __version__
from ..textio import OutputFileError, check_output, write_output
from .schema import CalibrationError

__all__ = ["guard_output", "write_text", "write_csv", "write_yaml", "sha256_file",
           "machine_info", "utc_now", "metadata_path"]


def guard_output(path: str | Path, force: bool) -> Path:
    """Return ``path`` if it may be written (see :func:`ddlsim.textio.check_output`): it does
    not exist, or ``force`` is true, or it is a FIFO or device written through.

    Raises :class:`CalibrationError` (every MPI rank agrees on it) otherwise.
    """
    try:
        check_output(path, force, what="output")
    except OutputFileError as exc:
        raise CalibrationError(str(exc)) from None
    return Path(path)


def write_text(path: str | Path, text: str, force: bool = False) -> Path:
    """Write ``text`` to ``path`` with :func:`ddlsim.textio.write_output`: atomic replace
    (only with ``force``), symlinks followed, FIFOs and devices written through, ``-`` is
    standard output, new files with the user's umask."""
    guard_output(path, force)
    try:
        write_output(path, text, force=force, what="output")
    except OutputFileError as exc:
        raise CalibrationError(str(exc)) from None
    return Path(path)


def write_csv(path: str | Path, df: pd.DataFrame, force: bool = False) -> Path:
    """The DataFrame as CSV (full float precision, no index)."""
    return write_text(path, df.to_csv(index=False, float_format="%.9g"), force)


def write_yaml(path: str | Path, data: dict, force: bool = False) -> Path:
    """A mapping as block-style YAML, keys in insertion order."""
    return write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None,
                                           width=100), force)


def metadata_path(csv_path: str | Path) -> Path:
    """``results.csv`` → ``results.meta.yaml`` (the benchmark's metadata file)."""
    p = Path(csv_path)
    return p.with_name(p.stem + ".meta.yaml")


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def utc_now() -> str:
    """Current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def machine_info() -> dict:
    """Host name, OS, CPU and Python of the machine running ddlsim."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": sys.version.split()[0], "ddlsim_version": __version__}

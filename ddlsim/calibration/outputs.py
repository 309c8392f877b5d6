"""Writing files without losing the user's: refuse to overwrite unless asked, write atomically.

Also the provenance helpers (sha256 of inputs, a description of this machine) that every
output carries.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import socket
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from .. import __version__
from .schema import CalibrationError

__all__ = ["guard_output", "write_text", "write_csv", "write_yaml", "sha256_file",
           "machine_info", "utc_now", "metadata_path"]


def guard_output(path: str | Path, force: bool) -> Path:
    """Return ``path`` if it may be written: it does not exist, or ``force`` is true."""
    p = Path(path)
    if p.exists() and not force:
        raise CalibrationError(f"{p} already exists; refusing to overwrite it (pass --force to "
                               "replace it, or choose another output path)")
    if p.exists() and p.is_dir():
        raise CalibrationError(f"{p} is a directory, not a file")
    return p


def write_text(path: str | Path, text: str, force: bool = False) -> Path:
    """Write ``text`` to ``path`` via a temporary file and an atomic rename."""
    p = guard_output(path, force)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p


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

"""The C PMPI recorder (``ddlsim_pmpi.c``): MPI call logs of C/C++ programs, in the format
:mod:`ddlsim.traces.mpilog` reads. Build it with :func:`build` (needs an MPI compiler
wrapper, ``mpicc``) and preload it under ``mpirun`` (docs/traces.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ...errors import ConfigError

__all__ = ["SOURCE", "build"]

#: the recorder's C source, shipped with ddlsim
SOURCE = Path(__file__).with_name("ddlsim_pmpi.c")


def build(directory: str | Path, compiler: str = "mpicc") -> Path:
    """Compile the recorder into ``DIRECTORY/libddlsim_pmpi.so``.

    Parameters
    ----------
    directory : where the shared library goes (created if missing).
    compiler : the MPI C compiler wrapper of the MPI the program uses.

    Returns
    -------
    Path
        The library, for ``mpirun -x LD_PRELOAD=…``.
    """
    cc = shutil.which(compiler)
    if cc is None:
        raise ConfigError(f"compiler {compiler!r} is not on PATH; the recorder needs the MPI C "
                          "compiler wrapper of the MPI the program runs with")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / "libddlsim_pmpi.so"
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(SOURCE)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ConfigError(f"{compiler} could not build {SOURCE.name}: {proc.stderr.strip()[:500]}")
    return lib

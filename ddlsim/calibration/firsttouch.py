"""The host's first-touch cost: what a process's first write to a page it never touched adds
(the page fault, and the kernel zeroing the page), measured on this machine and kept in a
calibration profile (``first_touch``), whence :func:`ddlsim.predict` charges it to buffers a
program allocates fresh every iteration (:mod:`ddlsim.workloads.freshbuffers`).

The method (benchmarks/proxies_firsttouch.py's, in the proxies' pattern): each repetition
copies ``nbytes`` into a new private anonymous mapping (what glibc's ``calloc`` returns for a
request above its ``mmap`` threshold, 128 KiB by default, mallopt(3): the proxies' buffers)
and then into the same memory again, both timed with the process's CPU clock
(``time.process_time``: the faults are kernel time charged to this process, so other jobs on
the machine change it less than the wall clock). Every mapping is held until the last copy,
as the comm_only proxies never free theirs (``comm_only/bert_large.cpp:63-64``), so each
repetition faults in pages the process never had rather than the pages the previous
repetition just gave back (on this VM those came back up to 0.6 µs a page cheaper, and the
proxy's own receives paid the held rate: docs/validation.md, "What the fresh buffers cost at
2 ranks"). The cost per page is the mean fresh copy less the mean warm one, over the pages:
the proxies print a mean over their iterations, and a median would drop the slow faults the
mean pays.
"""

from __future__ import annotations

import mmap
import statistics
import time
from pathlib import Path

from .profiledoc import FirstTouchEntry
from .schema import CalibrationError

__all__ = ["PAGE_BYTES", "MIN_BYTES", "MAX_HELD_BYTES", "copy_twice", "measure_first_touch",
           "add_first_touch", "summary"]

#: this machine's page size (mmap.PAGESIZE: sysconf(_SC_PAGESIZE))
PAGE_BYTES = mmap.PAGESIZE
#: smallest copy measured: twice glibc's default mmap threshold (128 KiB, mallopt(3)), the
#: sizes a ``calloc`` serves from fresh pages
MIN_BYTES = 256 * 1024
#: largest copy measured
MAX_BYTES = 1024**3
#: most memory the fresh mappings may hold at once (bytes × repeats): twice what one rank of
#: comm_only/bert_large.cpp leaks a launch (266 iterations × 4,198,400 B of receive buffer,
#: lines 18-22 and 63-64), and under a tenth of a 24 GiB host (this VM)
MAX_HELD_BYTES = 2 * 1024**3


def copy_twice(dst, src) -> tuple[float, float]:
    """CPU seconds of copying ``src`` into ``dst`` (numpy arrays), then again into the same
    memory: the first pays the page faults of a fresh ``dst``, the second not."""
    import numpy as np

    t = time.process_time()
    np.copyto(dst, src)
    first = time.process_time() - t
    t = time.process_time()
    np.copyto(dst, src)
    return first, time.process_time() - t


def _copies(nbytes: int, repeats: int) -> tuple[list[float], list[float]]:
    """CPU seconds of each copy into fresh memory and into the same memory again; every
    mapping is held until the last copy (the proxies never free their buffers)."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    fresh, warm, held = [], [], []
    try:
        for _ in range(repeats):
            # private anonymous pages, as glibc's calloc maps them above its mmap threshold
            buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            held.append(buf)
            first, again = copy_twice(np.frombuffer(buf, dtype=np.uint8), src)
            fresh.append(first)
            warm.append(again)
    finally:
        for buf in held:
            buf.close()
    return fresh, warm


def measure_first_touch(nbytes: int = 4 * 1024**2, repeats: int = 100) -> FirstTouchEntry:
    """Measure this machine's first-touch cost per page (module docstring).

    Parameters
    ----------
    nbytes : int
        Bytes per copy (B), :data:`MIN_BYTES` to :data:`MAX_BYTES`.
    repeats : int
        Fresh mappings copied into (at least 3).

    Returns
    -------
    FirstTouchEntry
        ``s_per_page`` = (mean fresh − mean warm) / pages, in seconds, with the means and
        where and when it was measured.

    Raises
    ------
    CalibrationError
        For a size or count out of range, or when the fresh copies were not slower than the
        warm ones (nothing measured: the machine's noise is larger than the faults).
    """
    if not isinstance(nbytes, int) or not MIN_BYTES <= nbytes <= MAX_BYTES:
        raise CalibrationError(f"first-touch bytes = {nbytes!r}: {MIN_BYTES} to {MAX_BYTES} B "
                               "(above glibc's mmap threshold, as the buffers it charges)")
    if not isinstance(repeats, int) or repeats < 3:
        raise CalibrationError(f"first-touch repeats = {repeats!r}: at least 3")
    if nbytes * repeats > MAX_HELD_BYTES:
        raise CalibrationError(f"first-touch bytes × repeats = {nbytes} × {repeats} = "
                               f"{nbytes * repeats} B held at once: at most {MAX_HELD_BYTES} B "
                               "(fewer --repeats or smaller --bytes)")
    fresh, warm = _copies(nbytes, repeats)
    f, w = statistics.mean(fresh), statistics.mean(warm)
    pages = -(-nbytes // PAGE_BYTES)
    if f <= w:
        raise CalibrationError(f"first touch not measured: copies into fresh memory took "
                               f"{f * 1e3:.3f} ms, into the same memory again {w * 1e3:.3f} ms "
                               f"(mean of {repeats}); measure again on a quieter machine or "
                               "with more --repeats")
    from .outputs import machine_info, utc_now
    when, host = utc_now(), machine_info()["hostname"]
    return FirstTouchEntry(
        s_per_page=(f - w) / pages, page_bytes=PAGE_BYTES, bytes=nbytes, repeats=repeats,
        fresh_s=f, warm_s=w, clock="process_time", statistic="mean", measured_utc=when,
        source=f"ddlsim calibrate first-touch on {host} at {when}: {nbytes} B copied into "
               f"fresh mappings, all held, and into the same memory again, means of "
               f"{repeats}, CPU clock")


def add_first_touch(profile: str | Path, entry: FirstTouchEntry, force: bool = False) -> Path:
    """Write ``entry`` into the calibration profile at ``profile`` (its ``first_touch``).

    Parameters
    ----------
    profile : path of an existing profile YAML (``ddlsim calibrate fit``'s output).
    entry : the measurement.
    force : replace a ``first_touch`` the profile already has.

    Returns
    -------
    Path
        ``profile``.
    """
    from ..errors import ConfigError
    from .profile import CalibrationProfile

    prof = CalibrationProfile.load(profile)
    if prof.doc.first_touch is not None and not force:
        raise ConfigError(f"{profile}: already has a first_touch measurement "
                          f"({prof.doc.first_touch.source}); --force replaces it")
    doc = prof.doc.model_copy(update={"first_touch": entry})
    return CalibrationProfile(doc).save(profile, force=True)


def summary(entry: FirstTouchEntry) -> str:
    """One line: the cost per page and the copies it came from."""
    return (f"first touch {entry.s_per_page * 1e6:.3f} us per {entry.page_bytes} B page (copy "
            f"of {entry.bytes} B into fresh memory {entry.fresh_s * 1e3:.3f} ms, into the same "
            f"memory again {entry.warm_s * 1e3:.3f} ms, CPU time, {entry.statistic} of "
            f"{entry.repeats}; {entry.measured_utc})")

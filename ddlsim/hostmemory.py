"""The process's C heap kept for reuse: glibc's ``mallopt`` set as a caching allocator would.

numpy allocates every temporary anew. With glibc's defaults a block above the mmap threshold
is a fresh ``mmap`` whose pages are faulted in and zeroed on first touch, and heap memory
above the trim threshold goes back to the system, to be faulted in again by the next call:
repeated predictions in one process (``sweep``, ``search``'s exact re-checks, a benchmark's
loop) paid 165-2,910 minor page faults per deep prediction, about 3.6 us each on the
development VM (2026-11-29), and the reference trainer 8,700-13,600 per iteration.

The ``ddlsim`` command calls :func:`keep_freed_memory` once at start (it owns its process); a
library import never changes the process's allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

#: glibc ``mallopt`` parameters (``<malloc.h>``: ``M_TRIM_THRESHOLD`` −1, ``M_MMAP_THRESHOLD``
#: −3) and the values set: blocks up to 32 MiB (glibc's largest ``M_MMAP_THRESHOLD``,
#: ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit) come from the heap, which is not given back to
#: the system below 1 GiB of free space at its top
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES, _TRIM_THRESHOLD_BYTES = 32 * 2 ** 20, 2 ** 30


def keep_freed_memory() -> bool:
    """Keep freed memory in the process for reuse (glibc only).

    Returns
    -------
    bool
        True when both ``mallopt`` calls succeeded (the C library is glibc); False elsewhere
        (macOS, musl), where nothing is changed.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc: nothing to set
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))

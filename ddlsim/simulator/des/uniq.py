"""``np.unique`` for the DES's many tiny arrays: the same results, without numpy's per-call
overhead (``np.unique`` spends several microseconds in Python checks before it sorts; a DES
run calls these tens of thousands of times on arrays of a handful of values). Sort, mark the
first of each run of equal values, and read the runs off: the values ascending, as numpy
returns them."""

from __future__ import annotations

import numpy as np

__all__ = ["unique_counts", "unique_inverse", "unique_values"]


def _runs(sorted_a: np.ndarray) -> np.ndarray:
    """Boolean mask of the first element of each run of equal values in ``sorted_a``."""
    first = np.empty(len(sorted_a), dtype=bool)
    first[:1] = True
    np.not_equal(sorted_a[1:], sorted_a[:-1], out=first[1:])
    return first


def unique_values(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` (``a`` flattened)."""
    a = np.sort(a, axis=None)
    return a[_runs(a)] if len(a) else a


def unique_counts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_counts=True)`` (``a`` flattened)."""
    a = a.ravel()
    n = len(a)
    if not n:
        return a.copy(), np.zeros(0, dtype=np.intp)
    if a[0] == a[-1] and (a == a[0]).all():
        return a[:1].copy(), np.array([n], dtype=np.intp)
    a = np.sort(a)
    starts = np.flatnonzero(_runs(a))
    counts = np.empty(len(starts), dtype=np.intp)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = n - starts[-1]
    return a[starts], counts


def unique_inverse(a: np.ndarray, lut: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for a 1-d ``a``.

    With ``lut``, a scratch integer array longer than ``a.max()``, non-negative integers
    dense enough in ``range(len(lut))`` are counted instead of sorted (the DES's link ids:
    an all-to-all's routes list each link hundreds of times)."""
    n = len(a)
    if lut is not None and n * 8 >= len(lut):
        values = np.flatnonzero(np.bincount(a, minlength=len(lut)))
        lut[values] = np.arange(len(values))
        return values, lut[a]
    if n and a[0] == a[-1] and (a == a[0]).all():
        return a[:1].copy(), np.zeros(n, dtype=np.intp)
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = _runs(s)
    inverse = np.empty(n, dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    return s[first], inverse

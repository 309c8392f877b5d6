"""``np.unique`` for the DES's many tiny arrays: the same results, without numpy's per-call
overhead (``np.unique`` spends several microseconds in Python checks before it sorts; a DES
run calls these tens of thousands of times on arrays of a handful of values). Sort, mark the
first of each run of equal values, and read the runs off: the values ascending, as numpy
returns them."""

from __future__ import annotations

import numpy as np

__all__ = ["unique_counts", "unique_inverse", "unique_rows", "unique_values"]


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


def unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_counts=True)`` for a 2-d array of non-negative
    integers: each row packed into one int64 in mixed radix (column c's digit below its
    largest value + 1, so the packed order is the rows' lexicographic order) and the packed
    keys sorted, instead of a sort of structured rows (a template at 131,072 GPUs has 10^6
    rows); numpy's own where the packed key would not fit."""
    if not keys.size or keys.min() < 0:
        return np.unique(keys, axis=0, return_counts=True)
    radix = (keys.max(axis=0) + 1).tolist()
    if np.prod([float(r) for r in radix]) >= 2.0 ** 62:
        return np.unique(keys, axis=0, return_counts=True)
    packed = keys[:, 0].astype(np.int64)
    for c in range(1, keys.shape[1]):
        packed = packed * radix[c] + keys[:, c]
    values, counts = unique_counts(packed)
    rows = np.empty((len(values), keys.shape[1]), dtype=keys.dtype)
    for c in range(keys.shape[1] - 1, 0, -1):
        values, rows[:, c] = np.divmod(values, radix[c])
    rows[:, 0] = values
    return rows, counts

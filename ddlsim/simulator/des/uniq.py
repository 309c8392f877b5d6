"""``np.unique`` for the DES's many tiny arrays: the same results, without numpy's per-call
overhead when there is nothing or only one distinct value (most submissions and completions
touch one domain, most phases end for instances of one latency)."""

from __future__ import annotations

import numpy as np

__all__ = ["unique_counts", "unique_inverse"]


def unique_counts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_counts=True)`` (``a`` flattened)."""
    a = a.ravel()
    if len(a) and a[0] == a[-1] and (a == a[0]).all():
        return a[:1].copy(), np.array([len(a)], dtype=np.intp)
    return np.unique(a, return_counts=True)


def unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for a 1-d ``a``."""
    if len(a) and a[0] == a[-1] and (a == a[0]).all():
        return a[:1].copy(), np.zeros(len(a), dtype=np.intp)
    return np.unique(a, return_inverse=True)

"""NCCL's time on arrays of sizes (the search's vectorised collectives): :func:`nccl_seconds_array`
evaluates :class:`.model.NcclForm`'s size-independent parts with the same arithmetic, in the same
order, as the scalar :func:`.model.nccl_time`.
"""

from __future__ import annotations

import numpy as np

from . import tuning as T

__all__ = ["nccl_seconds_array"]


def nccl_seconds_array(n, latency_us_, plateau_latency_us, plateau_div, algbw, proto=None,
                       fill_edges=None, fill_us_=None, fill_slope=None, channel_bytes=None,
                       channels=None):
    """:func:`nccl_time` on arrays: ``n`` bytes, and the :class:`NcclForm` parts per element
    (arrays or scalars that broadcast with ``n``); ``proto`` names the tree-correction table
    to apply (None: no correction); ``fill_edges`` and ``fill_us_`` the form's fill (one
    array per edge and per fill; None: no fill), ``fill_slope`` its cap in µs per byte (None
    or ``inf``: none), ``channel_bytes`` and ``channels`` the channels NCCL drops for small
    messages (None: none). The same arithmetic as the scalar code, in
    the same order (``tests/test_nccl_vector.py`` checks equality on a dense set of sizes)."""
    n = np.asarray(n, dtype=float)
    bw = np.asarray(algbw, dtype=float)
    if proto is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            log_size = np.where(n >= 64, np.floor(np.log2(np.maximum(n, 64.0) / 64)), -1.0)
        ok = (log_size >= 0) & (log_size < 23)
        table = np.asarray(T.TREE_CORRECTION[proto])
        bw = bw * np.where(ok, table[np.clip(log_size, 0, 22).astype(np.int64)], 1.0)
    if channel_bytes is not None:
        q, nch = np.asarray(channel_bytes, dtype=float), np.asarray(channels, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            used = np.where(q > 0, np.clip(np.floor(n / np.where(q > 0, q, 1.0)), 1.0, nch), nch)
        bw = bw * (used / nch)
    lat = np.where(n / plateau_div >= 64, plateau_latency_us, latency_us_)
    fill = 0.0
    if fill_edges is not None:
        level = sum((n >= np.asarray(e)).astype(np.int64) for e in fill_edges)
        fill = np.choose(level, [np.asarray(f, dtype=float) for f in fill_us_])
        if fill_slope is not None:
            slope = np.asarray(fill_slope, dtype=float)
            with np.errstate(invalid="ignore"):
                fill = np.where(np.isinf(slope), fill, np.minimum(fill, slope * n))
    return (lat + fill + n / (1e3 * bw)) * 1e-6

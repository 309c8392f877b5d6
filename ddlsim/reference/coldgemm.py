"""The reference run's GEMMs timed with their operands where the run has them: out of the
core's private caches.

``ddlsim calibrate compute``'s numpy benchmark times a shape by calling it again and again
on the same operands (:func:`~ddlsim.calibration.compute_bench.run_gemm_benchmark`: enough
calls for a millisecond per sample), so from the second call on its operands sit in the
core's L2. In a training iteration no GEMM meets its operands so: between two uses of a
tensor the layer's other ops stream megabytes through the core (the reference model's layer
writes about 20 MB of activations), and the weights were last touched by the previous
iteration's update. On this project's 2-core machine (2 MiB of L2 per core, lscpu) the
attention core's stacked per-head GEMMs ran 25-27 % slower with their operands evicted than
hot (``q @ kᵀ`` 0.81 → 1.01 ms, ``P · V`` 0.75 → 0.95 ms, least of 15, 2026-11-29), the
same as inside an iteration (1.04 and 0.89 ms); the linear layers' GEMMs 1-7 % slower. The
layout of the operands (``datt.T @ q`` on a transposed view, ``q``, ``k``, ``v`` as strided
views of the QKV output) made no difference alone (0.77 against 0.80 ms for ``dq`` of the
same shape, both hot).

So the interleaved job times each of the run's own shapes (:func:`~.machine.gemm_shapes`)
once per round, after a read of :func:`evict_bytes` bytes that pushes the operands out of
L2, in process CPU time: one call, one sample, as the run makes one call.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd

__all__ = ["EVICT_MIN_BYTES", "evict_bytes", "cold_gemm_round"]

#: bytes read between a shape's operands being written and its timed call, at least: 8× the
#: 4 MiB lscpu reports for this machine's two L2s together
EVICT_MIN_BYTES = 32 * 2 ** 20


def evict_bytes() -> int:
    """Bytes read to evict the operands: :data:`EVICT_MIN_BYTES`, or 8× the core's L2 where
    the C library reports a larger one (``sysconf(_SC_LEVEL2_CACHE_SIZE)``)."""
    try:
        l2 = int(os.sysconf("SC_LEVEL2_CACHE_SIZE"))
    except (ValueError, OSError):
        l2 = 0
    return max(EVICT_MIN_BYTES, 8 * l2)


def cold_gemm_round(shapes, seed: int, sweep: np.ndarray | None = None) -> pd.DataFrame:
    """One CPU-time sample per GEMM shape, its operands evicted first (module docstring), as
    rows of ``calibrate compute``'s table (one sample each: the interleaved job's statistics
    over the rounds make its columns).

    Parameters
    ----------
    shapes : list of tuple
        ``(m, n, k)`` or ``(m, n, k, batch)`` (``batch`` stacked GEMMs in one ``matmul``).
    seed : int
        Seed of the operands' values.
    sweep : numpy.ndarray, optional
        The float32 buffer read to evict them; a fresh one of :func:`evict_bytes` if None.

    Returns
    -------
    pandas.DataFrame
        :data:`~ddlsim.calibration.schema.COMPUTE_COLUMNS`, one row per shape, fp32.
    """
    from ..calibration.compute_bench import _frame, _gemm_dims, _row, _time_evicted, gemm_flops
    rng = np.random.default_rng(seed)
    if sweep is None:
        sweep = np.ones(evict_bytes() // 4, dtype=np.float32)
    rows = []
    for shape in shapes:   # one untimed call (BLAS's buffers set up), the sweep, one timed
        m, n, k, stack, dims = _gemm_dims(shape)
        a = rng.standard_normal((*stack, m, k), dtype=np.float32)
        b = rng.standard_normal((*stack, k, n), dtype=np.float32)
        seconds = _time_evicted(lambda: a @ b, sweep, 1, 1, time.process_time)
        rows.append(_row("numpy", f"numpy {np.__version__}", "cpu", "gemm", "fp32", dims,
                         gemm_flops(m, n, k) * dims.get("batch", 1), seconds))
    return _frame(rows)

"""Compute benchmarks: achieved FLOP/s of GEMMs (numpy, torch) and attention (torch SDPA).

FLOPs per call: GEMM ``C[m,n] = A[m,k]·B[k,n]`` does ``2·m·n·k`` (one multiply and one add
per term; the convention of vendor peak figures). Attention forward,
``softmax(Q·Kᵀ/√d)·V`` with batch *b*, heads *h*, sequence *s*, head size *d*, non-causal:
``4·b·h·s²·d`` (two matmuls of 2·s²·d each; softmax not counted), as in the FlashAttention
papers' FLOP accounting (T. Dao et al., 2022).

Each timed sample runs the call enough times to last ≥ 1 ms (timer resolution and dispatch
jitter), after ``warmup`` untimed calls; GPU work is synchronised before the clock is read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from .schema import COMPUTE_COLUMNS, CalibrationError, summarize

__all__ = ["gemm_flops", "attention_flops", "default_gemm_shapes", "default_attention_shapes",
           "run_gemm_benchmark", "run_attention_benchmark", "NUMPY_DTYPES", "TORCH_DTYPES"]

NUMPY_DTYPES = {"fp32": np.float32, "fp64": np.float64}
TORCH_DTYPES = ("fp32", "tf32", "fp16", "bf16")
_MIN_SAMPLE_S = 1e-3


def gemm_flops(m: int, n: int, k: int) -> float:
    """2·m·n·k FLOPs of one GEMM."""
    return 2.0 * m * n * k


def attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """4·b·h·s²·d FLOPs of one non-causal attention forward (softmax excluded)."""
    return 4.0 * batch * heads * seq * seq * head_dim


def default_gemm_shapes(max_dim: int = 2048, min_dim: int = 32) -> list[tuple[int, int, int]]:
    """Square GEMMs min_dim…max_dim (powers of two) and (s, 4s, s) transformer-FFN-like ones."""
    if not 1 <= min_dim <= max_dim:
        raise CalibrationError(f"need 1 <= min_dim <= max_dim, got {min_dim}, {max_dim}")
    dims = [2 ** i for i in range(int(math.log2(min_dim)), int(math.log2(max_dim)) + 1)]
    return [(s, s, s) for s in dims] + [(s, 4 * s, s) for s in dims if 4 * s <= max_dim]


def default_attention_shapes(max_seq: int = 2048) -> list[tuple[int, int, int, int]]:
    """(batch, heads, seq, head_dim): one batch of 8 heads of size 64, seq 128…max_seq."""
    return [(1, 8, s, 64) for s in (2 ** i for i in range(7, int(math.log2(max_seq)) + 1))]


def _time(fn: Callable[[], object], sync: Callable[[], None], warmup: int,
          reps: int, clock: Callable[[], float] | None = None) -> np.ndarray:
    clock = clock or time.perf_counter
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    t0 = clock()
    fn()
    sync()
    inner = max(1, min(1000, math.ceil(_MIN_SAMPLE_S / max(clock() - t0, 1e-9))))
    samples = np.empty(reps)
    for i in range(reps):
        t0 = clock()
        for _ in range(inner):
            fn()
        sync()
        samples[i] = max(clock() - t0, 1e-9) / inner
    return samples


def _time_evicted(fn: Callable[[], object], sweep: np.ndarray, warmup: int, reps: int,
                  clock: Callable[[], float] | None = None) -> np.ndarray:
    """Seconds of ``reps`` single calls of ``fn``, each after an untimed read of ``sweep``
    (the operands pushed out of the caches; :func:`run_gemm_benchmark`'s ``evict_bytes``)."""
    clock = clock or time.perf_counter
    for _ in range(max(warmup, 1)):
        fn()
    samples = np.empty(reps)
    for i in range(reps):
        float(sweep.sum())
        t0 = clock()
        fn()
        samples[i] = max(clock() - t0, 1e-9)
    return samples


def _row(backend: str, version: str, device: str, kind: str, dtype: str, dims: dict,
         flops: float, samples: np.ndarray) -> dict:
    stats = summarize(samples)
    reps = stats.pop("n")
    return {"backend": backend, "library_version": version, "device": device, "kind": kind,
            "dtype": dtype, **{k: dims.get(k, 0) for k in ("m", "n", "k", "batch", "heads",
                                                          "seq", "head_dim")},
            "flops": flops, **stats, "reps": reps,
            "flops_per_s": flops / stats["time_median_s"]}


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COMPUTE_COLUMNS))


def _torch(device: str):
    try:
        import torch
    except ImportError:
        raise CalibrationError("the torch compute backend needs PyTorch: pip install "
                               "'ddlsim[torch]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda: no CUDA device is visible to PyTorch")
    if device not in ("cpu", "cuda"):
        raise CalibrationError(f"device must be 'cpu' or 'cuda', got {device!r}")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return torch, sync, f"torch {torch.__version__} ({name})"


def _torch_dtype(torch, dtype: str, device: str):
    if dtype not in TORCH_DTYPES:
        raise CalibrationError(f"torch dtype {dtype!r} not supported; allowed: "
                               f"{', '.join(TORCH_DTYPES)}")
    if dtype == "tf32" and device != "cuda":
        raise CalibrationError("tf32 exists only on CUDA devices")
    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[dtype]


def _gemm_dims(shape: Sequence[int]) -> tuple[int, int, int, tuple[int, ...], dict]:
    """``(m, n, k)`` or ``(m, n, k, batch)``: the dimensions, the operands' stack shape
    (``(batch,)`` for a batched GEMM: ``batch`` independent calls in one numpy ``matmul``,
    as an attention core's per-head GEMMs) and the table's dimension columns."""
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise CalibrationError(f"a GEMM shape is (m, n, k) or (m, n, k, batch) of integers "
                               f">= 1, got {tuple(shape)!r}")
    m, n, k = (int(x) for x in shape[:3])
    if len(shape) == 3:
        return m, n, k, (), {"m": m, "n": n, "k": k}
    batch = int(shape[3])
    return m, n, k, (batch,), {"m": m, "n": n, "k": k, "batch": batch}


def run_gemm_benchmark(backend: str = "numpy", device: str = "cpu",
                       dtypes: Sequence[str] = ("fp32",),
                       shapes: Sequence[tuple[int, int, int]] | None = None, warmup: int = 2,
                       reps: int = 5, seed: int = 0,
                       progress: Callable[[str], None] | None = None,
                       clock: Callable[[], float] | None = None,
                       evict_bytes: int = 0) -> pd.DataFrame:
    """Time GEMMs over shapes × dtypes; one row of :data:`COMPUTE_COLUMNS` per pair. A shape
    is ``(m, n, k)``, or with numpy ``(m, n, k, batch)``: ``batch`` GEMMs in one ``matmul``
    of stacked operands (its row's ``flops`` are the stack's).

    ``clock`` (seconds) is wall time when None; ``time.process_time`` (numpy only) times
    the CPU this process got, which other processes taking turns on its core do not inflate
    (the closed loop on a shared machine, ddlsim/reference/interleaved.py).

    ``evict_bytes`` > 0 (numpy only): each sample is one call made after an untimed read of
    that many bytes, so the operands meet the GEMM out of the core's caches, as inside a
    training iteration (ddlsim/reference/coldgemm.py measured small stacked GEMMs 25-27 %
    slower so on a 2-core machine); 0 times repeated calls on operands left in cache."""
    shapes = list(shapes or default_gemm_shapes())
    if reps < 1 or warmup < 0:
        raise CalibrationError(f"need reps >= 1 and warmup >= 0, got {reps}, {warmup}")
    if evict_bytes < 0:
        raise CalibrationError(f"evict_bytes must be >= 0, got {evict_bytes}")
    if backend == "numpy":
        if device != "cpu":
            raise CalibrationError(f"the numpy backend runs on the CPU only, got {device!r}")
        return _frame(_numpy_gemms(dtypes, shapes, warmup, reps, seed, progress, clock,
                                   evict_bytes))
    if backend != "torch":
        raise CalibrationError(f"compute backend must be 'numpy' or 'torch', got {backend!r}")
    if evict_bytes:
        raise CalibrationError("evicting the operands (--evict) is for the numpy backend only: "
                               "a GPU's caches are not swept from the host here")
    if clock is not None:   # the device's work is timed on the host's wall clock, synced
        raise CalibrationError(f"clock {clock!r} is for the numpy backend only; the torch "
                               "backend times GEMMs in wall time (clock None)")
    return _frame(_torch_gemms(device, dtypes, shapes, warmup, reps, seed, progress))


def _numpy_gemms(dtypes, shapes, warmup: int, reps: int, seed: int, progress, clock,
                 evict_bytes: int = 0) -> list[dict]:
    """:func:`run_gemm_benchmark`'s rows with numpy on the CPU (stacked shapes allowed)."""
    rng, version, rows = np.random.default_rng(seed), f"numpy {np.__version__}", []
    sweep = np.ones(evict_bytes // 4, dtype=np.float32) if evict_bytes else None
    for dtype in dtypes:
        if dtype not in NUMPY_DTYPES:
            raise CalibrationError(f"numpy dtype {dtype!r} not supported; allowed: "
                                   f"{', '.join(NUMPY_DTYPES)}")
        for shape in shapes:
            m, n, k, stack, dims = _gemm_dims(shape)
            a = rng.standard_normal((*stack, m, k)).astype(NUMPY_DTYPES[dtype])
            b = rng.standard_normal((*stack, k, n)).astype(NUMPY_DTYPES[dtype])
            samples = (_time(lambda: a @ b, lambda: None, warmup, reps, clock) if sweep is None
                       else _time_evicted(lambda: a @ b, sweep, warmup, reps, clock))
            rows.append(_row("numpy", version, "cpu", "gemm", dtype, dims,
                             gemm_flops(m, n, k) * dims.get("batch", 1), samples))
            if progress:
                progress(f"{dtype} {m}x{n}x{k}" + (f" x{stack[0]}" if stack else ""))
    return rows


def _torch_gemms(device: str, dtypes, shapes, warmup: int, reps: int, seed: int, progress
                 ) -> list[dict]:
    """:func:`run_gemm_benchmark`'s rows with torch on ``device`` (single GEMMs only)."""
    torch, sync, version = _torch(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for dtype in dtypes:
        tdt = _torch_dtype(torch, dtype, device)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            for shape in shapes:
                m, n, k, stack, _ = _gemm_dims(shape)
                if stack:
                    raise CalibrationError("batched GEMM shapes are timed with the numpy "
                                           f"backend only, got {tuple(shape)!r}")
                a = torch.randn((m, k), generator=gen, device=device).to(tdt)
                b = torch.randn((k, n), generator=gen, device=device).to(tdt)
                samples = _time(lambda: a @ b, sync, warmup, reps)
                rows.append(_row("torch", version, device, "gemm", dtype,
                                 {"m": m, "n": n, "k": k}, gemm_flops(m, n, k), samples))
                if progress:
                    progress(f"{dtype} {m}x{n}x{k}")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    return rows


def run_attention_benchmark(device: str = "cpu", dtypes: Sequence[str] = ("fp32",),
                            shapes: Sequence[tuple[int, int, int, int]] | None = None,
                            warmup: int = 2, reps: int = 5, seed: int = 0,
                            progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Time ``torch.nn.functional.scaled_dot_product_attention`` (non-causal forward)."""
    torch, sync, version = _torch(device)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is None:
        raise CalibrationError(f"{version} has no scaled_dot_product_attention (torch >= 2.0)")
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for dtype in dtypes:
        tdt = _torch_dtype(torch, dtype, device)
        for b, h, s, d in list(shapes or default_attention_shapes()):
            q, k, v = (torch.randn((b, h, s, d), generator=gen, device=device).to(tdt)
                       for _ in range(3))
            samples = _time(lambda: sdpa(q, k, v), sync, warmup, reps)
            rows.append(_row("torch", version, device, "attention", dtype,
                             {"batch": b, "heads": h, "seq": s, "head_dim": d},
                             attention_flops(b, h, s, d), samples))
            if progress:
                progress(f"attention {dtype} b{b} h{h} s{s} d{d}")
    return _frame(rows)

"""Fit a device's fixed GEMM costs (``device.gemm_overhead``) to a measured GEMM sweep, and
show how the model does on the rows kept out of the fit.

Run (on any machine; the sweep comes from a GPU):

    python benchmarks/device/fit_gemm_overhead.py OUT/gemm.csv --system dgx-h100 \\
        [--software megatron-core-2024] [--dtype bf16] [--fit-min-dim 1024]

``OUT/gemm.csv`` is what ``benchmarks/device/h100_kernels.py`` writes (its shape grid and the
validation runs' own GEMMs), or a ``ddlsim calibrate compute --backend torch --device cuda``
CSV, or ``ddlsim/data/gemm_measured.csv`` itself (the default, its ``fit`` rows). Rows of
``--dtype`` with ``m = n >= --fit-min-dim`` and batch 1 are fitted (the K sweeps: they separate
the per-GEMM floor from the per-wave cost), every other row is held out. It prints the fitted
``gemm_overhead`` as a systems.yaml line, and the mean and worst error of the model with and
without it, per dtype, on the held-out rows. ddlsim's ceilings (``matmul_efficiency``) are held
fixed: measure them first if the device has none.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import ddlsim
from ddlsim.calibration.gemm_overhead import (GEMM_TABLE, fit_gemm_overhead, gemm_errors,
                                              read_gemm_table)
from ddlsim.simulator.kernels import kernel_device


def _device(system: str, software: str):
    cfg = {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                     "vocab_size": 1024, "max_position_embeddings": 2048},
           "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048},
           "system": {"preset": system, "nodes": 1, "devices_per_node": 1,
                      "software": software}}
    return kernel_device(ddlsim.load_config(cfg).system)


def _line(label: str, err: np.ndarray) -> str:
    worst = err[np.abs(err).argmax()]
    return f"{label:<28} n={len(err):3d}  mean |error| {np.abs(err).mean():6.1%}  worst {worst:+.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", nargs="?", default=str(GEMM_TABLE))
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--software", default="megatron-core-2024")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--fit-min-dim", type=int, default=1024)
    ap.add_argument("--source", default=None, help="only rows of this source")
    args = ap.parse_args(argv)
    points = read_gemm_table(args.table)
    if args.source:
        points = [p for p in points if p.source == args.source]
    dev = _device(args.system, args.software)
    if any(p.role == "fit" for p in points):
        fit = [p for p in points if p.role == "fit"]
    else:
        fit = [p for p in points if p.dtype == args.dtype and p.batch == 1
               and p.m == p.n >= args.fit_min_dim]
    held = [p for p in points if p not in fit and p.role != "reference"]
    if len(fit) < 2:
        sys.exit(f"error: {len(fit)} rows to fit ({args.dtype}, batch 1, m = n >= "
                 f"{args.fit_min_dim}); need at least two")
    over = fit_gemm_overhead(fit, dev)
    print(f"gemm_overhead: {{floor_s: {over.floor_s * 1e6:.2f} us, wave_s: "
          f"{over.wave_s * 1e6:.2f} us}}   # fitted to {len(fit)} rows of {args.table}")
    print(_line("fitted rows, with", gemm_errors(fit, dev, over)))
    for dtype in sorted({p.dtype for p in held}):
        rows = [p for p in held if p.dtype == dtype]
        print(_line(f"held-out {dtype}, without", gemm_errors(rows, dev, None)))
        print(_line(f"held-out {dtype}, with", gemm_errors(rows, dev, over)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

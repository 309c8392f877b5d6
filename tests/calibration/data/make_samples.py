"""Regenerate the sample results files of this directory (python make_samples.py).

The files are *synthetic*: laid out exactly as nccl-tests (text and ``-J`` JSON, schema of
src/util.cu, JSON_FILE_VERSION 3) and the OSU micro-benchmarks 5.x/7.x print them, with
values drawn from the piecewise α-β models below (deterministic noise, seed 1), so the
tests can check both the readers and what a fit recovers. They are not measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
RNG = np.random.default_rng(1)

# NVLink-like all_reduce on 8 ranks: (first size in bytes, alpha s, busbw B/s)
ALLREDUCE_8 = [(0, 11e-6, 20e9), (65536, 18e-6, 120e9), (4 << 20, 30e-6, 225e9)]
ALLGATHER_16 = [(0, 20e-6, 8e9), (1 << 20, 45e-6, 40e9)]       # 2 nodes x 8 ranks
REDUCESCATTER_16 = [(0, 22e-6, 8e9), (1 << 20, 50e-6, 38e9)]
OSU_ALLREDUCE_4 = [(0, 2.0e-6, 1.5e9), (8192, 6.0e-6, 4.0e9)]  # MPI, 4 ranks, 1 node


def model_s(size: float, segments, factor: float, noise: float = 0.015) -> float:
    alpha, busbw = [(a, b) for lo, a, b in segments if size >= lo][-1]
    return (alpha + size * factor / busbw) * float(np.exp(RNG.normal(0.0, noise)))


def fstr(value: float, width: int) -> str:  # nccl-tests getFloatStr
    for fmt in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(fmt) <= width:
            return fmt
    return f"{value:{width}.1e}"


def nccl_body(t_us: float, size: int, factor: float, wrong: str = "0") -> str:
    algbw = size / t_us / 1e3  # GB/s
    return f"  {fstr(t_us, 7)}  {fstr(algbw, 6)}  {fstr(algbw * factor, 6)}  {wrong:>6}"


def all_reduce_text() -> None:
    n, factor = 8, 2 * 7 / 8
    lines = ["# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703",
             "# Collective test starting: all_reduce_perf",
             "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0",
             "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {4100 + r:6d} on  dgx-a01 device {r:2d} "
              f"[0000:{16 * r + 7:02x}:00] NVIDIA A100-SXM4-80GB" for r in range(n)]
    lines += ["#", "# synthetic ddlsim test fixture (see make_samples.py), not a measurement",
              "#                                                              out-of-place  "
              "                     in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
              "          (us)  (GB/s)  (GB/s)       "]
    size = 8
    while size <= 128 << 20:
        pre = f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
        oop, inp = (model_s(size, ALLREDUCE_8, factor) * 1e6 for _ in range(2))
        lines.append(pre + nccl_body(oop, size, factor) + nccl_body(inp, size, factor))
        size *= 2
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 78.4312 ", "#",
              "# Collective test concluded: all_reduce_perf", "#"]
    (HERE / "nccl_all_reduce_perf.txt").write_text("\n".join(lines) + "\n")


def all_gather_old_text() -> None:
    """Old layout (no root column, 'error' column, no program line), 16 ranks on 2 hosts."""
    n, factor = 16, 15 / 16
    lines = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 67108864 step: 4(factor) warmup "
             "iters: 5 iters: 50 validation: 1 ", "#", "# Using devices"]
    lines += [f"#   Rank {r:2d} Pid {7000 + r:6d} on {'node-%d' % (r // 8):>10} device "
              f"{r % 8:2d} [0x{16 * (r % 8) + 7:02x}] A100-SXM4-40GB" for r in range(n)]
    lines += ["node-0:7000:7000 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>",
              "node-0:7000:7000 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
              "#", "#                                                     out-of-place       "
              "                in-place          ",
              "#       size         count    type   redop     time   algbw   busbw  error     "
              "time   algbw   busbw  error",
              "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            "
              "(us)  (GB/s)  (GB/s)       ", ""]
    size = 1024
    while size <= 64 << 20:
        pre = f"{size:12d}  {size // 4 // n:12d}  {'float':>6}  {'none':>6}"
        oop, inp = (model_s(size, ALLGATHER_16, factor) * 1e6 for _ in range(2))
        lines.append(pre + nccl_body(oop, size, factor, "0e+00")
                     + nccl_body(inp, size, factor, "0e+00"))
        size *= 4
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.4402 ", "#", ""]
    (HERE / "nccl_all_gather.txt").write_text("\n".join(lines) + "\n")


def reduce_scatter_json() -> None:
    n, factor = 16, 15 / 16
    results, size = [], 4096
    while size <= 256 << 20:
        rec = {"size": size, "count": size // 4 // n, "type": "float", "redop": "sum",
               "root": "    -1"}
        for variant in ("out_of_place", "in_place"):
            t = model_s(size, REDUCESCATTER_16, factor) * 1e6
            rec[variant] = {"time": round(t, 2), "alg_bw": round(size / t / 1e3, 2),
                            "bus_bw": round(size / t / 1e3 * factor, 2), "nwrong": 0.0}
        if size in (4096, 1 << 20):
            times = [round(model_s(size, REDUCESCATTER_16, factor) * 1e6, 3) for _ in range(10)]
            rec["out_of_place_per_iter"] = {
                "skipped_iterations": 0, "min_us": min(times), "max_us": max(times),
                "avg_us": round(float(np.mean(times)), 3),
                "p50_us": round(float(np.median(times)), 3), "p95_us": max(times),
                "p99_us": max(times), "stdev_us": round(float(np.std(times)), 3),
                "cv_pct": 1.5, "times_us": times}
        rec.update(actual_iterations=10, experiment_name="")
        results.append(rec)
        size *= 4
    doc = {"version": 3, "start_time": "2025-06-02 10:14:03",
           "args": ["/opt/nccl-tests/build/reduce_scatter_perf", "-b", "4K", "-e", "256M", "-f",
                    "4", "-n", "10", "-J", "rs.json"],
           "env": ["NCCL_DEBUG=WARN"], "nccl_version": 22703,
           "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 4096,
                      "maximum_bytes": 268435456, "step_factor": 4, "warmup_iters": 5,
                      "iterations": 10, "aggregated_iterations": 1, "validation": 1,
                      "graph": 0, "blocking_collectives": "false",
                      "devices": [{"rank": r, "group": 0, "pid": 9000 + r,
                                   "hostname": f"h100-{r // 8}", "device": r % 8,
                                   "device_hex": "0000:18:00",
                                   "device_info": "NVIDIA H100 80GB HBM3"} for r in range(n)]},
           "results": results,
           "out_of_bounds": {"count": 0, "okay": "true"},
           "average_bus_bandwidth": {"bandwidth": 21.7, "okay": "unchecked"},
           "errors": [], "end_time": "2025-06-02 10:14:09",
           "comment": "synthetic ddlsim test fixture (see make_samples.py), not a measurement"}
    (HERE / "nccl_reduce_scatter.json").write_text(json.dumps(doc, indent=1) + "\n")


def osu_files() -> None:
    lines = ["# synthetic ddlsim test fixture (see make_samples.py), not a measurement", "",
             "# OSU MPI Allreduce Latency Test v7.3", "# Datatype: MPI_CHAR.",
             "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"]
    size = 4
    while size <= 1 << 20:
        t = model_s(size, OSU_ALLREDUCE_4, 2 * 3 / 4) * 1e6
        iters = 1000 if size <= 8192 else 100
        lines.append(f"{size:<10d}{t:>18.2f}{t * 0.8:>18.2f}{t * 1.3:>18.2f}{iters:>12d}")
        size *= 2
    (HERE / "osu_allreduce.txt").write_text("\n".join(lines) + "\n")

    lines = ["", "# OSU MPI Latency Test v7.3", "# Datatype: MPI_CHAR.",
             "# Size          Latency (us)"]
    size = 1
    while size <= 1 << 22:
        t = (0.25e-6 + size / 9e9 if size < 16384 else 2.5e-6 + size / 12e9) * 1e6
        lines.append(f"{size:<10d}{t * float(np.exp(RNG.normal(0, 0.01))):>18.2f}")
        size *= 2
    (HERE / "osu_latency.txt").write_text("\n".join(lines) + "\n")

    lines = ["# OSU MPI Bandwidth Test v7.3", "# Datatype: MPI_CHAR.",
             "# Size      Bandwidth (MB/s)"]
    size = 1
    while size <= 1 << 22:
        bw = size / (0.25e-6 + size / 11e9) / 1e6
        lines.append(f"{size:<10d}{bw:>18.2f}")
        size *= 2
    (HERE / "osu_bw.txt").write_text("\n".join(lines) + "\n")

    lines = ["", "# OSU MPI Allgather Latency Test v5.6.3", "# Size       Avg Latency(us)"]
    for size in (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536):
        lines.append(f"{size:<10d}{(3e-6 + size * 4 / 2e9) * 1e6:>18.2f}")
    (HERE / "osu_allgather.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    all_reduce_text()
    all_gather_old_text()
    reduce_scatter_json()
    osu_files()

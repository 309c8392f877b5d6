"""Predicted vs published per-GPU throughput for Megatron-LM's Table 1 (Narayanan et al. 2021).

Run:  python benchmarks/validate_megatron.py [--engine analytical|des] [--markdown]

The same assumptions hold for every row (no per-row factors): micro-batch size 1, the
non-interleaved 1F1B schedule, full activation recomputation, fp16, gradients all-reduced after
the backward pass (Megatron-LM 2021 did not overlap them), DGX-A100 nodes, data-parallel size
= GPUs / (TP · PP). Table 1 does not list micro-batch sizes or schedules; these are the
Megatron-LM defaults of the time.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import ddlsim

TABLE = Path(__file__).with_name("data") / "megatron_table1.csv"


def rows() -> list[dict]:
    lines = [ln for ln in TABLE.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def config(row: dict) -> dict:
    tp, pp, gpus = int(row["tp"]), int(row["pp"]), int(row["gpus"])
    return {
        "model": row["model"],
        "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                     "data_parallel_size": gpus // (tp * pp), "schedule": "1f1b",
                     "overlap_grad_reduce": False},
        "train": {"micro_batch_size": 1, "global_batch_size": int(row["batch"]),
                  "seq_length": 2048, "dtype": "fp16", "recompute": "full"},
        "system": {"preset": "dgx-a100", "nodes": gpus // 8},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="analytical", choices=["analytical", "des"])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    out = []
    for row in rows():
        r = ddlsim.predict(config(row), args.engine)
        pub = float(row["tflops_per_gpu"])
        out.append((row, r, pub, (r.tflops_per_device - pub) / pub))
    if args.markdown:
        print("| model | TP | PP | GPUs | batch | published TFLOP/s | predicted TFLOP/s | error | iteration (s) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row, r, pub, err in out:
            print(f"| {row['model']} | {row['tp']} | {row['pp']} | {row['gpus']} | {row['batch']} | "
                  f"{pub:.0f} | {r.tflops_per_device:.1f} | {100 * err:+.1f}% | {r.iteration_time_s:.2f} |")
    else:
        print(f"{'model':<16}{'TP':>4}{'PP':>4}{'GPUs':>6}{'batch':>6}{'published':>11}"
              f"{'predicted':>11}{'error':>8}")
        for row, r, pub, err in out:
            print(f"{row['model']:<16}{row['tp']:>4}{row['pp']:>4}{row['gpus']:>6}{row['batch']:>6}"
                  f"{pub:>11.0f}{r.tflops_per_device:>11.1f}{100 * err:>+7.1f}%")
    worst = max(abs(e) for *_, e in out)
    mean = sum(abs(e) for *_, e in out) / len(out)
    print(f"\nmean |error| {100 * mean:.1f}%, worst {100 * worst:.1f}% ({args.engine} engine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

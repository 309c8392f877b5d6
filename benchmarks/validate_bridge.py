"""Predicted vs published iteration time of Megatron-Bridge's FP8 Llama runs on DGX H100.

Run:  python benchmarks/validate_bridge.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published rows (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary*.md, NeMo containers
25.09, 25.11 and 26.02, DGX-H100, FP8 current scaling: Llama 3 70B on 64 GPUs and Llama 3.1
405B on 1,024 GPUs) and their provenance are in ``data/bridge_h100_fp8.csv``; the settings the
tables leave out, read from that repository's performance recipes at the same releases, are in
``data/bridge_h100_settings.csv``. The rows are predicted exactly as ``validate_h100.py``
predicts NeMo 24.07's (``dgx-h100``, ``megatron-core-2024`` stack, the same config mapping and
the same marks), and 405B with Megatron-Core's uneven pipeline split (embedding and loss
counted as layers: 126 layers on PP 8 × VPP 8). No per-row factors and nothing tuned.
"""

from __future__ import annotations

import sys

from public_runs import DATA, run_script

import validate_h100 as h100

TABLE = DATA / "bridge_h100_fp8.csv"
SETTINGS = DATA / "bridge_h100_settings.csv"


def rows() -> list[dict]:
    """The table's rows joined with their model's settings."""
    return h100.rows(TABLE, SETTINGS)


def evaluate(engine: str = "analytical", limits=None) -> list[dict]:
    return h100.evaluate(engine, rows(), limits)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_bridge", __doc__, argv, evaluate, h100._print, h100.summary)


if __name__ == "__main__":
    sys.exit(main())

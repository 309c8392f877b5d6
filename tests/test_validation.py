"""Accuracy against published measurements (docs/validation.md is produced by the same script).

Megatron-LM Table 1 is run with the settings of the paper's own script
(``examples/sc21/run_table_1.sh``; benchmarks/data/megatron_sc21_table1.csv cites each).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "validate_megatron", Path(__file__).parents[1] / "benchmarks" / "validate_megatron.py")
vm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vm)

ROWS = {r["model"]: r for r in vm.rows()}


@pytest.fixture(scope="module")
def evaluated():
    return {o["row"]["model"]: o for o in vm.evaluate("analytical")}


def test_settings_are_the_sc21_scripts():
    """Hand-read from run_table_1.sh and megatron/arguments.py at commit 6985e58."""
    small = vm.config(ROWS["megatron-1.7b"])  # lines 14-24: TP 1, PP 1, MBS 16, GBS 512, 4 nodes
    assert small["train"]["micro_batch_size"] == 16
    assert small["parallel"]["data_parallel_size"] == 32          # 4 nodes × 8 / (1 · 1)
    assert small["parallel"]["overlap_grad_reduce"] is True       # DDP=torch
    assert small["parallel"]["schedule"] == "1f1b"
    assert small["model"]["vocab_size"] == 50304                  # 50257 rounded up to 128 · 1
    assert small["train"]["recompute"] == "full" and small["train"]["dtype"] == "fp16"
    big = vm.config(ROWS["megatron-529.6b"])  # lines 102-112: PP 35, 105 layers, 1 per virtual
    assert big["parallel"]["schedule"] == "interleaved"
    assert big["parallel"]["virtual_pipeline_model_parallel_size"] == 3   # 105 / 35 / 1
    assert big["parallel"]["data_parallel_size"] == 9              # 315 · 8 / (8 · 35)
    assert big["parallel"]["overlap_grad_reduce"] is False         # DDP=local
    assert big["model"]["vocab_size"] == 51200                     # 50257 rounded up to 1024
    assert vm.virtual_stages(ROWS["megatron-76.1b"]) == 3          # 60 / 4 / 5
    assert vm.virtual_stages(ROWS["megatron-1t"]) is None          # no interleaving given


def test_paper_flops_is_eq3():
    """Eq. (3) = 4 forward passes of the layers (forward, recompute, backward = 2×) plus
    3 of the logits: 4·B·l·(24·s·h² + 4·s²·h) + 3·2·B·s·h·V."""
    row = ROWS["megatron-1.7b"]
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    by_hand = 4 * B * l * (24 * s * h * h + 4 * s * s * h) + 6 * B * s * h * V
    assert vm.paper_flops(row) == pytest.approx(by_hand, rel=1e-12)


def test_refused_row_is_marked_not_dropped():
    """An 18.4 B model unsharded (TP 1, PP 1) needs ≥ 16 B/parameter of weights, gradients
    and Adam state ≈ 295 GB, over an A100's 80 GB: the row comes back marked, with the reason."""
    row = {**ROWS["megatron-18.4b"], "tp": "1", "global_batch": "2048"}
    result, refused = vm.predict_row(row, "analytical")
    assert not result.fits
    assert "does not fit" in refused


def test_megatron_table1_regression_bound(evaluated):
    """Today's model with the sc21 settings and the megatron-lm-2021 stack: no row beyond
    ±6 %, mean |error| ≤ 3.5 % (docs/validation.md records 4.8 % worst, 2.57 % mean, signed
    −0.6 %: the stack's GEMMs run at the A100's ceiling measured with CUDA 11's cuBLAS, see
    docs/compute.md; +16.6 % worst and 12.2 % mean, every row optimistic, with the 2025 cuBLAS
    ceiling). A change that makes Table 1 worse than that fails here."""
    assert not any(o["skipped"] or o["refused"] for o in evaluated.values())
    errors = [o["error"] for o in evaluated.values()]
    assert all(abs(e) <= 0.06 for e in errors), errors
    assert sum(abs(e) for e in errors) / len(errors) <= 0.035


def test_megatron_table1_issue_target(evaluated):
    """Issue 11's target: every row within 5 %, mean |error| ≤ 3 % (docs/validation.md
    records 4.8 % worst and 2.57 % mean: little margin, so a change that moves Table 1 the
    wrong way by a tenth of a percent fails here and must say why)."""
    errors = [o["error"] for o in evaluated.values()]
    assert all(abs(e) <= 0.05 for e in errors)
    assert sum(abs(e) for e in errors) / len(errors) <= 0.03

"""Accuracy against published measurements (docs/validation.md is produced by the same script)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import ddlsim

spec = importlib.util.spec_from_file_location(
    "validate_megatron", Path(__file__).parents[1] / "benchmarks" / "validate_megatron.py")
vm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vm)


@pytest.mark.parametrize("row", vm.rows(), ids=lambda r: r["model"])
def test_megatron_table1_within_10_percent(row):
    r = ddlsim.predict(vm.config(row))
    published = float(row["tflops_per_gpu"])
    assert r.tflops_per_device == pytest.approx(published, rel=0.10)

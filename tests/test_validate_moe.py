"""benchmarks/validate_moe.py: Megatron-Bridge's published MoE rows on DGX H100, their
provenance, and their plans as ddlsim reads them (parallel folding: EP over TP x DP)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

import ddlsim

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))          # the scripts import their shared helper, public_runs
pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vm = _load("validate_moe")
pr = _load("public_runs")


def test_the_table_names_its_source_and_commit():
    text = pr.header(vm.TABLE)
    for cite in ("NVIDIA-NeMo/Megatron-Bridge", "performance-summary-archive.md", "DGX-H100",
                 "qwen3_workload_base_configs.py", "moe_router_force_load_balancing"):
        assert cite in text
    assert re.search(r"\b[0-9a-f]{40}\b", text)


def test_every_row_is_a_plan_ddlsim_reads_with_ep_folded_over_tp_and_dp():
    folded = 0
    for row in vm.rows():
        cfg = ddlsim.load_config(vm.config(row))
        tp, pp, ep = int(row["tp"]), int(row["pp"]), int(row["ep"])
        assert cfg.world_size == int(row["gpus"])
        # EP x expert TP 1 spans the TP x DP ranks of one stage (Qwen3-235B: 32 = 2 x 16)
        assert cfg.mesh.size("ep") * cfg.mesh.size("edp") == int(row["gpus"]) // pp
        assert cfg.mesh.size("etp") == 1 and tp * pp * cfg.dp == int(row["gpus"])
        folded += cfg.dp % ep != 0
    assert folded == 4      # Qwen3-235B: EP 32 does not divide DP 16 (2024's rule refuses it)


def test_the_script_runs_one_row(capsys):
    """Qwen3-30B-A3B on 16 H100s, PP2 × VP12, EP8 (26.02.01): published 1024·4096 /
    (9,058·16) = 28.94 s."""
    row = next(r for r in vm.rows() if r["release"] == "26.02.01" and r["gpus"] == "16")
    (rec,) = vm.evaluate("analytical", only=[row])
    assert rec["published"] == pytest.approx(1024 * 4096 / (9058 * 16))
    assert math.isfinite(rec["predicted"]) and rec["predicted"] > 0
    vm._print([rec], markdown=True)
    assert "| 26.02.01 | Qwen3_30B_a3B | 16 |" in capsys.readouterr().out

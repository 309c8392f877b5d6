"""benchmarks/validate_moe.py's long-context table: Megatron-MoE-ModelZoo's Qwen3-235B runs at
16k-128k tokens, published as TFLOP/s per GPU and turned into step times by Megatron-LM's FLOP
count (``validate_moe.megatron_flops``)."""

from __future__ import annotations

import pytest
from benchscripts import BENCH, load_script

vm = load_script("validate_moe")


def test_data_carries_its_provenance():
    text = (BENCH / "data" / "modelzoo_h100_moe_long_context.csv").read_text()
    for must in ("yanring/Megatron-MoE-ModelZoo", "c1ad0b5c", "Long Context", "e865051",
                 "--recompute-modules layernorm moe", "--moe-router-force-load-balancing",
                 "num_floating_point_operations"):
        assert must in text, must


def test_rows_are_the_table_cells():
    rows = vm.long_rows()
    assert [(r["seq"], r["cp"], r["routing"], r["tflops"]) for r in rows] == [
        ("16384", "1", "forced", "295"), ("32768", "2", "forced", "335"),
        ("65536", "4", "forced", "368"), ("131072", "8", "forced", "389"),
        ("16384", "1", "dropless", "237"), ("32768", "2", "dropless", "277"),
        ("65536", "4", "dropless", "320"), ("131072", "8", "dropless", "357")]
    assert all(r["modelled"] == "yes" for r in rows if r["routing"] == "forced")
    assert not any(r["modelled"] == "yes" for r in rows if r["routing"] == "dropless")


@pytest.mark.parametrize("row", vm.zoo_rows(), ids=lambda r: f"row{r['row']}")
def test_the_flop_count_gives_back_the_step_time_tables_tflops(row):
    """The ModelZoo's other table publishes both a step time and TFLOP/s per GPU: Megatron's
    count over (step time × 256 GPUs) gives its TFLOP/s column back within 0.6 %
    (row 1: 246.2 against 245; rounding of the published 19.7 s)."""
    tflops = vm.megatron_flops(row) / (float(row["step_time_s"]) * int(row["gpus"])) / 1e12
    assert tflops == pytest.approx(float(row["per_gpu_tflops"]), rel=0.006)


def test_the_16k_step_time_by_hand():
    """Qwen3-235B (h 4096, 64 heads of 128, 4 KV heads, 94 layers, 8 of 128 experts of 1536,
    vocabulary 151,936), GBS 256 of 16,384 tokens at 295 TFLOP/s on each of 256 GPUs."""
    t, sq = 256 * 16384, 256 * 16384 ** 2
    h, p = 4096, 2.0                                  # p = 128 · 64 / 4096
    layer = (4 * t * h * p * (h + h * 4 / 64) + 2 * sq * h * p
             + 4 * t * h * 1536 * 8 * 1.5)
    flops = 3 * (94 * layer + 2 * t * h * 151936)
    row = vm.long_rows()[0]
    assert vm.published_time(row) == pytest.approx(flops / (256 * 295e12), rel=1e-12)
    assert vm.published_time(row) == pytest.approx(11.37, abs=0.01)


def test_the_config_is_the_command():
    row = vm.long_rows()[3]                             # 128k, CP 8
    cfg = vm.config(row)
    par = cfg["parallel"]
    assert (par["tensor_model_parallel_size"], par["context_parallel_size"],
            par["expert_model_parallel_size"], par["pipeline_model_parallel_size"],
            par["virtual_pipeline_model_parallel_size"]) == (4, 8, 8, 8, 4)
    assert par["moe"]["token_dispatcher_type"] == "flex"
    assert par["moe"]["router_force_load_balancing"] is True
    assert cfg["train"]["recompute_modules"] == ["layernorm", "moe"]
    # the script raises the position limit to the sequence (sbatch_benchmarking.sh)
    assert cfg["model"] == {"preset": "qwen3-235b-a22b", "max_position_embeddings": 131072}
    assert vm.config(vm.long_rows()[0])["model"] == "qwen3-235b-a22b"     # 16k: 40,960 holds

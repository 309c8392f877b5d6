"""Per-tensor ZeRO-3 (the deepspeed-2021 stack, docs/overlap.md): which tensors a layer
gathers and reduce-scatters, derived by hand from DeepSpeed v0.3.13's rules, and its errors."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder.zero3 import FETCH_PASSES, REDUCE_PASSES, module_fetches
from ddlsim.workloads.models.decoder import DecoderShape

GPT3 = DecoderShape(layers=96, hidden=12288, heads=96, ffn=4 * 12288, vocab=51200,
                    max_positions=2048)
H = 12288
QKV, PROJ, FC = 3 * H * H, H * H, 4 * H * H


def test_gpt3_layer_gathers_its_four_weights_and_keeps_the_small_tensors():
    """Biases and LayerNorms (≤ 49,152 elements) are under the 1e5 persistence threshold: the
    forward gathers the four weight matrices; every tensor's gradient is reduce-scattered."""
    sw = resolve_software("deepspeed-2021")
    fetch = module_fetches(GPT3, 1, sw, full_recompute=False)
    assert fetch.forward == (QKV, PROJ, FC, FC)
    assert fetch.backward == fetch.forward
    assert len(fetch.reduce) == 12 and sum(fetch.reduce) == GPT3.dense_layer_params
    assert fetch.forward_passes == FETCH_PASSES * sum(fetch.forward)
    assert fetch.reduce_passes == REDUCE_PASSES * GPT3.dense_layer_params


def test_full_recompute_regathers_all_but_the_modules_reused_within_the_distance():
    """Under full recomputation the backward gathers each weight for the recomputed forward
    and again for its backward, except the second MLP GEMM (reused at distance 0). The first
    MLP GEMM's distance is twice the second's 604 M elements, over the 1e9 limit; with a
    limit of 1.3e9 it is kept too."""
    sw = resolve_software("deepspeed-2021")
    fetch = module_fetches(GPT3, 1, sw, full_recompute=True)
    assert fetch.backward == (QKV, QKV, PROJ, PROJ, FC, FC, FC)
    assert fetch.backward_passes == FETCH_PASSES * sum(fetch.backward)
    wider = resolve_software(SoftwareSpec(stack="deepspeed-2021",
                                          overlap={"zero3_max_reuse_distance": 1_300_000_000}))
    assert module_fetches(GPT3, 1, wider, True).backward == (QKV, QKV, PROJ, PROJ, FC, FC)


def test_tensor_parallel_shards_the_weights_and_replicates_the_norms():
    sw = resolve_software("deepspeed-2021")
    fetch = module_fetches(GPT3, 8, sw, full_recompute=False)
    assert fetch.forward == (QKV / 8, PROJ / 8, FC / 8, FC / 8)
    assert sum(fetch.reduce) == sum(sum(m) for m in GPT3.layer_modules(8))
    assert sum(sum(m) for m in GPT3.layer_modules(8)) * 8 > GPT3.dense_layer_params


def test_per_tensor_gathers_cost_more_than_per_layer_ones():
    """The same ZeRO-3 plan: one collective per tensor, gathered on demand, with the memory
    passes, is slower than today's DeepSpeed's per-module gathers one layer ahead."""
    data = {"model": "gpt3-13b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                      "recompute": "full"},
            "system": {"preset": "dgx-a100", "nodes": 2}}
    times = {}
    for stack in ("deepspeed", "deepspeed-2021"):
        cfg = build_config({**data, "system": {**data["system"], "software": stack}}, [])
        times[stack] = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert times["deepspeed-2021"] > 1.05 * times["deepspeed"]


def test_thresholds_without_module_hooks_are_refused():
    with pytest.raises(ConfigError, match="zero3_persistence_threshold = 10 applies to ZeRO-3 "
                                          "gathers from module hooks only.*stack "
                                          "'megatron-core-2024'"):
        resolve_software(SoftwareSpec(stack="megatron-core-2024",
                                      overlap={"zero3_persistence_threshold": 10}))


def test_todays_deepspeed_gathers_each_module_once_coalesced():
    """The deepspeed stack (DeepSpeed >= 0.6): one gather per module with a fetched tensor,
    the same re-gathers under recomputation, one reduce-scatter per module, and the
    gradients' six memory passes but no gather passes."""
    sw = resolve_software("deepspeed")
    assert sw.zero3_gather == "per_module"
    fetch = module_fetches(GPT3, 1, sw, full_recompute=True)
    assert fetch.forward == (QKV, PROJ, FC, FC)
    assert fetch.backward == (QKV, QKV, PROJ, PROJ, FC, FC, FC)
    assert fetch.reduce == tuple(sum(m) for m in GPT3.layer_modules(1))
    assert fetch.forward_passes == fetch.backward_passes == 0
    assert fetch.reduce_passes == REDUCE_PASSES * GPT3.dense_layer_params
    # a huge QKV bias (3h >= 1e5) is fetched with its weight, in the same collective
    wide = DecoderShape(layers=2, hidden=40960, heads=320, ffn=4 * 40960, vocab=51200,
                        max_positions=2048)
    h = 40960
    assert module_fetches(wide, 1, sw, False).forward[0] == 3 * h * h + 3 * h


def test_per_tensor_gathers_of_moe_layers_are_refused():
    data = {"model": "mixtral-8x7b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
            "system": {"preset": "dgx-h100", "nodes": 2, "software": "deepspeed-2021"}}
    cfg = build_config(data, [])
    with pytest.raises(ConfigError, match="per_tensor' is modelled for dense decoder layers"):
        ddlsim.predict(cfg, check_fit=False)


def test_presets_lists_how_each_stack_gathers_under_zero3():
    from typer.testing import CliRunner

    from ddlsim.cli import app
    res = CliRunner().invoke(app, ["presets", "software"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "deepspeed-2021" in line)
    assert "per tensor, on demand; kept under 1e+05 elements" in row
    assert "zero3_persistence_threshold=0" not in res.output


def test_thresholds_are_counts_written_as_deepspeed_configs_write_them():
    """``1e5`` (a float in YAML) is the whole number 100,000; a fraction or a boolean is
    refused with the field named."""
    sw = resolve_software(SoftwareSpec(stack="deepspeed-2021",
                                       overlap={"zero3_persistence_threshold": 1e5}))
    assert sw.zero3_persistence_threshold == 100_000
    for bad, why in ((1.5, "fractional part"), (True, "boolean"), (-1, "greater than or equal")):
        with pytest.raises(ValueError, match=why):
            SoftwareSpec(stack="deepspeed-2021", overlap={"zero3_max_reuse_distance": bad})

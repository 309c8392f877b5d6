"""Out-of-memory advice lists only changes valid for the plan, each with its memory."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import memory_alternatives, memory_per_device

BASE = {"model": "gpt3-175b",
        "parallel": {"tensor_model_parallel_size": 8},
        "train": {"micro_batch_size": 4, "global_batch_size": 64, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 4}}


def _cfg(*sets):
    return ddlsim.load_config(BASE, list(sets))


def test_zero3_plan_gets_no_more_zero_and_no_pipeline():
    # DeepSpeed: ZeRO-3 (megatron-core-2024, the default stack, shards no parameters)
    cfg = _cfg("parallel.zero_stage=3", "parallel.pipeline_model_parallel_size=1",
               "system.software=deepspeed")
    options = memory_alternatives(cfg, limit=20)
    text = " ".join(change for change, _ in options)
    assert "zero_stage" not in text                      # already the highest stage
    assert "pipeline_model_parallel_size" not in text    # ZeRO-3 forbids pipelining
    assert "recompute" in text and "micro_batch_size = 2" in text


def test_each_change_gives_the_memory_of_the_changed_config():
    cfg = _cfg("parallel.pipeline_model_parallel_size=2")
    now = memory_per_device(cfg).total
    options = memory_alternatives(cfg, limit=20)
    totals = [t for _, t in options]
    assert totals == sorted(totals) and all(t < now for t in totals)
    expected = {
        "recompute = 'full' (now 'none')": ["train.recompute=full"],
        "zero_stage = 1 (now 0)": ["parallel.zero_stage=1"],
        "micro_batch_size = 2 (now 4)": ["train.micro_batch_size=2"],
        "pipeline_model_parallel_size = 4 (now 2; data_parallel_size 1)":
            ["parallel.pipeline_model_parallel_size=4", "parallel.data_parallel_size=1"],
    }
    found = dict(options)
    for change, sets in expected.items():
        assert found[change] == memory_per_device(
            _cfg("parallel.pipeline_model_parallel_size=2", *sets)).total
    assert not any("zero_stage = 3" in c for c in found)  # pipelining forbids ZeRO-3


def test_changes_the_world_size_cannot_hold_are_not_offered():
    # 16 devices, TP 8 × PP 2 × DP 1: doubling TP or PP needs 32 devices; micro-batch 1 cannot
    # shrink; with DP 1 ZeRO saves nothing. What is left: recompute and sequence parallelism.
    cfg = _cfg("parallel.pipeline_model_parallel_size=2", "system.nodes=2",
               "train.global_batch_size=8", "train.micro_batch_size=1")
    changes = [c.split(" =")[0] for c, _ in memory_alternatives(cfg, limit=20)]
    assert sorted(changes) == ["recompute", "recompute", "sequence_parallel"]


def test_tensor_parallelism_must_divide_the_heads():
    # GPT-2 124M has 12 heads: TP 4 → 8 does not divide them, so it is not offered.
    cfg = ddlsim.load_config({"model": "gpt2-124m",
                              "parallel": {"tensor_model_parallel_size": 4},
                              "train": {"micro_batch_size": 1, "global_batch_size": 4,
                                        "seq_length": 1024},
                              "system": {"preset": "dgx-a100", "nodes": 2}})
    assert not any(c.startswith("tensor_model_parallel_size")
                   for c, _ in memory_alternatives(cfg, limit=20))


def test_the_error_lists_the_advice_with_memory_per_device():
    cfg = _cfg()
    with pytest.raises(ddlsim.PlanDoesNotFitError) as info:
        ddlsim.predict(cfg)
    message = str(info.value)
    assert "Changes valid for this plan, best first:" in message
    assert "GiB per device" in message and "--allow-oom" in message
    assert "zero_stage > " not in message


def test_spare_devices_allow_more_parallelism_at_the_same_data_parallelism():
    # 32 devices, a plan on 16 of them (TP 8 × PP 2 × DP 1): PP 4 fits the system.
    cfg = _cfg("parallel.pipeline_model_parallel_size=2", "parallel.data_parallel_size=1",
               "train.global_batch_size=8", "train.micro_batch_size=1")
    found = dict(memory_alternatives(cfg, limit=20))
    change = "pipeline_model_parallel_size = 4 (now 2) on 32 devices"
    assert found[change] == memory_per_device(
        _cfg("parallel.pipeline_model_parallel_size=4", "parallel.data_parallel_size=1",
             "train.global_batch_size=8", "train.micro_batch_size=1")).total


# ------------------------------------------------- context parallelism, the owner of the overflow
CP = "examples/cp-ring-llama3-8b-128k.yaml"
# 8 nodes × 8 = 64 ranks = TP8 · CP4 · PP1 · DP2 (32 layers, no recomputation: ~1 TiB/device)
CP_SETS = ["system.nodes=8", "parallel.data_parallel_size=2", "train.global_batch_size=8",
           "model.num_hidden_layers=32", "train.recompute=none"]


@pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")
def test_context_parallel_plans_keep_their_cp_axis_in_the_advice():
    # data parallelism left after doubling an axis on the same 64 ranks is 64 / (tp·cp·pp):
    # PP 2 → 64 / (8·4·2) = 1 and CP 8 → 64 / (8·8·1) = 1. Counting world / (tp·pp) instead
    # (64 / 16 = 4 for PP 2) asks for 8·4·2·4 = 256 ranks on 64 devices: the config refuses it
    # and the change was silently dropped.
    cfg = ddlsim.load_config(CP, CP_SETS)
    found = dict(memory_alternatives(cfg, limit=20))
    for change, sets in {
        "pipeline_model_parallel_size = 2 (now 1; data_parallel_size 1)":
            ["parallel.pipeline_model_parallel_size=2", "parallel.data_parallel_size=1"],
        "context_parallel_size = 8 (now 4; data_parallel_size 1)":
            ["parallel.context_parallel_size=8", "parallel.data_parallel_size=1"],
    }.items():
        assert found[change] == memory_per_device(ddlsim.load_config(CP, CP_SETS + sets)).total


def test_out_of_memory_names_the_kind_of_rank():
    # DLRM, table-wise over 2 ranks: rank 0 holds the 4e8-row table (4e8 · 128 · 4 B = 191 GiB
    # of fp32 weights), rank 1 the 1,000-row one: two kinds of rank, no pipeline stage.
    cfg = ddlsim.load_config({
        "model": {"preset": "dlrm-proxy", "tables": [{"rows": 400_000_000}, {"rows": 1000}]},
        "parallel": {"data_parallel_size": 2},
        "train": {"micro_batch_size": 4, "global_batch_size": 8, "seq_length": 1,
                  "dtype": "fp32", "optimizer": "sgd"},
        "system": {"preset": "dgx-a100", "nodes": 1}})
    with pytest.raises(ddlsim.PlanDoesNotFitError) as info:
        ddlsim.predict(cfg)
    message = str(info.value)
    assert "the most loaded of the 2 kinds of rank needs 191 GiB per device" in message
    assert "pipeline stage" not in message
    # one kind of rank (no pipeline): every rank; a pipeline: its stage (under 1F1B stage 0
    # holds min(p − s, m) = 2 micro-batches of activations, stage 1 one: stage 0 overflows)
    assert "every rank needs" in _oom_message(_cfg())
    assert "pipeline stage 0 needs" in _oom_message(_cfg("parallel.pipeline_model_parallel_size=2"))


def _oom_message(cfg) -> str:
    with pytest.raises(ddlsim.PlanDoesNotFitError) as info:
        ddlsim.predict(cfg)
    return str(info.value)

"""Each virtual pipeline stage's layers given outright (``parallel.layers_per_virtual_stage``,
ddlsim/workloads/decoder/split.py) and torchtitan's splits (ddlsim/importers/torchtitan_split.py)."""

from __future__ import annotations

import copy
import warnings

import pytest
from hypothesis import given, strategies as st

import ddlsim
from ddlsim.importers.torchtitan_split import (split_2024, split_2025, split_from_fqns,
                                               split_from_points, virtual_stages_2025)
from ddlsim.workloads.decoder.split import chunk_layers

#: Llama 3.1 8B cut to 10 layers, PP 2 × 2 virtual stages, FSDP, torchtitan of 2025
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 10},
        "parallel": {"zero_stage": 3, "pipeline_model_parallel_size": 2,
                     "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2025"}}


def config(split, stack=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel, layers_per_virtual_stage=split)
    if stack:
        d["system"]["software"] = stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def test_torchtitans_splits_of_llama_405b():
    """9dec370's generate_split_points and 07c00d9's generate_llm_fqn_per_model_part with
    the embedding and the output one layer each: 126 layers over 8 and over 16 stages."""
    for split in (split_2024, split_2025):
        assert split(126, 8) == [15] + [16] * 6 + [15]
        assert split(126, 16) == [7] + [8] * 14 + [7]
    # 07c00d9: 32 + 2 effective layers over 4 stages, 9 9 8 8, less the embedding and output
    assert split_2025(32, 4) == [8, 9, 8, 7]
    assert split_2024(32, 4) == [8, 8, 8, 8]
    # pipeline_parallel_layers_per_stage = 5: ceil(34 / 5) = 7 stages, not a multiple of 2
    with pytest.raises(ValueError, match="not a multiple"):
        virtual_stages_2025(32, 2, True, 5)
    assert virtual_stages_2025(32, 2, True, 9) == 4


def test_a_split_the_run_gives_itself():
    """9dec370's split points begin stages; 07c00d9's module names list each stage's."""
    assert split_from_points("layers.6,layers.16,layers.26", 32) == [6, 10, 10, 6]
    assert split_from_points(["layers.16"], 32) == [16, 16]
    with pytest.raises(ValueError, match="every stage needs a layer"):
        split_from_points(["layers.16", "layers.8"], 32)
    with pytest.raises(ValueError, match="not a transformer block's name"):
        split_from_points(["norm"], 32)
    parts = [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"],
             ["layers.3", "norm", "output"]]
    assert split_from_fqns(parts) == [1, 2, 1]


@given(st.integers(2, 200), st.integers(1, 40))
def test_torchtitans_splits_cover_every_layer(layers, stages):
    if stages <= layers:
        assert sum(split_2024(layers, stages)) == layers and min(split_2024(layers, stages)) > 0
    try:
        split = split_2025(layers, stages)
    except ValueError:
        return
    assert sum(split) == layers and len(split) == stages


def test_virtual_stage_k_is_chunk_k_div_pp_of_rank_k_mod_pp():
    cfg = config([2, 3, 4, 1])
    assert chunk_layers(cfg) == ((2, 4), (3, 1))


def test_the_default_is_the_stacks_own_split_and_another_one_moves_the_time():
    """On torchtitan-2025 a plan without a split gets torchtitan's own (8 layers over 4
    virtual stages: 2, 3, 2, 1; the stack's ``pipeline_split``), as given outright; the even
    split, given or as the stack's rule ``even``, times otherwise (until 2026-11-30 the
    default was the even one)."""
    d = copy.deepcopy(BASE)
    d["model"]["num_hidden_layers"] = 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = ddlsim.predict(d).iteration_time_s
        d["parallel"]["layers_per_virtual_stage"] = split_2025(8, 4)
        assert split_2025(8, 4) == [2, 3, 2, 1]
        assert ddlsim.predict(d).iteration_time_s == default
        d["parallel"]["layers_per_virtual_stage"] = [2, 2, 2, 2]
        even = ddlsim.predict(d).iteration_time_s
        assert even != default
        del d["parallel"]["layers_per_virtual_stage"]
        d["system"]["software"] = {"stack": "torchtitan-2025",
                                   "kernels": {"pipeline_split": "even"}}
        assert ddlsim.predict(d).iteration_time_s == even
    # the same 10 layers: rank 0 holds 4 + 4 of them in one split, 2 + 2 in the other
    assert ddlsim.predict(config([4, 1, 4, 1])).iteration_time_s > \
        ddlsim.predict(config([2, 3, 2, 3])).iteration_time_s


@pytest.mark.parametrize("split, match", [
    ([2, 3, 4], "has 3 numbers; .* 2 × 2 = 4 virtual stages"),
    ([2, 3, 4, 2], "adds up to 11 layers; model.num_hidden_layers = 10"),
])
def test_a_wrong_split_is_refused_by_name(split, match):
    with pytest.raises(ddlsim.ConfigError, match=match):
        ddlsim.predict(config(split))


def test_it_does_not_combine_with_megatrons_uneven_fields():
    with pytest.raises(ddlsim.ConfigError, match="cannot be set together with "
                                                 "account_for_embedding_in_pipeline_split"):
        ddlsim.predict(config([2, 3, 4, 1], account_for_embedding_in_pipeline_split=True))


def test_megatron_cannot_give_each_virtual_stage_its_layers():
    with pytest.raises(ddlsim.ConfigError, match="rule no_per_virtual_stage_split"):
        config([2, 3, 4, 1], stack="megatron-core-2025", zero_stage=1)


#: a 2024-format torchtitan config (9dec370 config_manager.py) with an interleaved schedule
TOML_2024 = """
[model]
name = "llama3"
flavor = "405B"
[training]
batch_size = 8
seq_len = 2048
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
[experimental]
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "Interleaved1F1B"
[activation_checkpoint]
mode = "full"
"""


@pytest.mark.parametrize("extra, split", [
    ("", [7] + [8] * 14 + [7]),                 # generate_split_points over 2 x 8 stages
    ("pipeline_parallel_split_points = '" + ",".join(f"layers.{8 * k}" for k in range(1, 16))
     + "'\n", [8] * 15 + [6]),
])
def test_a_2024_interleaved_config_imports_torchtitans_split(tmp_path, extra, split):
    from ddlsim.importers import import_config
    (tmp_path / "t.toml").write_text(TOML_2024.replace("[activation_checkpoint]",
                                                       extra + "[activation_checkpoint]"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = import_config([tmp_path / "t.toml"], system="dgx-h100", nodes=64).config
    p = cfg["parallel"]
    assert (p["schedule"], p["virtual_pipeline_model_parallel_size"]) == ("interleaved", 2)
    assert p["layers_per_virtual_stage"] == split
    assert cfg["train"]["micro_batch_size"] == 8 // 8     # pipeline_parallel_degree of them

"""Run-config validation: every rule gives a message naming the field, the value and what is allowed."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from tests.conftest import BASE


def cfg_with(**sections):
    d = copy.deepcopy(BASE)
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return d


def test_presets_resolve_and_dp_is_derived():
    c = ddlsim.load_config(BASE)
    assert c.dp == 2 and c.world_size == 8 and c.num_microbatches == 8
    assert c.model.name == "gpt3-1.3b" and c.system.name == "dgx-a100"


def test_units_are_parsed_at_the_edge():
    c = ddlsim.load_config(cfg_with(system={"preset": "dgx-a100", "nodes": 2,
                                            "nic": {"bandwidth_Bps": "100 Gb/s", "latency_s": "5 us"}}))
    assert c.system.nic.bandwidth_Bps == pytest.approx(12.5e9)
    assert c.system.nic.latency_s == pytest.approx(5e-6)


@pytest.mark.parametrize("sections, message", [
    ({"parallel": {"tensor_model_parallel_size": 3}},
     "model.num_attention_heads = 16 is not divisible by parallel.tensor_model_parallel_size = 3"),
    ({"parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                   "data_parallel_size": 4}},
     "TP·PP·DP = 2·2·4 = 16 ranks but the system 'dgx-a100' has 1 nodes × 8 = 8 devices"),
    ({"train": {"global_batch_size": 15}},
     "train.global_batch_size = 15 is not divisible by train.micro_batch_size × data_parallel_size = 1 × 2 = 2"),
    ({"parallel": {"tensor_model_parallel_size": 1, "sequence_parallel": True}},
     "sequence_parallel = true needs tensor_model_parallel_size > 1"),
    ({"parallel": {"pipeline_model_parallel_size": 2, "schedule": "interleaved",
                   "virtual_pipeline_model_parallel_size": 5}},
     "model.num_hidden_layers = 24 is not divisible by pipeline_model_parallel_size × "
     "virtual_pipeline_model_parallel_size = 2 × 5 = 10"),
    ({"parallel": {"schedule": "interleaved"}},
     "schedule = 'interleaved' needs virtual_pipeline_model_parallel_size >= 2 (got None)"),
    ({"parallel": {"zero_stage": 4}}, "parallel.zero_stage"),
    ({"parallel": {"schedule": "zigzag"}}, "'gpipe', '1f1b' or 'interleaved'"),
    ({"parallel": {"dp_strategy": "reduce_scatter", "zero_stage": 2}},
     "dp_strategy = 'reduce_scatter' is a plain data-parallel update and cannot combine with zero_stage = 2"),
    ({"parallel": {"zero_stage": 3, "pipeline_model_parallel_size": 2, "data_parallel_size": 1}},
     "software stack 'megatron-core-2024' cannot run ZeRO-3 (nothing in it shards the "
     "parameters: no FSDP of its own or of PyTorch's): parallel.zero_stage = 3 (rule no_zero3"),
    ({"parallel": {"tensor_model_parallelsize": 2}},
     "unknown key 'tensor_model_parallelsize' in parallel (did you mean "
     "'tensor_model_parallel_size'?); allowed keys:"),
    ({"train": {"seq_length": 4096}},
     "train.seq_length = 4096 exceeds model.max_position_embeddings = 2048"),
    ({"train": {"dtype": "fp8"}}, "train.dtype = 'fp8' has no peak FLOP/s on device 'A100-SXM4-80GB'"),
    ({"system": {"preset": "dgx-a100", "nic": {"bandwidth_Bps": "fast"}}},
     "cannot read 'fast' as a bandwidth"),
    ({"system": {"preset": "dgx-a100", "nodes": 0}}, "system.nodes: Input should be greater than 0"),
    ({"model": "gpt-5"}, "model preset 'gpt-5' does not exist"),
    ({"model": "gpt-5"}, "gpt2-1.5b, gpt2-124m, gpt2-355m"),
    ({"parallel": {"collective_algorithm": {"all_reduce": "butterfly"}}},
     "collective_algorithm.all_reduce = 'butterfly' is not an algorithm for all_reduce; allowed: auto, ring"),
])
def test_validation_messages(sections, message):
    with pytest.raises(ConfigError) as err:
        build_config(cfg_with(**sections))
    assert message in str(err.value)


def test_unknown_section_and_missing_section():
    with pytest.raises(ConfigError, match="unknown section 'hardware'"):
        build_config({**BASE, "hardware": {}})
    d = dict(BASE)
    d.pop("train")
    with pytest.raises(ConfigError, match="no 'train' section"):
        build_config(d)


def test_overrides_apply_and_reject_bad_paths():
    c = build_config(copy.deepcopy(BASE), ["parallel.tensor_model_parallel_size=4",
                                           "parallel.pipeline_model_parallel_size=1"])
    assert c.parallel.tp == 4 and c.dp == 2
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        build_config(copy.deepcopy(BASE), ["parallel.tp"])
    with pytest.raises(ConfigError, match="unknown section 'foo'; allowed: model, parallel, train, system"):
        build_config(copy.deepcopy(BASE), ["foo.bar=1"])


def test_fewer_ranks_than_devices_is_allowed():
    """The seed wiki runs 9 ranks on 5 two-rank nodes."""
    c = ddlsim.load_config("examples/wiki-gpt2-9ranks-reduce_broadcast.yaml")
    assert c.world_size == 9 and c.system.num_devices == 10


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ddlsim.load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ddlsim.load_config(bad)


@pytest.mark.parametrize("typed, preset", [("gpt-3-175b", "gpt3-175b"),
                                           ("Llama-3.1-8B", "llama-3.1-8b"),
                                           ("Qwen3_235B_A22B", "qwen3-235b-a22b"),
                                           ("DGX-H100", "dgx-h100")])
def test_a_preset_spelled_otherwise_resolves_to_the_one_it_names(typed, preset):
    """Case, hyphens and underscores aside, a name that matches one preset (or several
    names of one model: llama-3.1-8b and llama3.1-8b) is that preset (issue 28: the names
    users would guess)."""
    from ddlsim.presets import get_preset
    section = "system" if preset.startswith("dgx") else "model"
    got, want = get_preset(section, typed), get_preset(section, preset)
    assert {k: v for k, v in got.items() if k != "source"} == \
        {k: v for k, v in want.items() if k != "source"}


def test_a_name_that_matches_no_preset_is_still_refused_with_suggestions():
    from ddlsim.presets import get_preset
    with pytest.raises(ConfigError, match="model preset 'gpt-4' does not exist"):
        get_preset("model", "gpt-4")

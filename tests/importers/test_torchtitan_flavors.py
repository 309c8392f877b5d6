"""torchtitan's model flavors: each mapped flavor's shape equals its preset's in every
dimension (torchtitan 238fa99's args, transcribed in ``importers/torchtitan_flavors.SHAPES``),
and each flavor without an equal preset is refused with its reason."""

from __future__ import annotations

import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers import import_config
from ddlsim.importers.torchtitan_flavors import FLAVORS, REFUSED, SHAPES

#: the flavors torchtitan 238fa99 defines (qwen3/__init__.py qwen3_args, deepseek_v3/__init__.py
#: deepseekv3_args; debugmodel_flex_attn of deepseek_v3 is a test model too)
TORCHTITAN_QWEN3 = ("debugmodel", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "debugmodel_moe",
                    "30B-A3B", "235B-A22B")
TORCHTITAN_DEEPSEEK_V3 = ("16B", "236B", "671B")


def _model(preset: str, stack: str = "megatron-core-2024") -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config({"model": preset, "train": {
            "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}})
    return cfg.model.model_dump()


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_a_mapped_flavor_has_its_presets_shape_in_every_dimension(key):
    name, flavor = key
    shape, model = SHAPES[key], _model(FLAVORS[name][flavor])
    assert {k: model[k] for k in shape} == shape


def test_every_qwen3_flavor_is_mapped_or_refused_with_a_reason():
    mapped = {f for n, f in SHAPES if n == "qwen3"}
    assert mapped == set(FLAVORS["qwen3"])
    refused = {f for n, f in REFUSED if n == "qwen3"}
    assert mapped | refused == set(TORCHTITAN_QWEN3) and not mapped & refused
    assert {f for n, f in REFUSED if n == "deepseek_v3"} == set(TORCHTITAN_DEEPSEEK_V3)


def _toml(tmp_path, name: str, flavor: str):
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[training]\n'
                    'local_batch_size = 1\nseq_len = 4096\n[parallelism]\n'
                    'data_parallel_shard_degree = -1\n')
    return path


@pytest.mark.parametrize("flavor, preset", [("8B", "qwen3-8b"), ("14B", "qwen3-14b"),
                                            ("32B", "qwen3-32b")])
def test_a_qwen3_flavor_imports_as_its_preset(tmp_path, flavor, preset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = import_config([_toml(tmp_path, "qwen3", flavor)], system="dgx-h100",
                            nodes=4).config
    assert cfg["model"] == preset


def test_a_qwen3_moe_flavor_maps_and_the_stack_says_what_it_lacks(tmp_path):
    """The shape is the preset's; torchtitan-2025's stack entry has no MoE dispatcher, which
    the validation names (the flavor is not what is refused)."""
    with pytest.raises(ConfigError, match=r"token_dispatcher_type is unset and software stack "
                                          r"'torchtitan-2025'"):
        import_config([_toml(tmp_path, "qwen3", "235B-A22B")], system="dgx-h100", nodes=4)


@pytest.mark.parametrize("name, flavor, why", [
    ("qwen3", "4B", r"dim 2560, 36 layers, tied embeddings: no ddlsim preset has this shape"),
    ("deepseek_v3", "16B", r"FlexAttention with attn_mask_type 'block_causal'.*"
                           r"DeepSeek-V2-Lite's"),
    ("deepseek_v3", "236B", r"num_limited_groups"),
    ("qwen3", "72B", r"flavor = '72B': ddlsim knows the flavors llama3 8B.*qwen3 235B-A22B")])
def test_a_flavor_without_an_equal_preset_is_refused_with_why(tmp_path, name, flavor, why):
    with pytest.raises(ConfigError, match=why):
        import_config([_toml(tmp_path, name, flavor)], system="dgx-h100", nodes=4)


def test_the_refused_deepseek_16b_flavor_has_deepseek_v2_lites_shape_as_its_reason_says():
    """torchtitan 238fa99 deepseek_v3/__init__.py "16B": refused for its block-causal
    FlexAttention only; every dimension is the deepseek-v2-lite preset's."""
    titan_16b = {"vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
                 "moe_intermediate_size": 1408, "num_hidden_layers": 27,
                 "first_k_dense_replace": 1, "num_attention_heads": 16,
                 "num_local_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                 "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                 "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False}
    model = _model("deepseek-v2-lite", "megatron-core-2025")   # MLA: not in 2024's 900f1b76
    assert {k: model[k] for k in titan_16b} == titan_16b
    assert "DeepSeek-V2-Lite's" in REFUSED[("deepseek_v3", "16B")]

"""Today's model presets against their publishers' parameter counts, and the physics of their
attention variants (MLA's projections, query/key norms, sinks, sliding windows) against
formulas written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.attention import FLASH_BLOCK, flash_forward_flops
from ddlsim.simulator.kernels.window import band_tiles, window_fraction
from ddlsim.workloads.models.decoder import DecoderShape
from ddlsim.workloads.models.hf import from_hf_config, read_hf_config
from ddlsim.workloads.models.mla import MLA

HF = Path(__file__).resolve().parents[2] / "ddlsim" / "data" / "hf"


def shape(name: str) -> DecoderShape:
    return DecoderShape(**read_hf_config(HF / f"{name}.json")[0])


# (file, published total, published active, whether the publisher's active count leaves out
# the input embedding, the source of the figures)
PUBLISHED = [
    ("deepseek-v3", 671e9, 36.6e9, True,
     "DeepSeek-V3 README_WEIGHTS.md: 671B total, 36.6B activated incl. the 0.9B output head; "
     "technical report (arXiv:2412.19437) abstract: 671B, 37B"),
    ("qwen3-235b-a22b", 235e9, 22e9, False, "Qwen3-235B-A22B model card: 235B, 22B activated"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, False, "Qwen3-30B-A3B model card: 30.5B, 3.3B activated"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, True, "gpt-oss model card (arXiv:2508.10925) Table 1"),
    ("gpt-oss-20b", 20.91e9, 3.61e9, True, "gpt-oss model card (arXiv:2508.10925) Table 1"),
    ("mixtral-8x7b-v0.1", 47e9, 13e9, False,
     "Jiang et al. 2024, 'Mixtral of Experts' (arXiv:2401.04088) §2.1: 47B, 13B active"),
    ("mixtral-8x22b-v0.1", 141e9, 39e9, False,
     "Mixtral 8x22B model card / Mistral AI announcement: 141B, 39B active"),
]


def _digit(x: float) -> float:
    """One unit of the last significant digit of a published figure given to 2-4 digits."""
    for unit in (1e9, 1e8, 1e7):
        if abs(x / unit - round(x / unit)) < 1e-9:
            return unit
    raise AssertionError(x)


@pytest.mark.parametrize("name, total, active, no_embedding, source", PUBLISHED)
def test_parameter_counts_match_the_published_figures(name, total, active, no_embedding, source):
    """Within 1 %, or within one unit of the published figure's last digit where the figure is
    rounded coarser than that (Qwen3-30B-A3B's "3.3B activated": ours 3.353 B)."""
    sh = shape(name)
    ours_active = sh.active_params - (sh.vocab * sh.hidden if no_embedding else 0)
    for ours, published in ((sh.params, total), (ours_active, active)):
        tol = max(0.01 * published, _digit(published))
        assert abs(ours - published) <= tol, (name, ours, published, source)
    assert abs(sh.params - total) <= 0.01 * total   # totals are all within 1 %


def test_deepseek_v3_layer_by_hand():
    """One MLA block: q_a 7168·1536 + 1536 (norm) + q_b 1536·128·192 + kv_a 7168·576 + 512
    (norm) + kv_b 512·128·256 + o 128·128·7168 = 187,107,328; an MoE layer adds the router
    256·7168 + 256 (e_score_correction_bias), 257 experts of 3·7168·2048 and two norms."""
    sh = shape("deepseek-v3")
    attn = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 \
        + 128 * 128 * 7168
    assert attn == 187_107_328 == sh.attention_params
    assert sh.moe_layer_params == attn + 2 * 7168 + 256 * 7168 + 256 + 257 * 3 * 7168 * 2048
    assert sh.dense_layer_params == attn + 2 * 7168 + 3 * 7168 * 18432
    assert (sh.moe_layers, sh.dense_layers) == (58, 3)
    assert [sh.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]


def test_mla_flops_by_projection():
    """Forward FLOPs of MLA's projections for T tokens: 2T times each weight's size; the core
    multiplies 192-wide queries and keys and 128-wide values: 2·b·s²·a·(192 + 128)."""
    sh, b, s = shape("deepseek-v3"), 1, 4096
    g = sh.layer_gemm_flops(b, s, moe=True)
    T = b * s
    assert g["q"] == 2 * T * (7168 * 1536 + 1536 * 128 * 192)
    assert g["kv"] == 2 * T * (7168 * 576 + 512 * 128 * 256)
    assert g["proj"] == 2 * T * 128 * 128 * 7168
    assert g["attn_core"] == 2 * b * s * s * 128 * (192 + 128)


def test_mla_gemm_shapes_under_tensor_parallelism():
    """Megatron-Core's MLA: down projections replicated, up and output split by heads."""
    m = MLA(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            q_lora_rank=1536)
    g = m.gemms(100, 7168, 128, 4)
    assert g == {"q_down": (100, 1536, 7168), "q_up": (100, 128 * 192 / 4, 1536),
                 "kv_down": (100, 576, 7168), "kv_up": (100, 128 * 256 / 4, 512),
                 "proj": (100, 7168, 128 * 128 / 4)}


def test_qwen3_head_dim_and_qk_norm():
    """Qwen3-235B-A22B: 64 query heads of 128 (8,192 wide on a 4,096 hidden), 4 KV heads,
    q_norm and k_norm of 128 each."""
    sh = shape("qwen3-235b-a22b")
    assert (sh.q_width, sh.kv_width, sh.qk_norm) == (8192, 512, True)
    assert sh.attention_params == 4096 * (8192 + 2 * 512) + 8192 * 4096 + 2 * 128


def test_gpt_oss_biases_sinks_and_window():
    sh = shape("gpt-oss-120b")
    h, a, g, d = 2880, 64, 8, 64
    assert sh.attention_params == (h * a * d + a * d) + 2 * (h * g * d + g * d) \
        + (a * d * h + h) + a
    assert sh.mlp_params(2880) == 3 * h * 2880 + 2 * 2880 + h      # gate_up and down biases
    assert sh.router_params == h * 128 + 128
    assert (sh.sliding_window, sh.window_layers) == (128, 18)
    # half the layers see 128 keys, half all s: the mean keys per query
    assert sh.core_keys(4096) == (128 + 4096) / 2
    assert sh.layer_gemm_flops(1, 4096, moe=True)["attn_core"] == 4 * 4096 * 2112 * a * d


def test_band_tiles_by_hand():
    """s = 1024 (8 tiles of 128), window 128: query tile 0 meets key tile 0, every later one
    its own and the previous (the band's first key lies in it): 1 + 7·2 = 15 tiles; a window
    of 256 adds a third tile from query tile 2 on: 1 + 2 + 6·3 = 21."""
    assert band_tiles(1024, 128, 128) == 15
    assert band_tiles(1024, 256, 128) == 21
    assert window_fraction(1024, 4096, 128) == (8 + 1) / 16   # window ≥ s: causal
    assert window_fraction(1024, 128, 128) == 15 / 64


def test_flash_with_a_window_computes_the_band_only():
    full = flash_forward_flops(1, 64, 4096, 64)
    windowed = flash_forward_flops(1, 64, 4096, 64, window=128)
    assert windowed == 4.0 * 64 * 4096 * 4096 * 64 * band_tiles(4096, 128, FLASH_BLOCK) / 32**2
    assert windowed / full == pytest.approx(63 / 528)   # 63 of the causal 528 tiles


def test_llama_config_with_experts_warns_that_they_are_ignored():
    """Issue 31: a model_type llama config.json with num_local_experts is dense in transformers
    (LlamaForCausalLM reads no expert key): ddlsim counts it dense and says so."""
    doc = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
           "num_local_experts": 8, "num_experts_per_tok": 2}
    fields, unmodelled = from_hf_config(doc, source="cfg.json")
    assert "experts" not in fields
    assert [u.split(" ")[0] for u in unmodelled] == ["num_local_experts=8", "num_experts_per_tok=2"]
    assert "counts a dense model" in unmodelled[0]


@pytest.mark.parametrize("change, match", [
    ({"layer_types": ["sliding_attention"]}, "layer_types = .* a list of 2 entries"),
    ({"layer_types": ["full_attention", "local"]}, "layer_types"),
    ({"moe_layer_freq": 2}, "moe_layer_freq = 2 .*only 1"),
    ({"v_head_dim": None}, "'v_head_dim' is missing"),
])
def test_bad_variant_keys_are_refused(change, match):
    doc = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
           "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
           "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "first_k_dense_replace": 1, "sliding_window": 16}
    doc = {k: v for k, v in {**doc, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        from_hf_config(doc, source="cfg.json")


def test_moe_layers_per_chunk_follow_model_order():
    """DeepSeek-V3 on 16 stages of 4 layers but the last (1): layers 0-2 are dense, so stage 0
    holds 1 MoE layer; with two interleaved chunks per stage the model order is chunk-major
    (virtual stage k = chunk·PP + stage)."""
    from ddlsim.workloads.decoder.layerkinds import (chunk_first_layer, moe_layers_in_chunk,
                                                     moe_layers_in_stage)
    sh = shape("deepseek-v3")
    split = [[4]] * 15 + [[1]]
    assert [moe_layers_in_stage(sh, split, s) for s in (0, 1, 15)] == [1, 4, 1]
    assert sum(moe_layers_in_stage(sh, split, s) for s in range(16)) == sh.moe_layers == 58
    interleaved = [[2, 2], [2, 2]]
    assert [chunk_first_layer(interleaved, s, c) for s in (0, 1) for c in (0, 1)] == [0, 4, 2, 6]
    assert moe_layers_in_chunk(sh, interleaved, 1, 0) == 1      # layers 2 (dense) and 3


def test_attention_projections_of_mla_and_gqa():
    from ddlsim.workloads.decoder.layerkinds import attention_projections
    before, after = attention_projections(shape("deepseek-v3"))
    assert [(n, N, K) for n, N, K, _ in before] == [
        ("q_down", 1536, 7168), ("q_up", 128 * 192, 1536), ("kv_down", 576, 7168),
        ("kv_up", 128 * 256, 512)]
    assert after == (("proj", 7168, 128 * 128, True),)
    before, after = attention_projections(shape("qwen3-30b-a3b"))
    assert before == (("qkv", 32 * 128 + 2 * 4 * 128, 2048, False),)
    assert after == (("proj", 2048, 4096, True),)


def test_deepseek_v3_example_stage_zero_holds_the_dense_layers():
    """examples/deepseek-v3-h800.yaml (PP16, EP64): stage 0 runs DeepSeek-V3's three dense
    layers and one MoE layer, and holds the embedding, three dense layers, one MoE layer's
    non-expert part and 256/64 = 4 of its experts; stage 1 holds four MoE layers."""
    import warnings

    import ddlsim
    from ddlsim.workloads.decoder.builder import StageBuilder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(Path(__file__).resolve().parents[2] / "examples"
                                 / "deepseek-v3-h800.yaml")
    sh = cfg.model.shape()
    b = StageBuilder.from_config(cfg, sh)
    expert = sh.mlp_params(2048)
    moe_rank = sh.moe_layer_params - 256 * expert + 4 * expert
    assert b.stage_params(0) == sh.vocab * sh.hidden + 3 * sh.dense_layer_params + moe_rank
    assert b.stage_params(1) == 4 * moe_rank
    ops = b.layer_ops(False, 4, 1)
    assert [(o.payload.name, o.repeat) for o in ops] == [
        ("fwd.attn", 3), ("fwd.mlp", 3), ("fwd.elementwise", 3), ("layers.moe.fwd", 1)]


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b",
                                  "gpt-oss-120b", "gpt-oss-20b", "mistral-7b-v0.1"])
def test_config_json_round_trips_through_the_model_section(name):
    """A run config's ``hf_config`` becomes a ``llama`` model section (HuggingFace names):
    the section's shape is the file's, field for field."""
    import json

    from ddlsim.workloads.decoder import LlamaFamily, LlamaModel

    doc = json.loads((HF / f"{name}.json").read_text())
    section, _ = LlamaFamily().from_hf(doc, name)
    model = LlamaModel(name=name, **{k: v for k, v in section.items() if k != "architecture"})
    assert model.shape() == shape(name)


@pytest.mark.parametrize("change, match", [
    ({"qk_rope_head_dim": 64}, "describe Multi-head Latent Attention but kv_lora_rank"),
    ({"kv_lora_rank": 512, "qk_nope_head_dim": 128}, "needs qk_rope_head_dim, v_head_dim"),
    ({"window_layers": 2}, "window_layers = 2 needs sliding_window"),
    ({"sliding_window": 128, "window_layers": 9}, "window_layers = 9 exceeds"),
    ({"first_k_dense_replace": 1}, "describe Mixture-of-Experts layers"),
])
def test_bad_variant_fields_of_a_model_section(change, match):
    import ddlsim

    model = {"architecture": "llama", "num_hidden_layers": 4, "hidden_size": 512,
             "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 1000, **change}
    run = {"model": model, "parallel": {}, "train": {"micro_batch_size": 1,
           "global_batch_size": 8, "seq_length": 512}, "system": {"preset": "dgx-h100"}}
    with pytest.raises(ddlsim.ConfigError, match=match):
        ddlsim.load_config(run)

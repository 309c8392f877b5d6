"""DecoderShape and the HuggingFace config.json reader, against hand-derived counts.

Every pinned number below is derived in its comment from the formulas of
``ddlsim/workloads/models/decoder.py`` (docs/models.md), not copied from a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlsim.config import ModelConfig
from ddlsim.errors import ConfigError
from ddlsim.presets import get_preset, list_presets
from ddlsim.workloads.models.decoder import DecoderShape
from ddlsim.workloads.models.gpt import GPTShape
from ddlsim.workloads.models.hf import from_hf_config, read_hf_config, unmodelled_warning

HF = Path(__file__).resolve().parents[2] / "ddlsim" / "data" / "hf"


def hf(name: str) -> DecoderShape:
    fields, _ = read_hf_config(HF / name)
    return DecoderShape(**fields)


# ---------------------------------------------------------------- parameter counts
def test_llama2_7b_parameters():
    # L=32, h=4096, f=11008, V=32000, MHA, SwiGLU, RMSNorm, untied:
    # layer 4h² + 3hf + 2h = 67,108,864 + 135,266,304 + 8,192 = 202,383,360
    # 32 × 202,383,360 + 2·V·h (262,144,000) + final norm 4,096 = 6,738,415,616
    assert hf("llama-2-7b-hf.json").params == 6_738_415_616


def test_llama2_70b_parameters():
    # L=80, h=8192, a=64, g=8 (d=128, gd=1024), f=28672, V=32000:
    # attention 2h² + 2·h·gd = 134,217,728 + 16,777,216 = 150,994,944
    # MLP 3hf = 704,643,072; norms 2h = 16,384 → layer 855,654,400
    # 80 × 855,654,400 + 2·V·h (524,288,000) + 8,192 = 68,976,648,192
    assert hf("llama-2-70b-hf.json").params == 68_976_648_192


def test_llama3_8b_and_mistral_7b_parameters():
    # h=4096, g=8 (gd=1024), f=14336, L=32: attention 2h² + 2·h·1024 = 41,943,040,
    # MLP 3hf = 176,160,768, norms 8,192 → layer 218,112,000; 32 layers 6,979,584,000
    # Llama-3 8B: + 2·128256·4096 (1,050,673,152) + 4,096 = 8,030,261,248
    assert hf("meta-llama-3-8b.json").params == 8_030_261_248
    # Mistral 7B: + 2·32000·4096 (262,144,000) + 4,096 = 7,241,732,096
    assert hf("mistral-7b-v0.1.json").params == 7_241_732_096


def test_mixtral_8x7b_total_and_active_parameters():
    # Mixtral layer: attention 41,943,040 (as Mistral) + norms 8,192 + router h·E = 32,768
    # + E = 8 experts × 3hf (176,160,768 each)
    m = hf("mixtral-8x7b-v0.1.json")
    expert = 3 * 4096 * 14336
    common = 41_943_040 + 8_192 + 4096 * 8
    emb = 2 * 32000 * 4096 + 4096
    assert m.params == 32 * (common + 8 * expert) + emb == 46_702_792_704
    # active = per layer common + top-2 experts: 32·(41,984,000 + 352,321,536) + 262,148,096
    assert m.active_params == 32 * (common + 2 * expert) + emb == 12_879_925_248
    assert round(m.active_params / 1e9, 1) == 12.9      # Jiang et al. 2024: 12.9 B active


def test_gpt2_124m_unchanged():
    # GPTShape's convention (tied, learned positions): 124,439,808 (HuggingFace gpt2)
    assert hf("gpt2.json").params == 124_439_808
    assert GPTShape(12, 768, 12, 3072, 50257, 1024).params == 124_439_808


def test_qwen2_has_qkv_bias_only():
    # Qwen2-7B: h=3584, a=28, g=4 (d=128, gd=512): q/k/v biases 3584 + 2·512 = 4,608 per layer
    q = hf("qwen2-7b.json")
    no_bias = DecoderShape(**{**read_hf_config(HF / "qwen2-7b.json")[0], "qkv_bias": False})
    assert q.params - no_bias.params == 28 * 4_608
    assert (q.qkv_bias, q.out_bias, q.mlp_bias) == (True, False, False)


def test_qwen2_moe_shared_expert_counts():
    # Qwen1.5-MoE-A2.7B's published shape (model card: 14.3 B total, 2.7 B activated):
    # h=2048, L=24, a=g=16, 60 experts of 1408, top-4, one shared expert of 5632 with an h×1 gate
    doc = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
           "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
           "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
           "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
           "max_position_embeddings": 8192, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "norm_topk_prob": False, "use_sliding_window": False, "sliding_window": 32768}
    fields, unmodelled = from_hf_config(doc, source="qwen1.5-moe")
    m = DecoderShape(**fields)
    h, expert = 2048, 3 * 2048 * 1408
    common = 4 * h * h + 3 * h + 2 * h + 60 * h + 3 * h * 5632 + h   # attention+qkv bias, norms, router, shared+gate
    emb = 2 * 151936 * h + h
    assert m.params == 24 * (common + 60 * expert) + emb == 14_315_784_192
    assert m.active_params == 24 * (common + 4 * expert) + emb == 2_689_173_504
    # the window keys are read (use_sliding_window: false, so no layer has it); an empty
    # mlp_only_layers and norm_topk_prob change no step (ddlsim.workloads.models.hf_keys)
    assert unmodelled == []
    assert "sliding_window" not in fields


def test_tied_embeddings_are_honoured():
    base = dict(layers=2, hidden=64, heads=4, ffn=256, vocab=1000, max_positions=128)
    assert (DecoderShape(**base, tied_embeddings=False).params
            - DecoderShape(**base).params) == 1000 * 64


# ---------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("b, s", [(1, 4096), (2, 1024)])
def test_gqa_layer_flops_against_formula(b, s):
    m = hf("llama-2-70b-hf.json")
    h, a, g, d, f = 8192, 64, 8, 128, 28672
    parts = m.layer_gemm_flops(b, s)
    assert parts["q"] == 2 * b * s * h * a * d
    assert parts["kv"] == 2 * b * s * h * 2 * g * d          # only K and V shrink with GQA
    # projections together: 2·b·s·h·(h + 2·g·d)
    assert parts["q"] + parts["kv"] == 2 * b * s * h * (h + 2 * g * d)
    assert parts["attn_core"] == 4 * b * s * s * a * d      # every query head attends
    assert parts["proj"] == 2 * b * s * a * d * h
    assert parts["mlp"] == 3 * 2 * b * s * h * f              # SwiGLU: gate, up, down
    assert m.layer_forward_flops(b, s) == pytest.approx(
        2 * b * s * h * (h + 2 * g * d) + 4 * b * s * s * h + 2 * b * s * h * h + 6 * b * s * h * f,
        rel=1e-15)


def test_moe_layer_flops_count_top_k_experts_and_router():
    m = hf("mixtral-8x7b-v0.1.json")
    b, s, h, f = 1, 4096, 4096, 14336
    parts = m.layer_gemm_flops(b, s)
    assert parts["experts"] == 2 * 3 * 2 * b * s * h * f     # top-2 × gated MLP
    assert parts["router"] == 2 * b * s * h * 8
    assert "mlp" not in parts
    # 6N per token over the active GEMM parameters (active minus embeddings and the
    # 2L + 1 norm weights), plus the attention s² term and the logits:
    tokens = 8 * s
    gemm_params = m.active_params - m.embedding_params - (2 * m.layers + 1) * m.norm_params
    six_n = 6 * tokens * gemm_params
    attention = 3 * 8 * m.layers * 4 * s * s * h
    logits = 3 * tokens * 2 * h * m.vocab
    assert m.model_flops(8, s) == pytest.approx(six_n + attention + logits, rel=1e-12)


def test_moe_layer_frequency():
    base = dict(layers=12, hidden=64, heads=4, ffn=256, vocab=100, positions="rotary",
                experts=4, top_k=1, moe_layer_freq=2)
    m = DecoderShape(**base)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert m.params == (6 * m.dense_layer_params + 6 * m.moe_layer_params
                        + m.embedding_params + m.norm_params)
    with pytest.raises(ValueError, match="moe=True or moe=False"):
        _ = m.layer_params


# ---------------------------------------------------------------- GPTShape equivalence
GPT_PRESETS = sorted(n for n, p in list_presets("model")["model"].items()
                     if p.get("architecture", "gpt") == "gpt")


def as_decoder(g: GPTShape) -> DecoderShape:
    return DecoderShape(layers=g.L, hidden=g.h, heads=g.a, ffn=g.f, vocab=g.V, max_positions=g.s_max)


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_gpt_style_decoder_equals_gptshape(name):
    g = GPTShape.of(ModelConfig(name=name, **get_preset("model", name)))
    d = as_decoder(g)
    assert (d.params, d.layer_params, d.embedding_params) == (g.params, g.layer_params, g.embedding_params)
    b, s = 2, 1024
    gp, dp = g.layer_gemm_flops(b, s), d.layer_gemm_flops(b, s)
    assert dp["q"] + dp["kv"] == gp["qkv"]
    assert [dp[k] for k in ("attn_core", "proj", "mlp")] == [gp[k] for k in ("attn_core", "proj", "mlp")]
    assert d.layer_forward_flops(b, s) == g.layer_forward_flops(b, s)
    assert d.model_flops(64, s) == g.model_flops(64, s)
    for t, sp in ((1, False), (2, False), (8, False), (4, True), (8, True)):
        assert d.layer_elementwise_bytes(b, s, t, sp, 2) == g.layer_elementwise_bytes(b, s, t, sp, 2)
        for rc in ("none", "selective", "full"):
            # equal as real numbers; GPTShape's sbh·(… + 5as/(ht)) rounds the ratio 5as/h, while
            # DecoderShape sums integer-valued terms, so the two may differ in the last bit
            assert d.layer_activation_bytes(b, s, t, sp, rc) == pytest.approx(
                g.layer_activation_bytes(b, s, t, sp, rc), rel=4e-16, abs=0)


def test_gpt2_config_json_equals_gpt2_preset():
    # the published GPT-2 config.json and the gpt2-124m preset describe the same model
    g = GPTShape.of(ModelConfig(name="gpt2-124m", **get_preset("model", "gpt2-124m")))
    assert hf("gpt2.json") == DecoderShape(**{**_fields(as_decoder(g)), "activation": "gelu_new"})


def _fields(d: DecoderShape) -> dict:
    return {k: getattr(d, k) for k in DecoderShape.__slots__}


# ---------------------------------------------------------------- activations per variant
def test_gqa_and_gated_mlp_activation_terms():
    # Korthikanti 2022 per layer, adapted: difference between MHA and GQA (g=8 of a=64) is
    # the K and V tensors: 4·sb·(h − g·d) bytes (2 bytes each, two tensors)
    b, s = 1, 4096
    mha = hf("llama-2-7b-hf.json")
    gqa = DecoderShape(**{**_fields(mha), "kv_heads": 8})
    assert (mha.layer_activation_bytes(b, s, 1, False, "selective")
            - gqa.layer_activation_bytes(b, s, 1, False, "selective")) == 4 * s * b * (4096 - 8 * 128)
    # a gated MLP keeps 6·sbf instead of 4·sbf
    ungated = DecoderShape(**{**_fields(mha), "gated_mlp": False})
    assert (mha.layer_activation_bytes(b, s, 1, False, "selective")
            - ungated.layer_activation_bytes(b, s, 1, False, "selective")) == 2 * s * b * 11008


# ---------------------------------------------------------------- from_hf_config
#: the keys of each bundled file that change a step and are not modelled (the warning's)
EXPECTED_NOTES = {"deepseek-v3.json": {"num_nextn_predict_layers", "quantization_config"},
                  "gpt-oss-120b.json": {"quantization_config"},
                  "gpt-oss-20b.json": {"quantization_config"}}


@pytest.mark.parametrize("name", sorted(p.name for p in HF.glob("*.json")))
def test_every_bundled_config_reads(name):
    fields, unmodelled = read_hf_config(HF / name)
    DecoderShape(**fields)
    doc = json.loads((HF / name).read_text())
    assert "architectures" in doc and "architectures" not in unmodelled   # declared harmless
    assert set(k.split("=")[0] for k in unmodelled) <= set(doc)
    assert all("(" in u for u in unmodelled)    # each with its note; no unknown key
    # sliding windows are modelled (Mistral's 4096, GPT-OSS's 128)
    assert {u.split("=")[0] for u in unmodelled} == EXPECTED_NOTES.get(name, set())


def test_gpt2_names():
    doc = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128,
           "n_inner": None, "vocab_size": 1000, "activation_function": "gelu_new", "resid_pdrop": 0.0,
           "embd_pdrop": 0.0, "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5}
    fields, unmodelled = from_hf_config(doc, source="test")
    assert (fields["layers"], fields["hidden"], fields["heads"], fields["ffn"], fields["max_positions"]) \
        == (2, 64, 4, 256, 128)
    assert fields["dropout"] is False and unmodelled == []   # the epsilon changes no step
    assert unmodelled_warning("g.json", ["new_key"]) == (
        "g.json: 1 config.json key(s) not modelled by ddlsim, ignored: new_key")
    assert unmodelled_warning("g.json", []) is None


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("change, match", [
    ({"hidden_size": None}, "'hidden_size' is missing"),
    ({"num_hidden_layers": "32"}, r"num_hidden_layers = '32' .*positive integer"),
    ({"num_attention_heads": True}, "num_attention_heads = True"),
    ({"num_key_value_heads": 3}, "not a multiple of kv_heads = 3"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings = 'no' .*true or false"),
    ({"hidden_act": "tanh"}, "hidden_act = 'tanh' .*allowed: gelu"),
    ({"model_type": "bert"}, "model_type = 'bert' .*supported: gpt2, llama"),
    ({"model_type": ["llama"]}, r"model_type = \['llama'\] .*supported"),
    ({"hidden_act": ["silu"]}, r"hidden_act = \['silu'\] .*allowed"),
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 5}, "top_k = 5"),
])
def test_bad_docs_raise_one_clean_config_error(change, match):
    doc = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        from_hf_config(doc, source="cfg.json")


def test_bad_files(tmp_path):
    dup = tmp_path / "dup.json"
    dup.write_text('{"model_type": "llama", "hidden_size": 1, "hidden_size": 2}')
    with pytest.raises(ConfigError, match="duplicate key 'hidden_size'"):
        read_hf_config(dup)
    nan = tmp_path / "nan.json"
    nan.write_text('{"model_type": "llama", "rope_theta": NaN}')
    with pytest.raises(ConfigError, match="NaN is not a number JSON allows"):
        read_hf_config(nan)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object, got list"):
        read_hf_config(lst)


def test_decoder_presets_name_bundled_files_with_their_counts():
    import yaml

    presets = yaml.safe_load((HF.parent / "decoders.yaml").read_text())
    assert {p["hf_config"] for p in presets.values()} == {f"hf/{p.name}" for p in HF.glob("*.json")}
    for name, p in presets.items():
        d = hf(Path(p["hf_config"]).name)
        assert d.params == p["params"], name
        assert d.active_params == p.get("active_params", p["params"]), name
        assert p["source"].startswith("huggingface.co/"), name

"""Today's Megatron-Core MoE model flags (importers/megatron_moe_model.py): Multi-head Latent
Attention, --moe-layer-freq and the shared experts, read from the ModelZoo's DeepSeek-V3 and
Kimi-K2 YAMLs as they ship (copies of e8650517 in data/real) and from command lines."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.importers import import_config
from ddlsim.importers.megatron import read_megatron
from ddlsim.importers.megatron_moe_model import layer_pattern

REAL = Path(__file__).with_name("data") / "real"
#: the launcher's variables the YAMLs read (the ModelZoo's H100 DeepSeek-V3 plan: TP 2, PP 8,
#: EP 32 on 32 nodes; 61 layers as 7 + 6×8 + 6), and what ddlsim cannot read: the tokenizer
ENV = {"TP": "2", "PP": "8", "EP": "32", "CP": "1", "VPP": "1", "MBS": "1", "GBS": "1024",
       "SEQ_LEN": "4096", "NUM_LAYERS": "61", "PP_FIRST": "7", "PP_LAST": "6"}


def _import(name: str, vocab: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the not-modelled arguments' warning
        return import_config([REAL / name], system="dgx-h100", software="megatron-core-2025",
                             nodes=32, env=tuple(f"{k}={v}" for k, v in ENV.items()), ignore=("tokenizer-type",),
                             overrides=(f"model.vocab_size={vocab}",)).config


def test_deepseek_v3s_yaml_gives_the_preset_model():
    """The ModelZoo's DeepSeek-V3.yaml is DeepSeek-V3: MLA, three dense layers, one shared
    expert of 2,048, 671 B parameters; it differs from the bundled preset only by the
    router's score-correction bias, which Megatron's --moe-router-enable-expert-bias gives
    as a routing option (parallel.moe.router_enable_expert_bias), not as weights."""
    cfg = _import("zoo__DeepSeek-V3.yaml", 129280)
    m = cfg["model"]
    assert (m["q_lora_rank"], m["kv_lora_rank"], m["qk_nope_head_dim"], m["qk_rope_head_dim"],
            m["v_head_dim"]) == (1536, 512, 128, 64, 128)
    assert m["first_k_dense_replace"] == 3
    assert (m["n_shared_experts"], m["shared_expert_intermediate_size"]) == (1, 2048)
    assert "qk_norm" not in m and "head_dim" not in m
    assert cfg["parallel"]["moe"]["router_enable_expert_bias"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ddlsim.load_config(cfg).model.shape()
        preset = ddlsim.load_config({"model": "deepseek-v3", "train": {
            "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
            # MLA and shared experts: megatron-core-2024 (900f1b76) has neither
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}).model.shape()
    bias = preset.experts * preset.moe_layers          # the preset's e_score_correction_bias
    assert got.stack_params == preset.stack_params - bias
    assert (got.mla, got.first_dense_layers, got.shared_experts, got.f_s) == \
        (preset.mla, preset.first_dense_layers, preset.shared_experts, preset.f_s)


def test_kimi_k2s_quoted_pattern_is_read():
    """Kimi-K2.yaml writes --moe-layer-freq as "'([0]*1+[1]*60)'" (the shell's quotes kept
    by YAML): one dense layer, then 60 MoE layers of 384 experts."""
    m = _import("zoo__Kimi-K2.yaml", 163840)["model"]
    assert m["first_k_dense_replace"] == 1 and m["num_local_experts"] == 384
    assert "decoder_sparse_step" not in m


@pytest.mark.parametrize("text, layers, want", [
    ("1", 4, [1, 1, 1, 1]),
    ("2", 4, [1, 0, 1, 0]),                      # Megatron: layer i is MoE when i % N == 0
    ("([0]*3+[1]*58)", 61, [0] * 3 + [1] * 58),
    ("'([0]+[1]*3)'", 4, [0, 1, 1, 1]),
    ('"([1]*3+[0]*1)*3"', 12, [1, 1, 1, 0] * 3),
    ("__import__('os').system('true')", 4, None),   # never evaluated
    ("[2]*4", 4, None),
    ("[1]*(10**9)", 4, None),
    ("([0] + [1]*3)", 4, None),                  # Megatron's _eval_pattern refuses spaces
])
def test_layer_patterns_as_megatron_reads_them(text, layers, want):
    assert layer_pattern(text, layers) == want


def _mla_script(extra: str) -> str:
    return ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 "
            "--num-attention-heads 16 --normalization RMSNorm --position-embedding-type rope "
            "--swiglu --disable-bias-linear --attention-dropout 0 --hidden-dropout 0 "
            "--num-experts 8 --moe-ffn-hidden-size 512 " + extra)


def test_mla_defaults_and_what_has_no_effect_without_it():
    draft = read_megatron(_mla_script("--multi-latent-attention --qk-layernorm"), "a.sh")
    f = draft.fields
    assert (f["model.kv_lora_rank"], f["model.qk_nope_head_dim"], f["model.qk_rope_head_dim"],
            f["model.v_head_dim"]) == (32, 128, 64, 128)     # Megatron's defaults
    assert "model.q_lora_rank" not in f and not draft.refused
    draft = read_megatron(_mla_script("--kv-lora-rank 512"), "b.sh")
    assert "model.kv_lora_rank" not in draft.fields
    assert any("only with --multi-latent-attention" in n[1] for n in draft.notes)


def test_mla_without_latent_norms_and_patterns_ddlsim_cannot_express_are_refused():
    draft = read_megatron(_mla_script("--multi-latent-attention"), "c.sh")
    assert [a for a, _ in draft.refused] == ["--multi-latent-attention"]
    draft = read_megatron(_mla_script("--moe-layer-freq 2"), "d.sh")   # layer 0 an MoE one
    assert [a for a, _ in draft.refused] == ["--moe-layer-freq 2"]
    draft = read_megatron(_mla_script("--moe-layer-freq ([0]+[1]*2)"), "e.sh")   # 3 ≠ 4
    assert [a for a, _ in draft.refused] == ["--moe-layer-freq ([0]+[1]*2)"]
    draft = read_megatron(_mla_script("--moe-layer-freq ([0]*1+[1]*1)*2"), "f.sh")
    assert draft.fields["model.decoder_sparse_step"] == 2 and not draft.refused


def test_qkv_bias_and_flags_without_cost():
    """--add-qkv-bias (Qwen2-57B-A14B.yaml): biases on the QKV projection alone; the MTP
    loss weight and the checkpoint's parallel save change no cost (DeepSeek-V3-Proxy.yaml,
    the Mixtral YAMLs)."""
    draft = read_megatron(_mla_script("--add-qkv-bias --mtp-loss-scaling-factor 0.1 "
                                      "--no-ckpt-fully-parallel-save"), "g.sh")
    assert draft.fields["model.qkv_bias"] is True
    assert draft.fields["model.attention_bias"] is False and not draft.refused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = ddlsim.load_config({"model": {"architecture": "llama", "num_hidden_layers": 2,
                                              "hidden_size": 1024, "intermediate_size": 4096,
                                              "num_attention_heads": 16, "vocab_size": 32000,
                                              "qkv_bias": True},
                                    "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                              "seq_length": 1024},
                                    "system": {"preset": "dgx-h100", "nodes": 1}}).model.shape()
    assert shape.qkv_bias and not shape.out_bias

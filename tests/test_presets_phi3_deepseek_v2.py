"""Phi-3 and DeepSeek-V2 at first contact (issue 28): the model types ``phi3`` and
``deepseek_v2`` are read, the published Phi-3-mini/medium (4k), DeepSeek-V2-Lite and DeepSeek-V2
files are bundled as presets reached by their names and repository names, their shapes and
counts are those of the files and the model cards, DeepSeek-V2's group-limited routing is read
(docs/moe.md), and what stays out (Phi-3's 128k releases, Phi-3's dropouts) is named."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimWarning

HF = Path(ddlsim.__file__).parent / "data" / "hf"
RUN = {"train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
       "system": {"preset": "dgx-h100", "nodes": 1}, "parallel": {"data_parallel_size": 8,
                                                                "zero_stage": 1}}
#: DeepSeek's models (MLA, shared experts, seq_aux_loss, group-limited routing) need a
#: Megatron-Core newer than megatron-core-2024's 900f1b76 (docs/stacks.md)
DS_RUN = {**RUN, "system": {**RUN["system"], "software": {"stack": "megatron-core-2025"}}}


def _shape(model):
    run = DS_RUN if "deepseek" in str(model).lower() else RUN
    return ddlsim.load_config({**run, "model": model}).model.shape()


def _not_modelled(record: list) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DDLSimWarning)
            and "not modelled by ddlsim" in str(w.message)]


# ------------------------------------------------------------------ Phi-3
# name → (file, layers, hidden, heads, kv heads, ffn, published params, where published)
PHI3 = {
    "phi-3-mini-4k": ("phi-3-mini-4k-instruct", 32, 3072, 32, 32, 8192, 3.8e9,
                      "Phi-3-mini-4k-instruct model card: 3.8B"),
    "phi-3-medium-4k": ("phi-3-medium-4k-instruct", 40, 5120, 40, 10, 17920, 14e9,
                        "Phi-3-medium-4k-instruct model card: 14B"),
}


@pytest.mark.parametrize("name", sorted(PHI3))
def test_phi3_preset_has_its_config_shape_and_the_published_count(name):
    file, layers, hidden, heads, kv, ffn, published, source = PHI3[name]
    doc = json.loads((HF / f"{file}.json").read_text())
    sh = _shape(name)
    assert (sh.layers, sh.hidden, sh.heads, sh.kv_heads, sh.ffn, sh.vocab) \
        == (layers, hidden, heads, kv, ffn, 32064)
    assert (doc["num_hidden_layers"], doc["hidden_size"], doc["num_key_value_heads"]) \
        == (layers, hidden, kv)
    assert abs(sh.params - published) <= 0.01 * published, (name, sh.params, source)
    # modeling_phi3.py: no biases, untied head, RMSNorm, SwiGLU; Mistral's window on every layer
    assert not (sh.qkv_bias or sh.out_bias or sh.mlp_bias or sh.tied_embeddings or sh.dropout)
    assert (sh.gated_mlp, sh.norm, sh.positions) == (True, "rmsnorm", "rotary")
    assert (sh.sliding_window, sh.window_layers) == (doc["sliding_window"], layers) == (2047,
                                                                                        layers)


@pytest.mark.parametrize("typed, preset", [
    ("phi-3-mini", "phi-3-mini-4k"), ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k"),
    ("phi-3-medium", "phi-3-medium-4k"), ("microsoft/Phi-3-medium-4k-instruct",
                                          "phi-3-medium-4k")])
def test_phi3_names_users_type_reach_the_presets(typed, preset):
    assert _shape(typed) == _shape(preset)


def test_phi3_fused_projections_are_one_gemm_each_of_the_modules_width():
    """modeling_phi3.py: qkv_proj is hidden → a·d + 2·g·d, gate_up_proj hidden → 2·f; a
    Megatron layer runs each as one GEMM of that width (separate GEMMs only where the stack's
    own model keeps separate modules, software.separate_projections)."""
    from ddlsim.workloads.decoder.layerkernels import linear_gemms

    sh = _shape("phi-3-medium-4k")
    g = linear_gemms(sh, 4096.0, 1)
    assert g["qkv"] == (4096.0, 40 * 128 + 2 * 10 * 128, 5120)
    assert g["fc1"] == (4096.0, 2 * 17920, 5120)


@pytest.mark.parametrize("name", ["phi-3-mini-4k", "phi-3-medium-4k"])
def test_phi3_predicts_without_a_warning_and_its_window_is_in_the_step(name):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config({**RUN, "model": name})
        windowed = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert _not_modelled(record) == []
    section = {k: v for k, v in cfg.model.model_dump().items()
               if k not in ("sliding_window", "window_layers", "name", "source")}
    full = ddlsim.predict(ddlsim.load_config({**RUN, "model": section}), check_fit=False)
    assert 0 < windowed < full.iteration_time_s   # 2047 keys a query at 4096 tokens


@pytest.mark.parametrize("key, value, said", [
    ("resid_pdrop", 0.1, "resid_pdrop=0.1 (Phi-3's residual dropout"),
    ("embd_pdrop", 0.1, "embd_pdrop=0.1 (embedding dropout not modelled"),
    ("attention_dropout", 0.1, "attention_dropout=0.1 (attention dropout not modelled"),
    ("partial_rotary_factor", 0.75, "partial_rotary_factor=0.75 (rotary embedding over a"),
])
def test_a_phi3_key_that_changes_the_step_is_named(tmp_path, key, value, said):
    doc = json.loads((HF / "phi-3-mini-4k-instruct.json").read_text())
    doc[key] = value
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.warns(DDLSimWarning) as record:
        ddlsim.load_config({**RUN, "model": {"hf_config": str(tmp_path)}})
    (line,) = _not_modelled(record)
    assert said in line


def test_a_llama_file_with_phi3_dropout_keys_stays_silent(tmp_path):
    """transformers' Llama reads no resid_pdrop or embd_pdrop: they change nothing there."""
    doc = json.loads((HF / "llama-3.1-8b.json").read_text())
    doc.update(resid_pdrop=0.1, embd_pdrop=0.1)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ddlsim.load_config({**RUN, "model": {"hf_config": str(tmp_path)}})
    assert _not_modelled(record) == []


@pytest.mark.parametrize("name", ["phi-3-mini-128k", "microsoft/Phi-3-medium-128k-instruct"])
def test_phi3_128k_releases_are_refused_by_name_with_the_reason(name):
    with pytest.raises(ConfigError, match="is not bundled: Phi-3's 128k-context releases are "
                                          "read .* no copy of their config.json is bundled"):
        ddlsim.load_config({**RUN, "model": name})


# ------------------------------------------------------------------ DeepSeek-V2
def test_deepseek_v2_lite_has_its_config_shape():
    sh = _shape("deepseek-v2-lite")
    assert (sh.layers, sh.hidden, sh.heads, sh.ffn, sh.vocab) == (27, 2048, 16, 10944, 102400)
    m = sh.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
            m.v_head_dim, m.bias) == (None, 512, 128, 64, 128, False)
    assert (sh.experts, sh.top_k, sh.f_e, sh.shared_experts, sh.first_dense_layers) \
        == (64, 6, 1408, 2, 1)
    assert sh.router_bias is False            # V2's gate has no bias; V3's has E
    assert _shape("deepseek-v3").router_bias is True


def test_deepseek_v2_lite_count_by_hand_and_against_the_card():
    """Embeddings and head ``2·V·h``; per layer the two norms, MLA (q_proj ``h·a·(d_n+d_r)``,
    kv_a ``h·(r_kv+d_r)``, its norm ``r_kv``, kv_b ``r_kv·a·(d_n+d_v)``, o ``a·d_v·h``);
    layer 0 a dense SwiGLU of 10,944; 26 MoE layers of 64 routed + one shared MLP of
    2 × 1,408 and a gate ``h·E`` without bias; the final norm. DeepSeek-AI 2024
    (arXiv:2405.04434), Appendix B: 15.7B total, 2.4B activated (without the input embedding,
    as DeepSeek-V3's 37B is counted)."""
    h, V, a = 2048, 102400, 16
    attention = h * a * 192 + h * (512 + 64) + 512 + 512 * a * 256 + a * 128 * h
    moe = 64 * 3 * h * 1408 + 3 * h * 2 * 1408 + h * 64
    total = 2 * V * h + 27 * (attention + 2 * h) + 3 * h * 10944 + 26 * moe + h
    sh = _shape("deepseek-v2-lite")
    assert sh.params == total == 15706484224
    assert abs(sh.params - 15.7e9) <= 0.01 * 15.7e9
    assert 2.4e9 <= sh.active_params - V * h < 2.5e9     # "2.4B", to one decimal


@pytest.mark.parametrize("typed", ["deepseek-ai/DeepSeek-V2-Lite", "DeepSeek-V2-Lite-Chat"])
def test_deepseek_v2_lite_repository_names_reach_the_preset(typed):
    assert _shape(typed) == _shape("deepseek-v2-lite")


def test_deepseek_v2_lite_predicts_with_its_balance_loss_read():
    """Its config.json's aux_loss_alpha 0.001 with seq_aux (hf_router.router_balancing): a
    sequence-wise loss of 0.001, no key left unmodelled."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config({**DS_RUN, "model": "deepseek-v2-lite"})
        result = ddlsim.predict(cfg, check_fit=False)
    assert result.iteration_time_s > 0
    assert _not_modelled(record) == []
    assert (cfg.model.router_aux_loss_coef, cfg.model.seq_aux) == (0.001, True)


@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-ai/DeepSeek-V2"])
def test_deepseek_v2_236b_is_bundled_with_its_group_limited_routing(name):
    """DeepSeek-V2's published config.json (hf/SOURCES.md N): 236B total, 21B activated for each
    token (DeepSeek-AI 2024, arXiv:2405.04434, abstract and §3.1.2), 60 layers, hidden 5120,
    128 heads, q_lora_rank 1536, 160 routed experts of 1536, top-6 inside 3 of 8 groups."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config({**DS_RUN, "model": name})
    sh = cfg.model.shape()
    assert (sh.layers, sh.hidden, sh.heads, sh.experts, sh.top_k, sh.f_e) == (
        60, 5120, 128, 160, 6, 1536)
    assert abs(sh.params - 236e9) <= 0.01 * 236e9
    assert abs(sh.active_params - 102400 * 5120 - 21e9) <= 0.01 * 21e9
    assert _not_modelled(record) == []          # aux_loss_alpha, seq_aux read
    assert (cfg.model.n_group, cfg.model.topk_group) == (8, 3)

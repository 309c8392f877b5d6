"""Models as users first ask for them (issue 28): ``--set model=NAME`` and a sweep over model
presets, bundled config.json files that predict without a warning unless a key matters, the
published Llama 3.2/3.3, Qwen2.5 and Qwen3 presets against their configs and model cards, and
the published models ddlsim refuses by name with the feature it does not model."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimWarning
from ddlsim.ranges import parse_range
from ddlsim.sweeps import SweepError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
HF = Path(ddlsim.__file__).parent / "data" / "hf"
RUN = {"train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
       "system": {"preset": "dgx-h100", "nodes": 1}, "parallel": {"data_parallel_size": 8,
                                                                "zero_stage": 1}}


def _not_modelled_warnings(record: list) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DDLSimWarning)
            and "not modelled by ddlsim" in str(w.message)]


# ------------------------------------------------------------------ --set model=NAME
def test_set_model_to_a_preset_name_replaces_the_section():
    cfg = ddlsim.load_config(EXAMPLE, ["model=llama-3.1-70b"])
    assert cfg.model.name == "llama-3.1-70b" and cfg.model.shape().params == 70553706496
    same = ddlsim.load_config(EXAMPLE, ["model.preset=llama-3.1-70b"])
    assert same.model.shape() == cfg.model.shape()


def test_the_cli_takes_a_model_preset_name_in_set_and_set_range():
    from typer.testing import CliRunner

    from ddlsim.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["predict", str(EXAMPLE), "--set", "model=llama-3-70b", "-f", "json",
                            "--allow-oom"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parameter_count"] == 70553706496
    r = runner.invoke(app, ["sweep", str(EXAMPLE), "--set-range",
                            "model=llama-3.1-8b,llama-3.1-70b", "-f", "json"])
    assert r.exit_code == 0, r.output
    assert [row["model"] for row in json.loads(r.stdout)] == ["llama-3.1-8b", "llama-3.1-70b"]


@pytest.mark.parametrize("item", ["model=4", "model=[llama-3.1-8b]", "train=4"])
def test_set_a_section_to_anything_but_a_name_is_refused(item):
    with pytest.raises(ConfigError, match=r"must be a section and one or more keys joined by "
                                          r"dots, or a section alone given the name of a"):
        ddlsim.load_config(EXAMPLE, [item])


def test_sweep_over_model_presets_by_section_name():
    path, values = parse_range("model=llama-3.1-8b,llama-3.1-70b")
    assert (path, values) == ("model", ["llama-3.1-8b", "llama-3.1-70b"])
    frame = ddlsim.sweep(str(EXAMPLE), {path: values})
    assert list(frame["model"]) == ["llama-3.1-8b", "llama-3.1-70b"]
    assert frame["valid"].all()
    assert frame["iteration_time_s"].iloc[1] > 5 * frame["iteration_time_s"].iloc[0]


def test_a_model_both_swept_and_set_is_refused():
    with pytest.raises(SweepError, match="both swept and set"):
        ddlsim.sweep(str(EXAMPLE), {"model": ["llama-3.1-8b"]},
                     overrides=["model.preset=llama-3.1-70b"])


# ------------------------------------------------------------------ warnings
@pytest.mark.parametrize("name", ["meta-llama-3-70b", "llama-3.1-8b", "llama-2-7b", "qwen2-7b",
                                  "mixtral-8x7b", "qwen3-30b-a3b", "qwen2.5-7b"])
def test_a_bundled_preset_whose_other_keys_change_nothing_predicts_without_a_warning(name):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ddlsim.load_config({**RUN, "model": "gpt2"}, [f"model={name}"])
    assert _not_modelled_warnings(record) == []


def test_a_key_that_changes_the_step_is_still_said(tmp_path):
    """A user's folder gets the bundled files' rule: the harmless keys pass, a value that
    changes the step and an unknown key are named."""
    doc = json.loads((HF / "meta-llama-3-70b.json").read_text())
    doc.update(attention_dropout=0.1, quantization_config={"quant_method": "fp8"},
               brand_new_key=1)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.warns(DDLSimWarning) as record:
        ddlsim.load_config({**RUN, "model": {"hf_config": str(tmp_path)}})
    (line,) = _not_modelled_warnings(record)
    assert "3 config.json key(s)" in line
    assert "attention_dropout=0.1 (attention dropout not modelled" in line
    assert "quantization_config={'quant_method': 'fp8', …} (the checkpoint's weights" in line
    assert line.endswith("brand_new_key")
    assert "rope_theta" not in line and "bos_token_id" not in line


def test_deepseek_v3_still_names_what_is_not_modelled():
    with pytest.warns(DDLSimWarning) as record:
        # DeepSeek-V3's MLA: megatron-core-2024 (900f1b76) has none
        ddlsim.load_config({**RUN, "model": "gpt2"}, ["model=deepseek-v3",
                                                      "system.software={stack: megatron-core-2025}"])
    (line,) = _not_modelled_warnings(record)
    for key in ("num_nextn_predict_layers=1", "quantization_config="):
        assert key in line
    for key in ("n_group", "topk_group", "aux_loss_alpha", "seq_aux", "topk_method"):
        assert key not in line                       # modelled (docs/moe.md)


# ------------------------------------------------------------------ new presets
# name → (layers, hidden, heads, kv heads, ffn, vocab, tied, published params, source)
NEW = {
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, 128256, True, 1.23e9, "Llama 3.2 model card: 1.23B"),
    "llama-3.2-3b": (28, 3072, 24, 8, 8192, 128256, True, 3.21e9, "Llama 3.2 model card: 3.21B"),
    "llama-3.3-70b": (80, 8192, 64, 8, 28672, 128256, False, 70e9, "Llama 3.3 model card: 70B"),
    "qwen2.5-7b": (28, 3584, 28, 4, 18944, 152064, False, 7.61e9, "Qwen2.5-7B card: 7.61B"),
    "qwen2.5-14b": (48, 5120, 40, 8, 13824, 152064, False, 14.7e9, "Qwen2.5-14B card: 14.7B"),
    "qwen2.5-32b": (64, 5120, 40, 8, 27648, 152064, False, 32.5e9, "Qwen2.5-32B card: 32.5B"),
    "qwen2.5-72b": (80, 8192, 64, 8, 29568, 152064, False, 72.7e9, "Qwen2.5-72B card: 72.7B"),
    "qwen3-8b": (36, 4096, 32, 8, 12288, 151936, False, 8.2e9, "Qwen3-8B card: 8.2B"),
    "qwen3-14b": (40, 5120, 40, 8, 17408, 151936, False, 14.8e9, "Qwen3-14B card: 14.8B"),
    "qwen3-32b": (64, 5120, 64, 8, 25600, 151936, False, 32.8e9, "Qwen3-32B card: 32.8B"),
}


@pytest.mark.parametrize("name", sorted(NEW))
def test_a_new_preset_has_its_config_shape_and_the_published_count(name):
    layers, hidden, heads, kv, ffn, vocab, tied, published, source = NEW[name]
    sh = ddlsim.load_config({**RUN, "model": name}).model.shape()
    assert (sh.layers, sh.hidden, sh.heads, sh.kv_heads, sh.ffn, sh.vocab, sh.tied_embeddings) \
        == (layers, hidden, heads, kv, ffn, vocab, tied)
    assert abs(sh.params - published) <= 0.01 * published, (name, sh.params, source)
    assert sh.qkv_bias is name.startswith("qwen2.5")          # Qwen2.5: bias on q/k/v only
    assert sh.qk_norm is name.startswith("qwen3")             # Qwen3: per-head q/k RMSNorm
    assert sh.d == (64 if name == "llama-3.2-1b" else 128)   # Qwen3-32B: 64·128 ≠ 5120


@pytest.mark.parametrize("name", sorted(NEW))
def test_a_new_preset_predicts_without_a_warning(name):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = ddlsim.predict(ddlsim.load_config({**RUN, "model": name}), check_fit=False)
    assert result.iteration_time_s > 0
    assert _not_modelled_warnings(record) == []


@pytest.mark.parametrize("typed, preset", [
    ("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b"), ("Llama-3.3-70B-Instruct",
                                                            "llama-3.3-70b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("Qwen/Qwen3-32B", "qwen3-32b")])
def test_the_repository_names_reach_the_new_presets(typed, preset):
    by_repo = ddlsim.load_config({**RUN, "model": typed}).model.shape()
    assert by_repo == ddlsim.load_config({**RUN, "model": preset}).model.shape()


# ------------------------------------------------------------------ refused by name
@pytest.mark.parametrize("name, feature", [
    ("gemma-2-9b", "soft-caps every attention score"),
    ("google/gemma-2-27b-it", "four RMSNorms per layer"),
    ("olmo-2-7b", "normalises the outputs of attention and of the MLP"),
    ("allenai/OLMo-2-1124-13B", "under tensor parallelism, where each rank holds"),
    ("microsoft/Phi-3-mini-128k-instruct", "no copy of their config.json is bundled"),
])
def test_a_published_model_with_an_unmodelled_feature_is_refused_by_name(name, feature):
    with pytest.raises(ConfigError, match="is not bundled") as exc:
        ddlsim.load_config({**RUN, "model": name})
    assert feature in str(exc.value)


def test_a_config_json_of_an_unmodelled_type_names_the_feature(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma2", "hidden_size": 3584}))
    with pytest.raises(ConfigError, match=r"model_type 'gemma2' is not read: Gemma-2 .*"
                                          r"attn_logit_softcapping 50"):
        ddlsim.load_config({**RUN, "model": {"hf_config": str(path)}})

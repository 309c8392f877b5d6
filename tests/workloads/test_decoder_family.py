"""The decoder workload family end to end: HuggingFace configs through the CLI, parameter
counts as printed, GQA FLOPs in the trace, untied embeddings in memory, MoE configs read.

Every pinned number is derived in its comment (notation of
``ddlsim/workloads/models/decoder.py``), not copied from a run.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.errors import ConfigError, DDLSimWarning

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "ddlsim" / "data" / "hf"
runner = CliRunner()
#: Bundled configs have keys ddlsim does not model; the tests that count warnings catch them.
pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

PLAN = {"parallel": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 1024,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 4}}


def run_config(tmp_path: Path, model) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"model": model, **PLAN}))
    return path


def printed_parameters(tmp_path: Path, model, *extra: str) -> int:
    r = runner.invoke(app, ["predict", str(run_config(tmp_path, model)), "-f", "json",
                            "--allow-oom", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["parameter_count"]


# ---------------------------------------------------------------- counts as the tool prints them
def test_llama2_7b_parameter_count_as_printed(tmp_path):
    # L=32, h=4096, a=g=32, f=11008, V=32000, SwiGLU, RMSNorm, rotary, untied:
    # layer 4h² + 3hf + 2h = 67,108,864 + 135,266,304 + 8,192 = 202,383,360;
    # 32 × 202,383,360 + 2Vh (262,144,000) + final norm h (4,096) = 6,738,415,616
    assert printed_parameters(tmp_path, {"hf_config": "llama-2-7b"}) == 6_738_415_616


def test_llama2_70b_parameter_count_as_printed(tmp_path):
    # L=80, h=8192, a=64, g=8 (d=128), f=28672, V=32000: attention 2h² + 2h·gd = 150,994,944,
    # MLP 3hf = 704,643,072, norms 2h = 16,384 → layer 855,654,400; × 80 = 68,452,352,000;
    # + 2Vh = 524,288,000 + h = 8,192 → 68,976,648,192
    assert printed_parameters(tmp_path, "llama2-70b") == 68_976_648_192


def test_gpt2_124m_parameter_count_unchanged(tmp_path):
    # Narayanan et al. 2021 eq. (2) terms: 12 × (12h² + 13h) + Vh + s_max·h + 2h with h=768,
    # V=50257, s_max=1024: 12 × 7,087,872 + 38,597,376 + 786,432 + 1,536 = 124,439,808
    plan = ["--set", "parallel.tensor_model_parallel_size=2", "--set",
            "parallel.pipeline_model_parallel_size=2"]
    assert printed_parameters(tmp_path, "gpt2-124m", *plan) == 124_439_808
    assert printed_parameters(tmp_path, {"hf_config": "gpt2"}, *plan) == 124_439_808


def test_model_option_with_an_unmodified_llama3_config_predicts_without_a_warning(tmp_path):
    src = tmp_path / "Meta-Llama-3-8B" / "config.json"
    src.parent.mkdir()
    shutil.copyfile(HF / "meta-llama-3-8b.json", src)   # byte for byte the bundled file
    r = runner.invoke(app, ["predict", str(run_config(tmp_path, "gpt2-124m")), "--model",
                            str(src), "-f", "json", "--allow-oom"])
    assert r.exit_code == 0, r.output
    # every key the file has besides those read changes no step (models/hf_keys.py NO_EFFECT)
    assert r.stderr.splitlines() == []
    d = json.loads(r.stdout)
    # Llama-3 8B: L=32, h=4096, g=8 (gd=1024), f=14336, V=128256: layer 2h² + 2h·gd + 3hf + 2h
    # = 33,554,432 + 8,388,608 + 176,160,768 + 8,192 = 218,112,000; × 32 = 6,979,584,000;
    # + 2Vh = 1,050,673,152 + h → 8,030,261,248
    assert d["parameter_count"] == 8_030_261_248
    assert d["config"]["model"]["name"] == "Meta-Llama-3-8B"


def test_hf_config_path_is_relative_to_the_run_config(tmp_path):
    (tmp_path / "hf").mkdir()
    shutil.copyfile(HF / "qwen2-7b.json", tmp_path / "hf" / "config.json")
    cfg = ddlsim.load_config(run_config(tmp_path, {"hf_config": "hf/config.json",
                                                   "num_hidden_layers": 4}),
                             ["parallel.tensor_model_parallel_size=4"])
    # Qwen2: biases on q, k, v only
    assert (cfg.model.architecture, cfg.model.qkv_bias, cfg.model.attention_bias) == \
        ("llama", True, False)
    assert cfg.model.num_hidden_layers == 4          # keys beside hf_config override the file


def test_overrides_apply_to_the_hf_config_and_beside_it(tmp_path):
    cfg = ddlsim.load_config(run_config(tmp_path, {"hf_config": "llama-2-7b"}),
                             ["model.hf_config=llama-2-13b", "model.num_hidden_layers=8"])
    # Llama-2 13B (h=5120, 40 heads, f=13824) with 8 of its 40 layers
    assert (cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers) \
        == (5120, 13824, 8)


# ---------------------------------------------------------------- the trace
def test_gqa_layer_flops_in_the_trace():
    cfg = ddlsim.load_config({"model": "llama2-70b", **PLAN})
    ops = {op.payload.name: op.payload for op in
           ddlsim.build_workload(cfg).classes[1].program.blocks["F0"].ops}
    b, s, h, a, g, d, f, t = 1, 1024, 8192, 64, 8, 128, 28672, 8
    # q 2bs·h·ad, k and v 2bs·h·2gd (the only GQA term), QKᵀ and scores·V 4bs²·ad,
    # output 2bs·ad·h; per TP rank / t
    attn = (2 * b * s * h * a * d + 2 * b * s * h * 2 * g * d + 4 * b * s * s * a * d
            + 2 * b * s * a * d * h) / t
    assert ops["fwd.attn"].flops == pytest.approx(attn, rel=1e-12)
    assert ops["fwd.mlp"].flops == pytest.approx(2 * 3 * b * s * h * f / t, rel=1e-12)
    mha = ddlsim.load_config({"model": {"preset": "llama2-70b", "num_key_value_heads": 64},
                              **PLAN})
    ops_mha = {op.payload.name: op.payload for op in
               ddlsim.build_workload(mha).classes[1].program.blocks["F0"].ops}
    # 64 → 8 KV heads saves 2bs·h·2(a − g)d / t
    assert ops_mha["fwd.attn"].flops - ops["fwd.attn"].flops == pytest.approx(
        2 * b * s * h * 2 * (a - g) * d / t, rel=1e-12)


# ---------------------------------------------------------------- memory
def test_untied_embeddings_add_the_output_head_to_memory():
    base = {"model": {"preset": "gpt2-124m"},
            "parallel": {"tensor_model_parallel_size": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
            "system": {"preset": "dgx-a100", "nodes": 1}}
    tied = ddlsim.load_config(base, ["parallel.data_parallel_size=1"])
    untied = ddlsim.load_config(base, ["parallel.data_parallel_size=1",
                                       "model.tie_word_embeddings=false"])
    m0, m1 = ddlsim.memory_per_device(tied), ddlsim.memory_per_device(untied)
    head = 50257 * 768 / 2          # V·h / t parameters of the output head on the one stage
    # mixed-precision Adam (ZeRO paper §3.1): 2 bytes of weight, 12 of state; the gradient is
    # Megatron's fp32 main grad with bf16 (4 bytes; megatron-core-2024's grad_reduce_dtype)
    assert (m1.weights - m0.weights, m1.gradients - m0.gradients, m1.optimizer - m0.optimizer) \
        == pytest.approx((2 * head, 4 * head, 12 * head))
    assert m1.activations == m0.activations
    r0, r1 = ddlsim.predict(tied), ddlsim.predict(untied)
    assert r1.parameter_count - r0.parameter_count == 50257 * 768


def test_tied_embedding_copy_on_the_last_stage_as_before():
    # PP > 1: the tied embedding is copied to the last stage (Megatron), so untying changes
    # nothing there (the copy becomes the head) and the first stage keeps its embedding
    base = {"model": "gpt3-1.3b", **{k: v for k, v in PLAN.items() if k != "parallel"},
            "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}}
    tied = ddlsim.load_config(base)
    untied = ddlsim.load_config(base, ["model.tie_word_embeddings=false"])
    a, b = tied.family.memory(tied), untied.family.memory(untied)
    assert [m.weights for m in a] == [m.weights for m in b]


# ---------------------------------------------------------------- refusals
def test_mixture_of_experts_config_is_read_from_the_cli(tmp_path):
    # Mixtral's config.json through --model: an MoE decoder (tests/workloads/test_moe.py pins
    # its counts and trace)
    # (MoE layers with TP need sequence parallelism in Megatron-Core: the stack's rule)
    r = runner.invoke(app, ["predict", str(run_config(tmp_path, "gpt2-124m")), "--model",
                            str(HF / "mixtral-8x7b-v0.1.json"), "-f", "json", "--allow-oom",
                            "--set", "parallel.sequence_parallel=true"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parameter_count"] == 46_702_792_704


def test_kv_heads_must_divide_by_tp():
    with pytest.raises(ConfigError, match=r"num_key_value_heads = 8 is not divisible by "
                                          r"parallel.tensor_model_parallel_size = 16"):
        ddlsim.load_config({"model": "llama2-70b", **PLAN},
                           ["parallel.tensor_model_parallel_size=16",
                            "parallel.pipeline_model_parallel_size=1", "system.nodes=2"])


def test_unknown_architecture_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"architecture = 'lama'.*did you mean 'llama'.*"
                                          r"allowed: (\w+, )*gpt, (\w+, )*llama\b"):
        ddlsim.load_config({"model": {"architecture": "lama"}, **PLAN})


def test_unknown_key_of_a_family_lists_that_familys_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'num_kv_heads' in model.*did you mean "
                                          r"'num_key_value_heads'"):
        ddlsim.load_config({"model": {"preset": "llama2-7b", "num_kv_heads": 8}, **PLAN})


def test_presets_list_every_family_with_its_summary():
    r = runner.invoke(app, ["presets", "model"], terminal_width=200)
    assert r.exit_code == 0 and not r.stderr
    text = r.stdout
    for name in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                 "llama3.1-405b", "mistral-7b", "qwen2-7b", "gpt3-175b", "gpt2-124m"):
        assert name in text
    cfg = ddlsim.load_config({"model": "llama2-70b", **PLAN})
    assert cfg.family.summary(cfg.model) == (
        "llama2-70b: 80 layers, h 8192, 64 heads (8 KV), SwiGLU 28672, RMSNorm, rotary, "
        "untied, vocab 32000, 69 B params")


def test_example_runs_without_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = ddlsim.load_config(ROOT / "examples" / "llama2-70b-64-h100.yaml")
    assert [w.category for w in caught] == []   # Llama-2's other keys change no step
    assert (cfg.world_size, cfg.model.num_key_value_heads) == (64, 8)


def test_resolved_config_of_a_llama_result_loads_back_as_the_same_config():
    cfg = ddlsim.load_config({"model": "llama3-8b", **PLAN})
    back = ddlsim.load_config(ddlsim.predict(cfg, check_fit=False).config)
    assert back == cfg and type(back.model) is type(cfg.model)

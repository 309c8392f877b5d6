"""The nemotron architecture (Nemotron-4: squared-ReLU MLP, LayerNorm1p, partial rotary
embeddings): its kernels, its model section, its HuggingFace config and its Megatron-LM flags."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.elementwise import activation_passes, layer_elementwise_parts
from ddlsim.simulator.kernels.elementwise_backward import (activation_backward_passes,
                                                           layer_elementwise_backward_parts)
from ddlsim.simulator.kernels.rotary import rope_bytes
from ddlsim.workloads.models.decoder import DecoderShape
from ddlsim.workloads.models.hf import from_hf_config

#: Nemotron-4 8B as NeMo-Framework-Launcher 24.07 trains it (nemotron/nemotron_8b.yaml)
NEMOTRON_8B = {"architecture": "nemotron", "name": "nemotron-8b", "num_hidden_layers": 32,
               "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 16384,
               "vocab_size": 256000, "max_position_embeddings": 4096}


def _config(stack: str = "megatron-core-2024", compile: bool = False, **model):
    software = {"stack": stack, **({"compile": True} if compile else {})}
    return ddlsim.load_config({
        "model": {**NEMOTRON_8B, **model},
        "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                     "zero_stage": 3 if stack.startswith("torchtitan") else 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
                  "dtype": "bf16"},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": software}})


def test_squared_relu_passes_follow_torch_and_megatron():
    """Unfused: relu and pow forward; pow_backward's copy, scalar multiply and product and
    threshold_backward backward. Fused (one generated kernel): read and write forward, read
    two and write one backward. A bias adds its own kernel either way."""
    d = 2
    assert activation_passes(False, False, False, d, squared_relu=True) == [4, 4]
    assert activation_passes(False, False, True, d, squared_relu=True) == [4]
    assert activation_passes(False, True, True, d, squared_relu=True) == [4, 4]
    assert activation_backward_passes(False, False, False, d, squared_relu=True) == [4, 4, 6, 6]
    assert activation_backward_passes(False, False, True, d, squared_relu=True) == [6]
    assert activation_backward_passes(False, True, False, d, squared_relu=True) == \
        [4, 4, 6, 6, 2]
    # GeLU is unchanged
    assert activation_passes(False, True, False, d) == [4, 4]


@pytest.mark.parametrize("stack, kernels", [("megatron-core-2024", 1), ("torchtitan-2025", 2)])
def test_the_stack_says_whether_squared_relu_is_one_kernel(stack, kernels):
    """Megatron's squared_relu is a @jit_fuser (torch.compile) function: one kernel each way;
    an eager stack runs relu and pow (and four kernels backward)."""
    cfg = _config(stack)
    shape, sw = cfg.model.shape(), cfg.software
    y = 4096 * shape.ffn / 2
    fwd = layer_elementwise_parts(shape, 1, 4096, 2, True, 2, sw)["activation"]
    bwd = layer_elementwise_backward_parts(shape, 1, 4096, 2, True, 2, sw)["activation"]
    assert len(fwd) == kernels and len(bwd) == (1 if kernels == 1 else 4)
    assert sum(k.bytes for k in fwd) == pytest.approx(2 * 2 * y * kernels)
    assert all(k.variant == "" for k in fwd + bwd)


def test_compile_fuses_squared_relu_and_the_plan_names_it():
    assert not _config("torchtitan-2025").software.fused_squared_relu
    assert _config("torchtitan-2025", compile=True).software.fused_squared_relu
    from ddlsim.planinfo import plan_fields
    plan = plan_fields(_config())
    assert "squared-relu" in plan["fused"] and "bias-gelu" not in plan["fused"] + \
        plan["not_fused"]
    assert ddlsim.predict(_config()).iteration_time_s > 0


def test_partial_rotary_share_shrinks_unfused_rope_only():
    shape = _config().model.shape()
    assert shape.rotary_share == 0.5
    full = DecoderShape(32, 4096, 32, 16384, 256000, positions="rotary", norm="layernorm",
                        activation="relu2")

    class Sw:
        fused_rope, rope_form = False, "rotate_half"
    assert sum(rope_bytes(shape, 1, 4096, 2, 2, Sw)) == \
        pytest.approx(0.5 * sum(rope_bytes(full, 1, 4096, 2, 2, Sw)))
    Sw.fused_rope = True     # TransformerEngine's fused kernel copies the unrotated half
    assert sum(rope_bytes(shape, 1, 4096, 2, 2, Sw)) == sum(rope_bytes(full, 1, 4096, 2, 2, Sw))


def test_the_model_line_and_the_parameters():
    cfg = _config()
    sh = cfg.model.shape()
    h, f, L, V = 4096, 16384, 32, 256000
    # MHA q/k/v/o 4h², up and down 2hf, two LayerNorms 4h (no biases on linears), untied
    # embedding and head 2Vh, final LayerNorm 2h
    assert sh.params == L * (4 * h * h + 2 * h * f + 4 * h) + 2 * V * h + 2 * h
    line = cfg.family.summary(cfg.model)
    assert "squared-ReLU 16384" in line and "LayerNorm" in line and "50% of each head" in line


@pytest.mark.parametrize("bad, match", [
    ({"partial_rotary_factor": 0}, "partial_rotary_factor"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"hidden_act": "silu"}, "hidden_act"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts = 8"),
])
def test_bad_nemotron_fields_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        ddlsim.load_config({"model": {**NEMOTRON_8B, **bad},
                            "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                      "seq_length": 4096},
                            "system": {"preset": "dgx-h100", "nodes": 1}})


def test_squared_relu_is_refused_where_it_is_not_modelled():
    with pytest.raises(ConfigError, match="relu2"):
        DecoderShape(2, 64, 4, 256, 100, positions="rotary", gated_mlp=True, activation="relu2")
    with pytest.raises(ConfigError, match="rotary_share"):
        DecoderShape(2, 64, 4, 256, 100, max_positions=64, rotary_share=0.5)


def test_a_huggingface_nemotron_config_is_read_as_one():
    """transformers' NemotronConfig keys (the 4B Minitron's shapes); partial_rotary_factor is
    read for nemotron and still reported as not modelled on a llama."""
    doc = {"architectures": ["NemotronForCausalLM"], "model_type": "nemotron",
           "hidden_act": "relu2", "hidden_size": 3072, "intermediate_size": 9216,
           "max_position_embeddings": 4096, "num_attention_heads": 24,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "norm_eps": 1e-05,
           "rope_theta": 10000, "partial_rotary_factor": 0.5, "tie_word_embeddings": False,
           "vocab_size": 256000, "head_dim": 128}
    fields, unmodelled = from_hf_config(doc, source="config.json")
    assert unmodelled == []
    assert (fields["activation"], fields["rotary_share"], fields["gated_mlp"],
            fields["norm"]) == ("relu2", 0.5, False, "layernorm")
    from ddlsim.workloads.decoder import _section
    section = _section(fields)
    assert section["architecture"] == "nemotron" and section["partial_rotary_factor"] == 0.5
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128,
            "vocab_size": 100, "activation_function": "relu2"}
    with pytest.raises(ConfigError, match="activation_function = 'relu2'.*model_type nemotron"):
        from_hf_config(gpt2, source="config.json")
    llama = {**doc, "model_type": "llama", "hidden_act": "silu"}
    llama.pop("norm_eps")
    assert any(u.startswith("partial_rotary_factor") for u in from_hf_config(
        llama, source="config.json")[1])


def test_megatron_flags_import_a_nemotron(tmp_path):
    from ddlsim.importers import import_config
    script = tmp_path / "run.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
        "--global-batch-size 8 --position-embedding-type rope --rotary-percent 0.5 "
        "--squared-relu --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 "
        "--vocab-size 32000 --bf16\n")
    m = import_config([script], system="dgx-h100").config["model"]
    assert (m["architecture"], m["partial_rotary_factor"], m["intermediate_size"]) == \
        ("nemotron", 0.5, 4096)
    llama = tmp_path / "llama.sh"
    llama.write_text(script.read_text().replace("--squared-relu", "--swiglu --normalization "
                                                "RMSNorm"))
    with pytest.raises(ConfigError, match="--rotary-percent 0.5"):
        import_config([llama], system="dgx-h100")

"""What a Megatron-Core MoE layer keeps for its backward (``DecoderTraffic.moe_block_bytes``,
the stack feature ``moe_saves_expert_output``, FP8's 1-byte linear inputs in an MoE layer and
Qwen3's query/key norm inputs), counted by hand from the code that runs: Megatron-Core
core_v0.14.0rc7 (Megatron-Bridge v0.1.0rc3's pin, uv.lock megatron-core 0.14.0rc7) with
TransformerEngine v2.7; and Megatron-Bridge's published Qwen3-30B-A3B plan on 16 H100s
(TP1 PP2 VP24 EP8 MBS2, FP8 current scaling, no recomputation), which ran on 80 GB."""

from __future__ import annotations

import pytest

import ddlsim
from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

vmm = load_script("validate_moe_models")

#: Qwen3-30B-A3B (config.json): hidden, query width (32 x 128), one of K/V (4 x 128), heads,
#: experts, top-k, expert FFN
H, Q, KV, HEADS, E, K, FE = 2048, 4096, 512, 32, 128, 8, 768


def _cfg(stack: str = "megatron-core-2025"):
    """Qwen3-30B-A3B on one DGX H100 (EP 8) under ``stack``."""
    return ddlsim.load_config({
        "model": "qwen3-30b-a3b", "parallel": {"expert_model_parallel_size": 8},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}})


def _shape():
    return _cfg().model.shape()


def test_a_megatron_core_2025_moe_layer_under_fp8_keeps_what_its_modules_save():
    """Per token, TP 1, cuDNN attention, FP8 linears, expert outputs not kept:
    norm inputs 2h + 2h, QKV's FP8 input h, the router's 16-bit input 2h; Q, K, V and the
    core's output 2(q + kv + kv + q), the q/k norms' inputs 2(q + kv), the projection's FP8
    input q; the log-sum-exp 4 B per head; per routed copy fc1's FP8 input h, fc1's output
    (SwiGLU's saved input) 4f_e and fc2's FP8 input f_e; router logits 2E."""
    attention = 7 * H + 4 * (Q + KV) + 2 * (Q + KV) - Q + 4 * HEADS
    block = K * (H + 5 * FE) + 2 * E
    got = _shape().layer_activation_bytes(1, 1, 1, False, "none", moe=True, flash=True,
                                          fp8=True, moe_output_kept=False)
    assert got == attention + block == 85376


def test_the_expert_output_is_kept_only_where_the_combine_weights_it():
    """Megatron-Core 2024 (900f1b76 unpermute: probs * permuted_tokens) keeps each routed
    copy's 16-bit output, 2h per copy; from 0.13 the weighted SwiGLU applies the
    probabilities and nothing after fc2 is kept."""
    sh = _shape()
    kept, dropped = (sh.moe_block_bytes(1, 1, 1, False, moe_output_kept=v) for v in (True, False))
    assert kept - dropped == K * 2 * H
    kinds = {stack: _cfg(stack).software.moe_saves_expert_output
             for stack in ("megatron-core-2024", "megatron-core-2025", "deepspeed")}
    assert kinds == {"megatron-core-2024": True, "megatron-core-2025": False, "deepspeed": True}


def test_fp8_halves_an_moe_layers_linear_inputs_only():
    """FP8 takes one byte off each element of the four linear inputs an MoE layer keeps
    (QKV h, projection q, per routed copy fc1 h and fc2 f_e); the 16-bit tensors (norm
    inputs, the router's input, Q/K/V, fc1's output) stay."""
    sh = _shape()
    bf16, fp8 = (sh.layer_activation_bytes(1, 1, 1, False, "none", moe=True, flash=True,
                                           fp8=v, moe_output_kept=False) for v in (False, True))
    assert bf16 - fp8 == H + Q + K * (H + FE)


def test_recomputing_the_moe_block_frees_what_the_block_keeps():
    """``recompute_modules: [moe]`` keeps the block's input alone: it frees exactly
    moe_block_bytes; under FP8 ``moe_act`` frees fc2's 1-byte input (fc2 then saves the
    16-bit original, which the checkpoint discards: d7288711 experts.py lines 234-237)."""
    from ddlsim.workloads.decoder.recompute_modules import layer_bytes
    cfg = _cfg()
    sh, sw = cfg.model.shape(), cfg.software
    kinds = {"flash": True, "fp8": True, "moe_output_kept": False}
    whole = sh.layer_activation_bytes(1, 1, 1, False, "none", moe=True, **kinds)
    assert whole - layer_bytes(sh, ("moe",), sw, 1, 1, 1, False, True, **kinds) == \
        sh.moe_block_bytes(1, 1, 1, False, fp8=True, moe_output_kept=False)
    assert whole - layer_bytes(sh, ("moe_act",), sw, 1, 1, 1, False, True, **kinds) == K * FE


@pytest.mark.parametrize("release", ["25.09", "25.11"])
def test_bridges_qwen3_30b_plan_fits_on_80_gb_as_it_ran(release):
    """The published plan ran without recomputation; stage 1 holds 47 layer-micro-batches
    at its peak (interleaved warm-up 2(p-s-1) + (v-1)p = 46, plus the steady state's first
    forward; Megatron-Core schedules.py microbatch_group_size_per_vp_stage defaults to p),
    each 8,192 tokens of 85,376 B (25.09, capacity 1.0 padded: k copies per token)."""
    row = next(r for r in vmm.rows()
               if r["release"] == release and r["model"].startswith("Qwen3_30B"))
    mem = ddlsim.memory_per_device(ddlsim.load_config(vmm.config(row)))
    assert mem.fits, mem
    if release == "25.09":
        assert mem.activations == pytest.approx(47 * 2 * 4096 * 85376, rel=1e-9)

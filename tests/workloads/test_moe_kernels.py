"""The MoE layer's own kernels: its element-wise passes (no ``s²`` score passes: those are the
attention core's kernels, as in a dense layer) and the FP8 recipe's casts around the routed
experts' grouped GEMMs and the attention projections (``ddlsim/workloads/decoder/fp8linear.py``),
which stay with the data gradient when the weight gradients are delayed. Expected bytes are
derived in the comments.
"""

from __future__ import annotations

import pytest
from stage_ops import compute_ops

from ddlsim.workloads.decoder.combined_nodes import _split_wgrad

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

H, F_E, E, K = 4096, 14336, 8, 2          # Mixtral 8x7B (its config.json)


def run(seq: int = 4096, dtype: str = "bf16", ep: int = 8, grouped: bool = True,
        overlap: bool = False, attention: str | None = None) -> dict:
    """Mixtral 8x7B cut to two layers on one DGX H100 (TP1, DP8, EP ``ep``)."""
    sw = {"stack": "megatron-core-2025"}
    if attention:
        sw["kernels"] = {"attention": attention}
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": ep,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": grouped,
                                 "overlap_expert_parallel_comm": overlap,
                                 "delay_wgrad_compute": overlap}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": seq,
                      "dtype": dtype, "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": sw}}


@pytest.mark.parametrize("attention", [None, "unfused"])
def test_moe_elementwise_passes_grow_with_the_sequence_not_its_square(attention):
    # norms, residuals, rotary: bytes ∝ s; the softmax passes over the b·a·s² scores are the
    # attention core's kernels, so doubling s doubles the layer's element-wise bytes exactly
    short = compute_ops(run(2048, attention=attention))["fwd.elementwise"].bytes
    long = compute_ops(run(4096, attention=attention))["fwd.elementwise"].bytes
    assert long == pytest.approx(2 * short, rel=1e-12)


def test_moe_elementwise_matches_the_dense_layers_passes_less_its_mlp():
    # Mixtral, TP1, b = 1, s = 4096, bf16: x = s·h = 16 Mi elements; two RMSNorms (read +
    # write, 2x each), two residual adds (3x each), RoPE on q and k (q + k widths 4096 + 1024:
    # 2·s·5120) → (4 + 6)·x + 2·s·5120 elements × 2 bytes
    s = 4096
    expected = 2 * (10 * s * H + 2 * s * (4096 + 1024))
    assert compute_ops(run(s))["fwd.elementwise"].bytes == pytest.approx(expected, rel=1e-12)


def test_fp8_experts_carry_the_recipes_casts_per_grouped_launch():
    # EP8: one local expert, n = 8 ranks · s·k/E = 8 · 4096·2/8 = 8192 tokens; fc1 [n, h] ·
    # [h, 2·f_e]; TE delayed scaling: input cast+transpose 4·n·h, weight cast 3·h·2f_e bytes
    fc1 = compute_ops(run(dtype="fp8"))["fwd.experts.fc1"]
    casts = [k.bytes for k in fc1.kernels if k.kind == "memory"]
    n = 8 * 4096 * K / E
    assert casts == [4 * n * H, 3 * H * 2 * F_E]
    assert [k.kind for k in fc1.kernels] == ["memory", "memory", "gemm"]
    assert not any(k.kind == "memory" for k in compute_ops(run())["fwd.experts.fc1"].kernels)


def test_without_grouped_gemm_each_expert_casts_its_own_tensors():
    # EP2: four local experts of n = 2 · 4096·2/8 = 2048 tokens each; one launch per expert,
    # each after its own casts; grouped, the four are quantized in one call (4× the bytes)
    grouped = compute_ops(run(dtype="fp8", ep=2))["bwd.experts.fc2"].kernels
    alone = compute_ops(run(dtype="fp8", ep=2, grouped=False))["bwd.experts.fc2"].kernels
    assert [k.kind for k in alone] == ["memory", "gemm", "gemm"] * 4
    n = 2 * 4096 * K / E
    assert alone[0].bytes == 4 * n * H            # the output gradient's cast + transpose
    assert grouped[0].bytes == 4 * alone[0].bytes and len(grouped) == 3


def test_delayed_weight_gradients_leave_the_casts_with_the_data_gradient():
    op = compute_ops(run(dtype="fp8", ep=2, grouped=False))["bwd.experts.fc2"]
    dgrad, wgrad = _split_wgrad(op)
    gemms = [k for k in op.kernels if k.kind == "gemm"]
    assert [k.kind for k in dgrad.kernels] == ["memory"] * 4 + ["gemm"] * 4
    assert list(dgrad.kernels[4:]) == gemms[0::2] and list(wgrad.kernels) == gemms[1::2]
    assert dgrad.flops + wgrad.flops == op.flops



def test_fp8_attention_projections_carry_the_casts_a_dense_layer_has():
    # qkv of Mixtral at TP1: [s, h]·[h, 4096 + 2·1024]; TE delayed scaling: input cast and
    # transpose 4·s·h, weight cast 3·h·6144 bytes (the passes a dense layer's qkv has)
    s = 4096
    qkv = compute_ops(run(dtype="fp8"))["fwd.qkv"].kernels
    assert [k.kind for k in qkv] == ["memory", "memory", "gemm"]
    assert [k.bytes for k in qkv if k.kind == "memory"] == [4 * s * H, 3 * H * 6144]
    assert [k.kind for k in compute_ops(run())["fwd.qkv"].kernels] == ["gemm"]

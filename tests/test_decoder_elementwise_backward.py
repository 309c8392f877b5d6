"""The backward kernels of a dense decoder layer's element-wise ops
(ddlsim/simulator/kernels/elementwise_backward.py), derived by hand from torch's autograd
formulas (``tools/autograd/derivatives.yaml``), and set beside the kernels torch 2.11 launched
per layer in the H200 trace (benchmarks/data/device_h200_2026-11-30/run1/llama)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import backward_kernels, layer_elementwise_kernels
from ddlsim.simulator.kernels.elementwise_backward import (activation_backward_passes,
                                                           layer_elementwise_backward_kernels,
                                                           residual_backward_bytes)
from ddlsim.workloads.decoder.layerkernels import layer_kernels

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
S = 8192
MiB = 2 ** 20


def _llama(*sets):
    return ddlsim.load_config(str(EXAMPLE), list(sets))


def test_activation_backward_is_torchs_autograd():
    # SwiGLU eager: mul's two products (read grad and the other factor, write: 3d each), then
    # silu_backward (read grad and the input, write: 3d); fused kernels: twice the forward
    assert activation_backward_passes(True, False, False, 2) == [6, 6, 6]
    assert activation_backward_passes(True, False, True, 2) == [12]
    # GeLU eager: gelu_backward 3d, then the bias gradient's sum over the tokens (read d)
    assert activation_backward_passes(False, True, False, 2) == [6, 2]
    assert activation_backward_passes(False, False, False, 2) == [6]
    assert activation_backward_passes(False, True, True, 2) == [8]


def test_torchtitan_layer_backward_by_hand():
    # torchtitan's Llama 3.1 8B layer at 8192 tokens, bf16, PyTorch 2.11's fused RMSNorm:
    # x = s·h hidden, y = s·f MLP, qk = s·(q + kv) rotary elements
    cfg = _llama("system.software={stack: torchtitan-2025, kernels: {fused_layernorm: true}}")
    sh, sw = cfg.model.shape(), cfg.software
    x, y, qk = S * 4096, S * 14336, S * (4096 + 1024)
    got = layer_kernels(sh, sw, 1, S, 1, False, "bf16")["bwd.ew"]
    want = ([4 * 2 * x] * 2                          # the norms: twice their forward (2d)
            + [3 * 2 * x] * 2                        # one gradient sum per residual connection
            + [3 * 2 * y] * 3                        # mul's two products, silu_backward
            + [p * 2 * qk for p in (2, 2, 2, 2, 3)])  # RoPE: the forward's passes again
    assert [k.bytes for k in got] == want
    assert {k.variant for k in got} == {""}
    # twice the forward's kernels moved 12x + 2y + 22qk bytes more (3.70 against 5.16 GiB):
    # each residual add's 2·3d, SiLU's 4d against silu_backward's 3d, RoPE's second 11d
    fwd = layer_elementwise_kernels(sh, 1, S, 1, False, 2, sw)
    old = sum(k.bytes for k in backward_kernels(fwd))
    assert old - sum(want) == 12 * x + 2 * y + 22 * qk
    assert (sum(want) / 2 ** 30, old / 2 ** 30) == pytest.approx((3.7031, 5.1562), abs=1e-4)


def test_megatron_fused_kernels_keep_twice_their_forward_but_rope():
    # Megatron-Core: fused norms (TE), bias-dropout-add, SwiGLU: twice the forward, as before;
    # TE's fused RoPE backward reads the output gradient and writes the input's: 2d, as forward
    cfg = _llama("system.software=megatron-core-2024")
    sh, sw = cfg.model.shape(), cfg.software
    fwd = layer_elementwise_kernels(sh, 1, S, 1, False, 2, sw)
    bwd = layer_kernels(sh, sw, 1, S, 1, False, "bf16")["bwd.ew"]
    assert bwd == layer_elementwise_backward_kernels(sh, 1, S, 1, False, 2, sw)
    rope = 2 * 2 * S * (4096 + 1024)
    assert [k.bytes for k in bwd] == [2 * k.bytes for k in fwd[:-1]] + [rope]
    assert fwd[-1].bytes == rope
    assert [k.variant for k in bwd if k.variant] == ["gated_backward"]


def test_unfused_bias_dropout_add_and_gelu():
    # a GPT layer (biases, dropout, GeLU) with Megatron-LM 2021's fusions off: per residual the
    # stream's gradient sum (3d), dropout's backward (read grad and the 1-byte mask, write:
    # 2d + 1) and the bias gradient (read d); the GeLU's gelu_backward (3d) and bias sum (d)
    cfg = ddlsim.load_config({
        "model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                  "vocab_size": 1024, "max_position_embeddings": 2048},
        "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 1,
                   "software": {"stack": "megatron-lm-2021", "kernels": {
                       "fused_bias_dropout_add": False, "fused_bias_gelu": False}}}})
    sh, sw = cfg.model.shape(), cfg.software
    x, y = 2048 * 1024, 2048 * 4096
    assert residual_backward_bytes(sh, x, 2, sw) == [6 * x, 5 * x, 2 * x]
    bwd = layer_kernels(sh, sw, 1, 2048, 1, False, "fp16")["bwd.ew"]
    assert [k.bytes for k in bwd[2:]] == [6 * x, 5 * x, 2 * x] * 2 + [6 * y, 2 * y]
    assert [k.variant for k in bwd[2:]] == [""] * 6 + ["activation_backward", ""]


def test_kernel_counts_match_the_h200_trace():
    """Per layer, torch 2.11 launched one silu_backward and two mul kernels over the MLP
    activation and one add per residual connection (under FusedRmsNormBackward0, summing the
    norm's input gradient with the residual's); ddlsim's backward lists as many."""
    from benchscripts import load_script
    kv = load_script("kineto_vs_ddlsim")
    events = kv.load_events(kv.TRACE)
    ks, windows = kv.device_kernels(events), kv.layer_windows(events)
    per_layer: Counter = Counter()
    for k in ks:
        if kv.layer_of(k, windows) == 3 and kv.classify(k, 3) == "element-wise backward":
            kind = next((w for w in ("silu_backward", "CUDAFunctor_add", "BinaryFunctor")
                         if w in k.name), "other")
            per_layer[(kv.op_label(k), kind)] += 1
    assert per_layer[("SiluBackward0", "silu_backward")] == 1
    # SwiGLU's mul: two contiguous bf16 products (the rotary embedding's complex mul, under
    # MulBackward0 too, is not a BinaryFunctor<BFloat16> kernel: fp32, strided)
    assert sum(1 for k in ks if kv.layer_of(k, windows) == 3 and kv.op_label(k) ==
               "MulBackward0" and "vectorized_elementwise_kernel<8" in k.name) == 2
    # one add per residual connection, launched by the norm's node
    assert per_layer[("FusedRmsNormBackward0", "CUDAFunctor_add")] == 2
    cfg = kv.load_config()
    sh, sw = cfg.model.shape(), cfg.software
    y = S * sh.ffn * 2
    bwd = layer_kernels(sh, sw, 1, S, 1, False, "bf16")["bwd.ew"]
    assert sum(k.bytes == 3 * y for k in bwd) == 3
    assert sum(k.bytes == 3 * 2 * S * sh.hidden for k in bwd) == 2

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
                                                           layer_elementwise_backward_parts,
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
    # x = s·h hidden, y = s·f MLP, q and k the rotary elements of each tensor
    cfg = _llama("system.software={stack: torchtitan-2025, kernels: {fused_layernorm: true}}")
    sh, sw = cfg.model.shape(), cfg.software
    x, y, q, k = S * 4096, S * 14336, S * 4096, S * 1024
    conj = 2 * S * 128 / 2 * 8                       # freqs_cis (s × d/2 complex64), r + w
    got = layer_kernels(sh, sw, 1, S, 1, False, "bf16")["bwd.ew"]
    want = ([3 * 2 * x, 2 * 2 * x] * 2               # each norm: grad input 3d, gamma 2d
            + [3 * 2 * x] * 2                        # one gradient sum per residual connection
            + [3 * 2 * y] * 3                        # mul's two products, silu_backward
            + [v for n in (q, k) for v in (6 * n, conj, 8 * n, 6 * n)])   # complex RoPE
    assert [k.bytes for k in got] == want
    # the classes of the kernels torch runs (timed at a device's measured rate where it has one)
    assert {k.variant for k in got} == {"", "fused_rmsnorm_backward", "rope_upcast",
                                        "rope_complex_mul"}
    # against twice the forward's kernels: the norms 5d each, not 4d (-2·x·d), the residual
    # adds 3d, not 6d (+2·3·x·d), SiLU's 4d against silu_backward's 3d (+y·d), RoPE's
    # 2d + 16 once, not twice (+20(q + k)), and the conj kernels
    fwd = layer_elementwise_kernels(sh, 1, S, 1, False, 2, sw)
    old = sum(k.bytes for k in backward_kernels(fwd))
    assert old - sum(want) == -4 * x + 12 * x + 2 * y + 20 * (q + k) - 2 * conj
    assert (sum(want) / 2 ** 30, old / 2 ** 30) == pytest.approx((3.7656, 5.0), abs=1e-4)


def test_megatron_fused_kernels_keep_twice_their_forward_but_norms_and_rope():
    # Megatron-Core: fused bias-dropout-add and SwiGLU: twice the forward, as before; TE's
    # norms one backward kernel (read dz and x, write dx: 3d); TE's fused RoPE backward reads
    # the output gradient and writes the input's: 2d, as forward, on q and on k apart
    cfg = _llama("system.software=megatron-core-2024", "parallel.zero_stage=1")  # no_zero3
    sh, sw = cfg.model.shape(), cfg.software
    fwd = layer_elementwise_kernels(sh, 1, S, 1, False, 2, sw)
    bwd = layer_kernels(sh, sw, 1, S, 1, False, "bf16")["bwd.ew"]
    assert bwd == layer_elementwise_backward_kernels(sh, 1, S, 1, False, 2, sw)
    x, rope = S * 4096, [2 * 2 * S * 4096, 2 * 2 * S * 1024]
    assert [k.bytes for k in bwd] == [3 * 2 * x] * 2 + [2 * k.bytes for k in fwd[2:-2]] + rope
    assert [k.bytes for k in fwd[-2:]] == rope
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
    # apex's fused LayerNorm backward first: grad input (3d) and gamma (2d) per norm
    assert [k.bytes for k in bwd[:4]] == [6 * x, 4 * x] * 2
    assert [k.bytes for k in bwd[4:]] == [6 * x, 5 * x, 2 * x] * 2 + [6 * y, 2 * y]
    assert [k.variant for k in bwd[4:]] == [""] * 6 + ["activation_backward", ""]


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
    parts = layer_elementwise_backward_parts(sh, 1, S, 1, False, 2, sw)
    assert sum(k.bytes == 3 * y for k in parts["activation"]) == 3
    assert sum(k.bytes == 3 * 2 * S * sh.hidden for k in parts["residual"]) == 2
    # two kernels per fused RMSNorm: layer_norm_grad_input_kernel_vectorized and
    # GammaBetaBackwardCUDAKernelTemplate; RoPE's upcast, conj, complex mul, cast per tensor
    names = [k.name for k in ks if kv.layer_of(k, windows) == 3
             and kv.op_label(k) == "FusedRmsNormBackward0" and "CUDAFunctor_add" not in k.name]
    assert len(names) == len(parts["norm"]) == 4
    assert sum("layer_norm_grad_input_kernel" in n for n in names) == 2
    rope = [k for k in ks if kv.layer_of(k, windows) == 3
            and kv.classify(k, 3) == "element-wise backward" and kv.ew_op(k) == "rope"]
    assert len(rope) == len(parts["rope"]) == 8
    assert sum("conj_kernel" in k.name for k in rope) == 2

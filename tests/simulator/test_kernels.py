"""The kernel-level compute model (docs/compute.md): each number derived by hand here.

Device: the dgx-a100 preset, i.e. A100-SXM4: 312 TFLOP/s bf16 peak, 108 SMs, matmul ceiling
η_max = 0.869 (MAMF table, a short burst), capped at the sustained 0.829 of a GEMM that saturates
the 400 W limit (H. He's randn 8192³, device.power_limits[400]), 2,039 GB/s × 0.90 achieved
memory bandwidth; tile 256×128.
"""

from __future__ import annotations


import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import loss_bytes
from ddlsim.simulator.kernels import (attention_kernels, causal_fraction, gemm_quantisation,
                                      kernel_device, kernel_time, layer_elementwise_kernels)
from ddlsim.workloads.trace import Kernel

PEAK, ETA, SMS = 312e12, 0.869, 108
SUSTAINED = 0.829
BW = 2039e9 * 0.90


@pytest.fixture(scope="module")
def a100():
    return kernel_device(ddlsim.load_config(_cfg()).system)


def _cfg(**train):
    return {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 1024, "max_position_embeddings": 2048},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048,
                      **train},
            "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 1}}


def gemm(M, N, K, dtype="bf16"):
    return Kernel("gemm", (M, N, K), dtype=dtype)


def test_large_gemm_runs_at_the_ceiling(a100):
    # 27648 × 8192: 108 × 64 tiles of 256×128 = exactly 64 waves of 108 SMs, no padding
    M, N, K = 27648, 8192, 8192
    assert gemm_quantisation(M, N, 1, SMS, K) == 1.0
    # the burst ceiling would give 2MNK / (peak · 0.869); the board saturated at 400 W holds
    # 0.829 (kernels/power.py), so the full-wave GEMM runs at the sustained rate
    assert kernel_time(gemm(M, N, K), a100) == pytest.approx(
        2 * M * N * K / (PEAK * SUSTAINED), rel=1e-12)
    assert a100.sustained_rate("bf16") == SUSTAINED < ETA


def test_wave_quantised_small_gemm(a100):
    # 3072 × 1280: 12 × 10 = 120 tiles (either orientation: 24 × 5) → 2 waves of 108 slots,
    # 120 / 216 of them busy; more tiles than SMs, so no split-K
    M, N, K = 3072, 1280, 4096
    q = 120 / 216
    assert gemm_quantisation(M, N, 1, SMS, K) == pytest.approx(q, rel=1e-12)
    t_flops = 2 * M * N * K / (PEAK * ETA * q)                       # 213 µs
    t_mem = (M * K + K * N + M * N) * 2 / BW                         # 23.7 µs
    assert t_flops > t_mem
    assert kernel_time(gemm(M, N, K), a100) == pytest.approx(t_flops, rel=1e-12)


def test_tile_padded_odd_shape(a100):
    # M = 8193 pays a whole extra row of tiles: ⌈8193/256⌉ = 33 × 64 = 2112 tiles → 20 waves
    # (the other orientation: 65 × 32 = 2080 tiles, also 20 waves): 8193·8192 / (20·108·256·128)
    M, N, K = 8193, 8192, 8192
    q = M * N / (20 * SMS * 256 * 128)
    assert q == pytest.approx(0.9483, abs=1e-4)
    assert gemm_quantisation(M, N, 1, SMS, K) == pytest.approx(q, rel=1e-12)
    assert kernel_time(gemm(M, N, K), a100) == pytest.approx(2 * M * N * K / (PEAK * ETA * q),
                                                             rel=1e-12)


def test_skinny_gemm_is_memory_bound(a100):
    # K = N = 128: 2MNK / 2(MK + KN + MN) ≈ 64 FLOP/byte, below the ridge 312e12·0.869/BW ≈ 148
    M, N, K = 65536, 128, 128
    t_mem = (M * K + K * N + M * N) * 2 / BW                         # 18.3 µs
    q = M * N / (3 * SMS * 256 * 128)                                # 256 tiles, 3 waves
    assert 2 * M * N * K / (PEAK * ETA * q) < t_mem                  # 10.0 µs of FLOPs
    assert kernel_time(gemm(M, N, K), a100) == pytest.approx(t_mem, rel=1e-12)


def test_split_k_fills_the_device_for_few_output_tiles():
    # 2048 × 8: 8 tiles of 256×128; K = 4096 split ⌊108/8⌋ = 13 ways → 104 slots in one wave
    assert gemm_quantisation(2048, 8, 1, SMS, 4096) == pytest.approx(
        2048 * 8 * 13 / (SMS * 256 * 128), rel=1e-12)


def test_compute_efficiency_overrides_the_ceiling():
    d = _cfg()
    d["system"]["compute_efficiency"] = 0.5
    dev = kernel_device(ddlsim.load_config(d).system)
    assert dev.ceiling("bf16") == 0.5
    assert kernel_time(gemm(27648, 8192, 8192), dev) == pytest.approx(
        2 * 27648 * 8192 * 8192 / (PEAK * 0.5), rel=1e-12)


def test_flash_attention_flops():
    # causal, s = 4096: n = 32 blocks of 128 per row, 32·33/2 of 32² computed = 33/64;
    # forward 4·b·a·s²·d of that, backward 2.5 × forward (FA2 §4.1)
    b, a, s, d = 2, 32, 4096, 128
    assert causal_fraction(s) == 33 / 64
    fwd = 4 * b * a * s * s * d * 33 / 64
    (kf,) = attention_kernels("flash2", b, a, s, d, 2, True, False)
    (kb,) = attention_kernels("flash2", b, a, s, d, 2, True, True)
    assert kf.kind == "flash" and kf.flops == pytest.approx(fwd, rel=1e-12)
    assert kb.flops == pytest.approx(2.5 * fwd, rel=1e-12)
    # Q, K, V read and O written once: no s² tensor moves
    assert kf.bytes == 4 * b * s * a * d * 2


def test_fused_softmax_attention_is_two_gemms_and_score_passes():
    # fused scale-mask-softmax: read + write the b·a·s² scores; dropout: read, write, 1-B mask
    b, a, s, d = 1, 16, 2048, 64
    S = b * a * s * s
    ks = attention_kernels("fused_softmax", b, a, s, d, 2, True, False)
    assert [k.shape for k in ks if k.kind == "gemm"] == [(s, s, d), (s, d, s)]
    assert all(k.batch == b * a for k in ks if k.kind == "gemm")
    # ... and the context's permute().contiguous() into [s, b, a·d]: read + write b·s·a·d
    x = b * s * a * d
    assert [k.bytes for k in ks if k.kind == "memory"] == [2 * 2 * S, (2 * 2 + 1) * S, 2 * 2 * x]
    # the softmax carries its class (a device may measure it), dropout the scores' variant
    assert [k.variant for k in ks if k.kind == "memory"] == ["softmax", "scores", ""]
    # unfused in 16 bits (Megatron-Core: no layer scaling): masked_fill_ and softmax, read +
    # write each; in fp32 (Megatron-LM 2021's query-key layer scaling): cast to fp32 (2 + 4),
    # scale, mask, softmax (4 + 4 each), cast back (4 + 2)
    unfused = attention_kernels("unfused", b, a, s, d, 2, True, False)
    assert [k.bytes for k in unfused if k.kind == "memory"] == [4 * S] * 2 + [5 * S, 4 * x]
    fp32 = attention_kernels("unfused", b, a, s, d, 2, True, False, softmax_fp32=True)
    assert [k.bytes for k in fp32 if k.kind == "memory"] == (
        [6 * S, 8 * S, 8 * S, 8 * S, 6 * S, 5 * S, 4 * x])
    # backward: softmax backward (P, dP -> dS), dropout's, and the Q, K, V gradients
    # concatenated for the QKV GEMM (torch.split's backward): read + write b·s·(a + 2g)·d,
    # here with g = 4 key/value heads
    bwd = attention_kernels("fused_softmax", b, a, s, d, 2, True, True, kv_heads=4)
    assert [k.bytes for k in bwd if k.kind == "memory"] == [
        3 * 2 * S, (2 * 2 + 1) * S, 2 * 2 * b * s * (a + 2 * 4) * d]
    # FlashAttention (TransformerEngine) takes the fused layout: no copy
    assert [k.kind for k in attention_kernels("flash2", b, a, s, d, 2, True, True)] == ["flash"]


def test_fused_and_unfused_elementwise_bytes():
    # GPT layer (biases, dropout, LayerNorm, GeLU), b = 1, s = 2048, h = 1024, f = 4096, t = 1:
    # x = s·h, y = s·f elements, 2 bytes each, 1-byte dropout masks
    cfg = ddlsim.load_config(_cfg())
    sh, x, y = cfg.model.shape(), 2048 * 1024, 2048 * 4096
    fused = cfg.software            # megatron-core-2024: everything fused
    got = [k.bytes for k in layer_elementwise_kernels(sh, 1, 2048, 1, False, 2, fused)]
    assert got == [2 * x * 2] * 2 + [3 * x * 2 + x] * 2 + [2 * y * 2]
    d = _cfg()
    d["system"]["software"] = {"stack": "megatron-lm-2021", "kernels": {
        "fused_layernorm": False, "fused_bias_dropout_add": False, "fused_bias_gelu": False}}
    plain = ddlsim.load_config(d).software
    got = [k.bytes for k in layer_elementwise_kernels(sh, 1, 2048, 1, False, 2, plain)]
    # one kernel per torch op: norm 5 passes (statistics 1, normalise 2, affine 2); bias 2,
    # dropout 2 (+ mask), residual add 3; bias 2, GeLU 2
    norm, residual = [1 * x * 2, 2 * x * 2, 2 * x * 2], [2 * x * 2, 2 * x * 2 + x, 3 * x * 2]
    assert got == norm * 2 + residual * 2 + [2 * y * 2, 2 * y * 2]
    assert sum(got) == 2 * 5 * x * 2 + 2 * ((2 + 3 + 2) * x * 2 + x) + 4 * y * 2


def test_cross_entropy_passes_over_the_fp32_logits():
    # per logit, 16-bit logits (d = 2): unfused forward = cast (read 2, write 4) + max 4 + sub_ 8
    # + exp 8 + sum 4 + div_ 8 = 38; backward = mul_ 8 + cast back (read 4, write 2) = 14.
    # Fused: cast+max 6, sub+exp+sum 8, div 8 = 22; backward: read 4, write 2 = 6
    n = 4096 * 50304
    assert loss_bytes(4096, 50304, 2, False) == 38 * n
    assert loss_bytes(4096, 50304, 2, False, backward=True) == 14 * n
    assert loss_bytes(4096, 50304, 2, True) == 22 * n
    assert loss_bytes(4096, 50304, 2, True, backward=True) == 6 * n
    # fp32 logits: the casts are no-ops (the fused max still reads the logits once)
    assert loss_bytes(1, 1, 4, False) == 32 and loss_bytes(1, 1, 4, False, backward=True) == 8
    assert loss_bytes(1, 1, 4, True) == 20 and loss_bytes(1, 1, 4, True, backward=True) == 8


def test_the_head_backward_carries_the_loss_backward():
    d = _cfg()
    d["system"]["software"] = "megatron-lm-2021"
    wl = ddlsim.build_workload(ddlsim.load_config(d))
    ops = {o.payload.name: o.payload for rc in wl.classes for blk in rc.program.blocks.values()
           for o in blk.flat.ops if hasattr(o.payload, "name")}
    assert ops["loss"].bytes == 38 * 2048 * 1024
    assert ops["bwd.loss"].bytes == 14 * 2048 * 1024


def test_fp8_runs_only_the_linear_gemms_in_fp8():
    from ddlsim.workloads.decoder.layerkernels import layer_kernels
    d = _cfg(dtype="fp8")
    d["system"]["preset"] = "dgx-h100"
    cfg = ddlsim.load_config(d)
    lk = layer_kernels(cfg.model.shape(), cfg.software, 1, 2048, 1, False, "fp8")
    gemms = [k for k in lk["attn"] + lk["mlp"] if k.kind == "gemm"]
    assert [k.shape for k in gemms] == [(2048, 3072, 1024), (2048, 1024, 1024),
                                        (2048, 4096, 1024), (2048, 1024, 4096)]
    assert all(k.dtype == "fp8" for k in gemms)
    assert [k.dtype for k in lk["attn"] if k.kind == "flash"] == ["bf16"]
    assert all(k.dtype == "bf16" for k in lk["ew"])
    # delayed-scaling casts: per forward GEMM its input (2 + 1 + 1 B) and weight (2 + 1 B)
    casts = [k.bytes for k in lk["mlp"] if k.kind == "memory"]
    assert casts == [4 * 2048 * 1024, 3 * 1024 * 4096, 4 * 2048 * 4096, 3 * 4096 * 1024]
    # memory: the four linear GEMM inputs kept in 1 byte (2·s·h + s·h + s·f bytes saved)
    sh = cfg.model.shape()
    saved = (sh.layer_activation_bytes(1, 2048, 1, False, "none", flash=True)
             - sh.layer_activation_bytes(1, 2048, 1, False, "none", flash=True, fp8=True))
    assert saved == 2 * 2048 * 1024 + 2048 * 1024 + 2048 * 4096


def test_flash_attention_keeps_no_scores():
    # Korthikanti's 5·a·s²·b (dropout) replaced by the 4-byte log-sum-exp per row and head
    sh = ddlsim.load_config(_cfg()).model.shape()
    full = sh.layer_activation_bytes(1, 2048, 1, False, "none")
    flash = sh.layer_activation_bytes(1, 2048, 1, False, "none", flash=True)
    assert full - flash == 5 * 16 * 2048 * 2048 - 4 * 16 * 2048


def test_selective_recompute_redoes_the_attention_core_forward():
    # Megatron's selective recomputation re-runs QKᵀ, softmax, dropout, PV: 4·b·s²·h FLOPs per
    # layer (2·s²·d per GEMM per head), i.e. an overhead of 4bs²h / (72bsh²(1 + s/6h)) =
    # s/(18h) / (1 + s/(6h)) of a layer's forward + backward + ... (0.90 % for GPT-3's
    # h = 12288, s = 2048)
    # (the 2021 stack has no selective recomputation, rule no_selective_recompute: Megatron-LM
    # of 2022 as a what-if of it, as benchmarks/validate_recompute.py runs Korthikanti et al.)
    d = _cfg(recompute="selective")
    d["system"]["software"] = {"stack": "megatron-lm-2021", "what_if": True}
    wl = ddlsim.build_workload(ddlsim.load_config(d))
    ops = [o.payload for rc in wl.classes for blk in rc.program.blocks.values()
           for o in blk.flat.ops if getattr(o.payload, "name", "") == "recompute.attn_core"]
    assert ops
    b, s, h = 1, 2048, 1024
    gemm_flops = sum(2 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch
                     for k in ops[0].kernels if k.kind == "gemm")
    assert gemm_flops == ops[0].flops == 4 * b * s * s * h
    assert 2048 / (18 * 12288) / (1 + 2048 / (6 * 12288)) == pytest.approx(0.0090, abs=1e-4)


# ---------------------------------------------------------------- GEMM library by stack
def test_the_a100_cublas_11_ceiling_is_its_2022_measurement():
    """mli/transformers-benchmarks (2022-08, NGC 22.07, CUDA 11.7): A100 80GB square GEMMs
    of n = 8192 at 230 TFLOP/s fp16 and 116 TF32. The 8192³ GEMM's tiles fill 2,048 / 2,052
    of 19 waves, so the ceiling behind the measurement is 230 / 312 / that fraction."""
    dev = ddlsim.load_config(_cfg()).system.device
    q = gemm_quantisation(8192, 8192, 1, SMS, 8192)
    assert q == pytest.approx(2048 / (19 * 108))
    table = dev.matmul_efficiency_by_library["cublas-11"]
    assert table["fp16"] == table["bf16"] == round(230 / 312 / q, 3) == 0.739
    assert table["tf32"] == round(116 / 156 / q, 3)
    assert dev.matmul_library == "cublas-12" and dev.matmul_efficiency["bf16"] == ETA


@pytest.mark.parametrize("stack, ceiling", [("megatron-lm-2021", 0.739),
                                            ("deepspeed-2021", 0.739),
                                            ("megatron-core-2024", ETA), ("deepspeed", ETA)])
def test_the_stack_picks_the_ceiling_of_its_gemm_library(stack, ceiling):
    d = _cfg()
    d["system"]["software"] = stack
    dev = kernel_device(ddlsim.load_config(d).system)
    assert dev.ceiling("fp16") == dev.ceiling("bf16") == ceiling


def test_a_stack_library_the_device_never_measured_warns_and_keeps_its_figure():
    import warnings

    from ddlsim.errors import DDLSimWarning
    d = _cfg()
    d["system"] = {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 1,
                   "software": "megatron-lm-2021"}
    with pytest.warns(DDLSimWarning, match="'H100-SXM5-80GB' has no matmul ceiling measured "
                                           "with cublas-11.*its cublas-12 figure is used"):
        dev = kernel_device(ddlsim.load_config(d).system)
    assert dev.ceiling("bf16") == 0.803
    d["system"]["compute_efficiency"] = 0.7      # the user's own figure: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error", DDLSimWarning)
        assert kernel_device(ddlsim.load_config(d).system).ceiling("bf16") == 0.7
    # a device's own table for the stack's library is used
    dev_spec = ddlsim.load_config(_cfg()).system.device.model_dump()
    dev_spec["matmul_efficiency_by_library"] = {"cublas-11": {"bf16": 0.5}}
    d = _cfg()
    d["system"].update(device=dev_spec, software="megatron-lm-2021")
    assert kernel_device(ddlsim.load_config(d).system).ceiling("bf16") == 0.5


@pytest.mark.parametrize("field, value, match", [
    ("matmul_efficiency_by_library", {"cublas-11": {"fp17": 0.5}},
     "matmul_efficiency_by_library.cublas-11 has unknown dtype 'fp17'"),
    ("matmul_efficiency_by_library", {"cuBLAS 11": {"fp16": 0.5}}, "cuBLAS 11"),
    ("matmul_library", "12", "matmul_library"),
])
def test_bad_gemm_library_fields_are_refused(field, value, match):
    from ddlsim.errors import ConfigError
    dev_spec = ddlsim.load_config(_cfg()).system.device.model_dump()
    dev_spec[field] = value
    d = _cfg()
    d["system"]["device"] = dev_spec
    with pytest.raises(ConfigError, match=match):
        ddlsim.load_config(d)

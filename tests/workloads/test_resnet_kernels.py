"""ddlsim/workloads/resnet/kernels.py: the kernels PyTorch runs for a ResNet layer, each count
derived by hand from the rules in the module docstring."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.resnet.build import build_resnet, grad_dtype_bytes
from ddlsim.workloads.resnet.kernels import (autocast_casts, conv_kernels, ddp_copies,
                                             pointwise_kernels, sgd_kernels)
from ddlsim.workloads.resnet.layers import resnet_layers
from ddlsim.workloads.trace import Compute

LAYERS = {layer.name: layer for layer in resnet_layers(50)}


def test_a_3x3_convolution_is_the_guides_implicit_gemm():
    conv = LAYERS["layer1.0.conv2"]          # 64 -> 64, 3x3, 56x56 output
    assert conv.geometry == (64, 64, 3, 56)
    (fwd,) = conv_kernels(conv, 32, "fp16", backward=False, channels_last=True)
    assert fwd.shape == (32 * 56 * 56, 64, 64 * 9)
    dgrad, wgrad = conv_kernels(conv, 32, "fp16", backward=True, channels_last=True)
    assert dgrad.shape == (32 * 56 * 56, 64, 64 * 9)
    assert wgrad.shape == (64 * 9, 64, 32 * 56 * 56)
    # each GEMM has the forward's FLOPs: 2 * N*P*Q * K * C*R*S
    for k in (fwd, dgrad, wgrad):
        assert 2 * k.shape[0] * k.shape[1] * k.shape[2] == pytest.approx(32 * conv.flops)


def test_nchw_tensor_core_convolutions_pay_their_transposes():
    conv = LAYERS["layer1.0.conv2"]
    x = y = 32 * 64 * 56 * 56 * 4            # tf32 activations, 4 bytes
    fwd = conv_kernels(conv, 32, "tf32", backward=False, channels_last=False)
    assert [k.bytes for k in fwd if k.kind == "memory"] == [2 * x, 2 * y]
    bwd = conv_kernels(conv, 32, "tf32", backward=True, channels_last=False)
    assert [k.bytes for k in bwd if k.kind == "memory"] == [2 * y, 2 * x, 2 * x]
    # no transposes in NHWC, nor for fp32 (no Tensor Cores)
    assert all(k.kind == "gemm" for k in conv_kernels(conv, 32, "fp32", False, False))


def test_the_first_convolution_computes_no_data_gradient():
    (wgrad,) = conv_kernels(LAYERS["conv1"], 8, "fp16", backward=True, channels_last=True,
                            input_grad=False)
    assert wgrad.shape == (3 * 49, 64, 8 * 112 * 112)


def test_memory_passes_by_hand():
    bn = LAYERS["layer1.0.bn1"]              # 64 x 56 x 56 elements an image
    n = 64 * 56 * 56 * 2 * 4                 # 4 images, fp16
    assert pointwise_kernels(bn, 4, "fp16", False)[0].bytes == 3 * n
    assert pointwise_kernels(bn, 4, "fp16", True)[0].bytes == 5 * n
    relu = LAYERS["layer1.0.relu1"]
    assert pointwise_kernels(relu, 4, "fp16", True)[0].bytes == 3 * n


def test_autocast_ddp_and_sgd_kernels_by_hand():
    fc = LAYERS["fc"]
    (cast,) = autocast_casts(fc, "fp16", backward=False)
    assert cast.bytes == 6 * 2048 * 1000
    assert autocast_casts(fc, "fp32", False) == ()
    assert autocast_casts(LAYERS["bn1"], "fp16", False) == ()
    assert [k.bytes for k in ddp_copies(fc.params, 4)] == [8 * 2048 * 1000, 8 * 1000]
    # decayed: add, mul_, add_, add_ (3+2+3+3 passes); not decayed: 2+3+3
    w, b = fc.params
    assert [k.bytes for k in sgd_kernels(fc.params, (True, False))] == \
        [4 * p * w.numel for p in (3, 2, 3, 3)] + [4 * p * b.numel for p in (2, 3, 3)]


def _cfg(dtype="fp16", dp=2, **model):
    return ddlsim.load_config({
        "model": {"preset": "resnet50", **model},
        "parallel": {"data_parallel_size": dp},
        "train": {"micro_batch_size": 32, "global_batch_size": 32 * dp, "seq_length": 1,
                  "dtype": dtype, "optimizer": "sgd"},
        "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": dp}})


def test_autocast_gradients_are_fp32_and_ddp_copies_each_tensor_twice():
    cfg = _cfg()
    assert grad_dtype_bytes(cfg) == 4 and grad_dtype_bytes(_cfg("tf32")) == 4
    ops = [op.payload for b in build_resnet(cfg).classes[0].program.blocks.values()
           for op in b.ops if isinstance(op.payload, Compute)]
    copies = [k for c in ops if "bucket" in c.name for k in c.kernels]
    assert len(copies) == 2 * len(cfg.model.tensors) == 2 * 161
    # one GPU: no DDP, no copies
    single = build_resnet(_cfg(dp=1)).classes[0].program.blocks.values()
    assert not any("bucket" in op.payload.name for b in single for op in b.ops)


def test_channels_last_is_faster_than_nchw_with_tensor_cores_only():
    def t(dtype, layout):
        return ddlsim.predict(_cfg(dtype, dp=1, memory_format=layout)).iteration_time_s
    assert t("fp16", "channels_last") < t("fp16", "contiguous")
    assert t("tf32", "channels_last") < t("tf32", "contiguous")
    assert t("fp32", "channels_last") == t("fp32", "contiguous")


def test_an_unknown_memory_format_is_refused_naming_the_field():
    with pytest.raises(ddlsim.errors.ConfigError, match="memory_format"):
        _cfg(memory_format="nhwc")


def test_an_implicit_gemm_convolution_reads_its_input_once():
    conv = LAYERS["layer1.0.conv2"]          # 3x3, 64 -> 64, 56x56 in and out, fp16
    x = y = 32 * 64 * 56 * 56 * 2
    filt = 64 * 64 * 9 * 2
    (fwd,) = conv_kernels(conv, 32, "fp16", backward=False, channels_last=True)
    assert fwd.bytes == x + filt + y             # not the 9x im2col operand of its shape
    dgrad, wgrad = conv_kernels(conv, 32, "fp16", backward=True, channels_last=True)
    assert dgrad.bytes == y + filt + x and wgrad.bytes == x + y + filt
    # a strided 1x1 reads every other pixel: the GEMM operand, a quarter of the input
    down = LAYERS["layer2.0.downsample.0"]   # 1x1 stride 2, 256 -> 512, 56x56 -> 28x28
    (fwd,) = conv_kernels(down, 32, "fp16", backward=False, channels_last=True)
    assert fwd.bytes == 2 * (32 * 28 * 28 * 256 + 256 * 512 + 32 * 512 * 28 * 28)
    (dgrad, wgrad) = conv_kernels(down, 32, "fp16", backward=True, channels_last=True)
    assert dgrad.bytes == 2 * (32 * 512 * 28 * 28 + 256 * 512 + 32 * 256 * 56 * 56)


def test_a_gemms_own_bytes_set_its_memory_roofline():
    from ddlsim.simulator.kernels.device import kernel_time
    from ddlsim.workloads.trace import Kernel
    dev = _a100()
    shape = (1e6, 64.0, 576.0)                   # memory-bound by its im2col operand
    im2col = kernel_time(Kernel("gemm", shape, dtype="fp16"), dev)
    once = kernel_time(Kernel("gemm", shape, dtype="fp16", bytes=2 * (1e6 * 64 * 2)), dev)
    assert once < im2col
    huge = kernel_time(Kernel("gemm", shape, dtype="fp16", bytes=1e12), dev)
    assert huge == pytest.approx(1e12 / dev.memory_Bps)


def _a100():
    from ddlsim.simulator.kernels.device import kernel_device
    cfg = ddlsim.load_config({"model": "resnet50", "parallel": {"data_parallel_size": 1},
                              "train": {"micro_batch_size": 8, "global_batch_size": 8,
                                        "seq_length": 1, "dtype": "fp16", "optimizer": "sgd"},
                              "system": {"preset": "dgx-a100", "nodes": 1,
                                         "devices_per_node": 1}})
    return kernel_device(cfg.system)

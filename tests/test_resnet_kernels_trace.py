"""benchmarks/resnet_kernels_trace.py and what it found (issue 29 cause 2): ResNet-50's device
kernels read one by one from the H200's Kineto trace, classed by the op that launched them, and
ddlsim's kernels of the stem that the trace shows (autocast's cast of the fp32 image, cuDNN's
padding of its 3 channels to 4) and the kernel classes of the channels-last batch norm and
max pooling (ddlsim/workloads/resnet/kernels.py)."""

from __future__ import annotations

import pytest

import benchscripts  # noqa: F401  (puts benchmarks/ on sys.path)
from ddlsim.config import DTYPE_BYTES
from ddlsim.workloads.resnet.kernels import (NHWC_CLASSES, conv_kernels, pointwise_kernels,
                                             stem_kernels)
from ddlsim.workloads.resnet.layers import resnet_layers

LAYERS = {layer.name: layer for layer in resnet_layers(50)}
CONVS = [layer.name for layer in LAYERS.values() if layer.kind == "conv"]
IMAGE = 3 * 224 * 224           # elements of one 224 x 224 RGB image


@pytest.fixture(scope="module")
def script():
    import resnet_kernels_trace
    return resnet_kernels_trace


@pytest.fixture(scope="module")
def traced(script):
    """(measured kernels, ddlsim's kernels, cfg) of the amp_nhwc_256 row."""
    cfg = script.ddlsim_config()
    measured = script.classify(script.read_trace(script.TRACE), cfg.model.layers)
    return measured, script.ddlsim_kernels(cfg), cfg


def test_every_device_event_of_the_step_is_classed_and_timed(traced, script):
    measured, _, _ = traced
    assert len(measured) == 1217                 # 1,004 kernels, 209 memsets, 4 copies
    assert {k.cls for k in measured} <= set(script.CLASSES)
    # 42.07 ms of device time in the traced step (its 47.0 ms median step less the gaps)
    assert sum(k.seconds for k in measured) == pytest.approx(42.07e-3, abs=0.01e-3)


def test_each_convolution_has_its_forward_and_gradients_by_its_own_layer(traced):
    """Backward kernels reach their layer through the node's sequence number; the stem
    computes no data gradient (the image needs none)."""
    measured, _, _ = traced
    per = {(k.layer, k.cls) for k in measured if k.cls.startswith("conv_")}
    for name in CONVS:
        assert (name, "conv_fprop") in per and (name, "conv_wgrad") in per
        assert ((name, "conv_dgrad") in per) == (name != "conv1")
    counts = {c: sum(k.cls == c for k in measured) for c in ("conv_fprop", "bn_fwd", "bn_bwd",
                                                             "relu_fwd", "add_fwd")}
    assert counts == {"conv_fprop": 53, "bn_fwd": 53, "bn_bwd": 53, "relu_fwd": 49,
                      "add_fwd": 16}


def test_ddlsim_lists_the_stem_kernels_the_trace_shows(traced, script):
    """One image cast and six padding kernels (memset, pad, filter pad; forward and before
    the weight gradient), as many as cuDNN and autocast launched."""
    measured, model, _ = traced
    for cls, n in (("input_cast", 1), ("conv_pad", 6)):
        assert sum(k.cls == cls for k in measured) == n
        assert sum(k.cls == cls for k in model) == n
    totals = script.class_totals(measured, model)
    # the image's cast streams: 231 MB at 4.32 TB/s = 53.5 us against 55.2 us measured
    assert totals["input_cast"]["ms_ddlsim"] == pytest.approx(totals["input_cast"]["ms"],
                                                              rel=0.05)


def test_the_nchw_classes_rates_as_derived(script):
    """The TF32 contiguous trace (run11): ddlsim's bytes of each NCHW class over the measured
    kernels' time, the fractions dgx-h200's elementwise_efficiency cites."""
    path = script.RUN4.parents[1] / "run11" / "resnet" / "resnet_tf32_nchw_256_trace.json.gz"
    cfg = script.ddlsim_config("tf32_nchw_256")
    measured = script.classify(script.read_trace(path), cfg.model.layers)
    rates = script.class_rates(measured, script.ddlsim_kernels(cfg),
                               cfg.system.device.memory_bandwidth_Bps)
    assert {c: round(r["fraction"], 3) for c, r in rates.items()} == {
        "batchnorm_nchw": 0.5, "batchnorm_nchw_backward": 0.417, "maxpool_nchw": 0.372,
        "maxpool_nchw_backward": 0.132}
    eff = cfg.system.device.elementwise_efficiency
    assert all(eff[c] == pytest.approx(round(r["fraction"], 3)) for c, r in rates.items())


def test_the_kernel_classes_rates_as_derived(traced, script):
    """ddlsim's bytes of each class over the measured kernels' time, as fractions of the
    H200's 4.8 TB/s: the figures the module docstring and the report cite."""
    measured, model, cfg = traced
    rates = script.class_rates(measured, model, cfg.system.device.memory_bandwidth_Bps)
    assert {c: round(r["fraction"], 3) for c, r in rates.items()} == {
        "batchnorm": 0.625, "batchnorm_backward": 0.734, "maxpool": 0.231,
        "maxpool_backward": 0.105}
    assert set(rates) == {c for pair in NHWC_CLASSES.values() for c in pair}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_stem_under_autocast_channels_last_by_hand(dtype):
    conv1, mb, w = LAYERS["conv1"], 8, DTYPE_BYTES[dtype]
    assert conv1.image and not any(layer.image for layer in LAYERS.values() if layer is not conv1)
    pixels = mb * 224 * 224
    pad = [w * 4 * pixels,                  # cuDNN's memset of the 4-channel copy
           w * (3 + 4) * pixels,            # nhwcAddPaddingKernel: read 3, write 4 channels
           w * (3 + 4) * 64 * 49]           # the filter's pad (backward: its gradient's unpad)
    fwd = stem_kernels(conv1, mb, dtype, backward=False, channels_last=True)
    assert [k.bytes for k in fwd] == [(4 + w) * mb * IMAGE] + pad   # autocast's image cast
    assert [k.bytes for k in stem_kernels(conv1, mb, dtype, True, True)] == pad
    assert all(k.kind == "memory" for k in fwd)


def test_the_stem_elsewhere_by_hand():
    conv1 = LAYERS["conv1"]
    # tf32 and fp32 cast nothing and run no 16-bit first-layer kernel
    for dtype in ("tf32", "fp32"):
        for backward in (False, True):
            assert stem_kernels(conv1, 8, dtype, backward, True) == ()
    # contiguous fp16: autocast still casts the image (cuDNN's own transposes are counted
    # by conv_kernels)
    assert [k.bytes for k in stem_kernels(conv1, 8, "fp16", False, False)] == [6 * 8 * IMAGE]
    assert stem_kernels(conv1, 8, "fp16", True, False) == ()
    # no other layer has any
    assert not any(stem_kernels(layer, 8, "fp16", b, True) for layer in LAYERS.values()
                   if layer is not conv1 for b in (False, True))


def test_the_stem_kernels_are_in_the_built_step():
    import ddlsim
    cfg = ddlsim.load_config({
        "model": {"preset": "resnet50", "memory_format": "channels_last"},
        "train": {"micro_batch_size": 8, "global_batch_size": 8, "seq_length": 1,
                  "dtype": "fp16", "optimizer": "sgd"},
        "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 1}})
    ops = {op.payload.name: op.payload for block in
           ddlsim.build_workload(cfg).classes[0].program.blocks.values() for op in block.ops}
    conv1 = LAYERS["conv1"]
    for name, backward in (("fwd.conv1", False), ("bwd.conv1", True)):
        stem = stem_kernels(conv1, 8, "fp16", backward, True)
        assert ops[name].kernels[:len(stem)] == stem
    assert [k.variant for k in ops["fwd.bn1"].kernels] == ["batchnorm"]


def test_channels_last_batch_norm_and_max_pooling_carry_their_class():
    bn, pool, relu = LAYERS["layer1.0.bn1"], LAYERS["maxpool"], LAYERS["layer1.0.relu1"]
    assert [k.variant for k in pointwise_kernels(bn, 4, "fp16", False, True)] == ["batchnorm"]
    assert [k.variant for k in pointwise_kernels(bn, 4, "fp16", True, True)] == \
        ["batchnorm_backward"]
    assert [k.variant for k in pointwise_kernels(pool, 4, "fp16", False, True)] == ["maxpool"]
    # the backward's zeroing is a plain fill, its gather the class
    assert [k.variant for k in pointwise_kernels(pool, 4, "fp16", True, True)] == \
        ["", "maxpool_backward"]
    assert pointwise_kernels(relu, 4, "fp16", True, True)[0].variant == ""
    # contiguous: cuDNN's CUDNN_BATCHNORM_SPATIAL and the NCHW pooling, their own classes
    assert [k.variant for k in pointwise_kernels(bn, 4, "fp32", False)] == ["batchnorm_nchw"]
    assert [k.variant for k in pointwise_kernels(bn, 4, "fp32", True)] == \
        ["batchnorm_nchw_backward"]
    assert [k.variant for k in pointwise_kernels(pool, 4, "fp32", False)] == ["maxpool_nchw"]
    assert [k.variant for k in pointwise_kernels(pool, 4, "fp32", True)] == \
        ["", "maxpool_nchw_backward"]
    # the bytes are the passes of before, whatever the class
    assert pointwise_kernels(bn, 4, "fp16", False, True)[0].bytes == \
        pointwise_kernels(bn, 4, "fp16", False)[0].bytes == 3 * 4 * bn.out * 2

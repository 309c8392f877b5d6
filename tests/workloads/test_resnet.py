"""The ``resnet`` family: torchvision's ResNets, PyTorch DDP buckets, the family's errors.

Every number is derived here from the layer shapes of He et al. 2016 (Table 1) as torchvision
defines them, or from PyTorch's bucket rule, not copied from a run.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.buckets import FIRST_BUCKET_BYTES, buckets_by_count, ddp_buckets
from ddlsim.workloads.resnet.build import grad_bucket_ranges, ready_grad_bytes
from ddlsim.workloads.resnet.layers import resnet_layers

ONE_NODE = {"model": "resnet50", "parallel": {"data_parallel_size": 8},
            "train": {"micro_batch_size": 32, "global_batch_size": 256, "seq_length": 1,
                      "dtype": "fp32", "optimizer": "sgd"},
            "system": {"preset": "dgx-a100", "nodes": 1}}


def _stage_params(depth: int) -> int:
    """Bottleneck ResNet parameters summed stage by stage (He et al. 2016, Table 1)."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    total = 3 * 49 * 64 + 2 * 64                      # conv1 7×7×3×64, bn1
    c_in = 64
    for n, planes in zip(blocks, (64, 128, 256, 512)):
        out = 4 * planes
        block = planes * c_in + 9 * planes * planes + planes * out + 2 * (2 * planes) + 2 * out
        total += block + c_in * out + 2 * out          # first block + projection shortcut
        total += (n - 1) * (block - planes * c_in + planes * out)  # later blocks: c_in = out
        c_in = out
    return total + 2048 * 1000 + 1000                  # fc


@pytest.mark.parametrize("depth,params", [(50, 25_557_032), (101, 44_549_160),
                                          (152, 60_192_808)])
def test_parameters_match_torchvision(depth, params):
    # torchvision's model card: resnet50 25,557,032, resnet101 44,549,160, resnet152 60,192,808
    layers = resnet_layers(depth)
    assert sum(t.numel for layer in layers for t in layer.params) == params == _stage_params(depth)


def test_tensor_count_and_multiply_adds():
    # ResNet-50: 53 convolutions, 53 batch norms (2 tensors each), fc (2): 161 tensors.
    # torchvision reports multiply-adds as "GFLOPS": 4.09 (resnet50), 11.51 (resnet152).
    for depth, n_tensors, gmacs in [(50, 161, 4.09), (152, 467, 11.51)]:
        layers = resnet_layers(depth)
        assert sum(len(layer.params) for layer in layers) == n_tensors
        macs = sum(layer.flops for layer in layers if layer.gemm) / 2
        assert round(macs / 1e9, 2) == gmacs


def test_per_layer_flops_and_shapes():
    layers = {layer.name: layer for layer in resnet_layers(50)}
    # conv1: 7×7×3 → 64 channels at stride 2: 112×112 outputs, 2·(3·49)·64·112² FLOPs
    assert layers["conv1"].flops == 2 * 3 * 49 * 64 * 112 * 112 == 236_027_904
    assert layers["conv1"].out == 64 * 112 * 112
    # layer1.0.conv2: 3×3, 64 → 64 on 56×56
    assert layers["layer1.0.conv2"].flops == 2 * 64 * 9 * 64 * 56 * 56
    # layer4.0.conv2 carries the stride (v1.5): 512 → 512, 14×14 → 7×7
    assert layers["layer4.0.conv2"].out == 512 * 7 * 7
    assert layers["layer4.0.conv2"].flops == 2 * 512 * 9 * 512 * 7 * 7
    assert layers["layer4.0.downsample.0"].flops == 2 * 1024 * 2048 * 7 * 7
    assert layers["fc"].flops == 2 * 2048 * 1000 + 1000
    assert layers["maxpool"].out == 64 * 56 * 56


def test_resnet50_proxy_gradient_bytes():
    """comm_only/resnet50.cpp:18 TOTALSIZE = 25,559,081 floats = torchvision's 25,557,032 with
    TF-slim's 1001-class head: + 2048 weights + 1 bias of the background class."""
    cfg = ddlsim.load_config("examples/proxies/resnet50.yaml")
    assert cfg.model.params == 25_557_032 + 2048 + 1 == 25_559_081
    grads = ready_grad_bytes(cfg)
    assert sum(grads) == 4 * 25_559_081
    # resnet50.cpp:39-211, the unaggregated list (NUM 161), starts with fc bias, fc weight (1001 × 2048)
    # and layer4.2 (bn3 β γ, conv3 512·2048, bn2, conv2 3·3·512·512, bn1, conv1 2048·512),
    # layer4.1 likewise, then layer4.0 with its projection shortcut listed last (TF-slim
    # creates it first): bn3, conv3, bn2, conv2, bn1, conv1 1024·512, shortcut bn, 1024·2048.
    head = [1001, 2050048, 2048, 2048, 1048576, 512, 512, 2359296, 512, 512, 1048576]
    l41 = [2048, 2048, 1048576, 512, 512, 2359296, 512, 512, 1048576]
    l40 = [2048, 2048, 1048576, 512, 512, 2359296, 512, 512, 524288, 2048, 2048, 2097152]
    assert [g // 4 for g in grads[:32]] == head + l41 + l40
    # ... and ends (lines 202-209) with layer1.0's bn1, conv1 (64·64), shortcut bn (256 256)
    # and conv (64·256), then the stem's bn1 and conv1 (7·7·3·64)
    assert [g // 4 for g in grads[-8:]] == [64, 4096, 256, 256, 16384, 64, 64, 9408]
    # resnet50.cpp:30-37: 6 messages of 7, 7, 9, 9, 36, 93 gradients
    sizes = [sum(grads[i] for i in r) // 4 for r in grad_bucket_ranges(cfg)]
    assert sizes == [3104745, 4461568, 4462592, 4986880, 4468736, 4074560]


def test_resnet152_proxy_buckets():
    """resnet152.cpp:23: 10 messages, 60,192,808 floats in all = torchvision ResNet-152, in
    torchvision's gradient-ready order, 11, 14, 22, 53, 48, 51, 48, 51, 40, 129 tensors."""
    cfg = ddlsim.load_config("examples/proxies/resnet152.yaml")
    grads = ready_grad_bytes(cfg)
    sizes = [sum(grads[i] for i in r) // 4 for r in grad_bucket_ranges(cfg)]
    assert sizes == [6511592, 6567936, 5905920, 6113280, 6176256, 6112768, 6176256, 6112768,
                     5321216, 5194816]
    assert sum(sizes) == 60_192_808
    # bucket 0: fc bias + weight (1000 + 2,048,000), layer4.2 (4,462,592 with its BNs): the
    # 11 tensors of fc and layer4.2 = 6,511,592
    assert sizes[0] == 1000 + 2048 * 1000 + 2048 * 2 + 512 * 2048 + 2 * 512 + 9 * 512 * 512 \
        + 2 * 512 + 2048 * 512


def test_ddp_bucket_rule_by_hand():
    # limits 1 MiB then 25 MiB; a bucket closes at the gradient that reaches its limit
    mib = 2 ** 20
    sizes = [0.5 * mib, 0.6 * mib, 10 * mib, 10 * mib, 5 * mib, 1 * mib, 3 * mib]
    assert ddp_buckets(sizes, 25 * mib) == [range(0, 2), range(2, 5), range(5, 7)]
    assert ddp_buckets([2 * mib], 25 * mib, FIRST_BUCKET_BYTES) == [range(0, 1)]
    with pytest.raises(ConfigError, match="must add up to 4"):
        buckets_by_count([1, 2], 4, "model.grad_buckets")


def test_resnet50_ddp_buckets_follow_pytorch():
    """fp32 ResNet-50 under DDP's defaults: the first bucket is fc.bias (4,000 B) + fc.weight
    (8,192,000 B), which crosses 1 MiB; every later bucket but the last reaches 25 MiB and
    would not without its last gradient."""
    cfg = ddlsim.load_config(ONE_NODE)
    grads = ready_grad_bytes(cfg)
    buckets = grad_bucket_ranges(cfg)
    assert buckets[0] == range(0, 2) and sum(grads[i] for i in buckets[0]) == 8_196_000
    cap = 25 * 2 ** 20
    for r in buckets[1:-1]:
        size = sum(grads[i] for i in r)
        assert size >= cap > size - grads[r.stop - 1]
    assert sum(grads[i] for i in buckets[-1]) < cap
    assert sum(len(r) for r in buckets) == 161


def test_memory():
    cfg = ddlsim.load_config(ONE_NODE)
    mem = ddlsim.build_workload(cfg).peak_memory
    # fp32 SGD with momentum: weights, gradients, momentum 4 B each per parameter
    assert mem.weights == mem.gradients == mem.optimizer == 4 * 25_557_032
    # the input image and conv1's output alone are 3·224² + 64·112² values per image
    assert mem.activations > 4 * 32 * (3 * 224 ** 2 + 64 * 112 ** 2)


def test_des_agrees_with_analytical_on_one_node():
    """Contention-free: 8 ranks behind one NVSwitch, one data-parallel group."""
    cfg = ddlsim.load_config(ONE_NODE)
    a = ddlsim.predict(cfg, "analytical").iteration_time_s
    d = ddlsim.predict(cfg, "des").iteration_time_s
    assert d == pytest.approx(a, rel=0.01)


@pytest.mark.parametrize("change,message", [
    ({"model": {"architecture": "resnet", "depth": 34}}, "depth"),
    ({"model": {"architecture": "resnet", "depth": 50, "grad_buckets": [7, 7]}},
     "must add up to 161"),
    ({"model": {"architecture": "resnet", "depth": 50, "proxy_timings": {"forward": "1 ms"}}},
     "compute is 'model'"),
    ({"model": {"architecture": "resnet", "depth": 50, "compute": "proxy",
                "proxy_timings": {"forward": "1 ms"}}}, "proxy_timings.backward_per_bucket"),
    ({"model": {"architecture": "resnet", "depth": 50, "compute": "proxy",
                "proxy_timings": {"forward": "1 ms", "backward_per_bucket": "1 ms",
                                  "backward_per_bucke": "1 ms"}}}, "did you mean"),
    ({"model": {"architecture": "resnet", "depth": 50, "compute": "proxy",
                "proxy_timings": {"forward": 119000, "backward_per_bucket": "1 ms"}}},
     "write '119 ms'"),
    ({"train": {"micro_batch_size": 32, "global_batch_size": 256, "seq_length": 224}},
     "seq_length: 1"),
    ({"parallel": {"data_parallel_size": 4, "tensor_model_parallel_size": 2}},
     "data-parallel only"),
])
def test_bad_input_is_one_paragraph(change, message):
    doc = {**ONE_NODE, **change}
    with pytest.raises(ConfigError) as err:
        ddlsim.build_workload(ddlsim.load_config(doc))
    assert message in str(err.value) and "Traceback" not in str(err.value)


def test_options_that_would_be_ignored_are_refused():
    ring = {**ONE_NODE, "model": {"architecture": "resnet", "depth": 50,
                                  "grad_sync": "ring_sendrecv"}}
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        ddlsim.load_config(ring)
    listed = {"architecture": "resnet", "depth": 50, "grad_buckets": [161]}
    with pytest.raises(ConfigError, match="first_bucket_size"):
        ddlsim.load_config({**ONE_NODE, "model": {**listed, "first_bucket_size": "2 MiB"}})
    with pytest.raises(ConfigError, match="grad_bucket_size"):
        ddlsim.load_config({**ONE_NODE, "model": listed,
                            "parallel": {"data_parallel_size": 8, "grad_bucket_size": "50 MiB"}})

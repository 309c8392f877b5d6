"""ddlsim/workloads/resnet/step.py: the training step's kernels around a ResNet (zeroed and
accumulated gradients, GradScaler, the input on the GPU), each count derived by hand from the
module docstring, and the options that switch them on refused where they cannot apply."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.resnet.build import build_resnet
from ddlsim.workloads.resnet.layers import Tensor, resnet_layers
from ddlsim.workloads.resnet.step import (accumulate_kernels, bn_buffers, flatten_kernels,
                                          grad_scaler_kernels, input_kernels,
                                          multi_tensor_launches, unflatten_kernels,
                                          zero_grad_kernels)
from ddlsim.workloads.trace import Collective, Compute

TENSORS = tuple(t for layer in resnet_layers(50) for t in layer.params)


def _run(dtype="fp16", dp=1, **model):
    return {"model": {"preset": "resnet50", **model},
            "parallel": {"data_parallel_size": dp},
            "train": {"micro_batch_size": 32, "global_batch_size": 32 * dp, "seq_length": 1,
                      "dtype": dtype, "optimizer": "sgd"},
            "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": dp}}


def _ops(cfg) -> dict[str, Compute]:
    prog = build_resnet(ddlsim.load_config(cfg)).classes[0].program
    return {op.payload.name: op.payload for block in prog.blocks.values() for op in block.ops
            if isinstance(op.payload, Compute)}


def test_zeroed_gradients_are_written_then_added_to():
    (z,) = zero_grad_kernels((Tensor("w", 1000),))
    assert z.bytes == 4 * 1000                       # fp32 .grad written once
    (a,) = accumulate_kernels((Tensor("w", 1000),))
    assert a.bytes == 3 * 4 * 1000                   # grad += new: read 2, write 1
    assert len(zero_grad_kernels(TENSORS)) == 161


@pytest.mark.parametrize("numels, launches", [
    ([65536 * 320], 1),                  # 320 chunks fill one launch exactly
    ([65536 * 320 + 1], 2),              # one element more: a second launch
    ([1] * 110, 1), ([1] * 111, 2),      # 110 tensors a launch
    ([65536 * 200, 65536 * 200], 2),     # 400 chunks: 320, then 80 (the tensor carries over)
])
def test_multi_tensor_apply_launches(numels, launches):
    assert multi_tensor_launches(numels) == launches


def test_grad_scaler_reads_and_writes_every_gradient_once():
    kernels = grad_scaler_kernels(TENSORS)
    unscale = kernels[:-2]
    # 161 tensors (> 110) in more than 320 chunks of 65,536: 3 launches
    assert len(unscale) == multi_tensor_launches([t.numel for t in TENSORS]) == 3
    assert sum(k.bytes for k in unscale) == pytest.approx(2 * 4 * 25_557_032)


def test_input_normalisation_and_mixup_by_hand():
    px = 3 * 8 * 224 * 224
    assert [k.bytes for k in input_kernels("normalize", 8, 224, 1000)] == [5 * px, 8 * px,
                                                                           8 * px]
    mix = input_kernels("normalize_mixup", 8, 224, 1000)
    assert [k.bytes for k in mix[3:7]] == [8 * px, 8 * px, 8 * px, 12 * px]
    assert [k.bytes for k in mix[7:]] == [8 * 8000, 8 * 8000, 8 * 8000, 12 * 8000]
    assert input_kernels("none", 8, 224, 1000) == ()


def test_ddp_broadcasts_the_batch_norm_buffers_before_each_forward():
    buffers = bn_buffers(resnet_layers(50))
    # 53 batch norms: running mean and var (fp32) over 26,560 channels, 53 int64 counters
    assert len(buffers["fp32"]) == 106 and sum(buffers["fp32"]) == 2 * 4 * 26_560
    assert buffers["int64"] == (8.0,) * 53
    assert [k.bytes for k in flatten_kernels(buffers)] == [2 * 2 * 4 * 26_560, 2 * 8 * 53]
    assert len(unflatten_kernels(buffers)) == 159
    prog = build_resnet(ddlsim.load_config(_run(dp=8))).classes[0].program
    fwd = prog.blocks["F"].ops
    colls = [op for op in fwd if isinstance(op.payload, Collective)]
    assert [(op.payload.op, op.payload.bytes, op.stream) for op in colls] == [
        ("broadcast", 2 * 4 * 26_560, "dp"), ("broadcast", 8 * 53, "dp")]
    copy = next(op for op in fwd if op.payload.name == "fwd.ddp.buffers.copy")
    assert copy.deps == (1, 2)                      # after both broadcasts
    # one GPU runs no DDP; broadcast_buffers=False turns it off
    assert "fwd.ddp.buffers.copy" not in _ops(_run(dp=1))
    assert "fwd.ddp.buffers.copy" not in _ops(_run(dp=8, broadcast_buffers=False))


def test_defaults_add_no_step_kernels():
    names = _ops(_run())
    assert not any(n.endswith(".accumulate") or n in ("zero_grad", "grad_scaler", "fwd.input")
                   for n in names)


def test_the_dle_step_adds_its_ops_and_time():
    dle = dict(zero_grad="zero", grad_scaler=True, input_pipeline="normalize_mixup")
    ops = _ops(_run(**dle))
    assert len(ops["zero_grad"].kernels) == 161
    # around the update: the breakdown's optimizer time
    assert ops["zero_grad"].kind == ops["grad_scaler"].kind == "optimizer"
    # every layer with parameters adds its new gradients in place: 161 kernels, in the
    # layers' own backward ops (fp16 convolutions carry kernels) ...
    acc = 3 * 4 * 2048 * 1000
    assert ops["bwd.fc"].kernels[-2].bytes == acc and ops["bwd.fc"].kernels[-1].bytes == 3 * 4000
    assert not any(n.endswith(".accumulate") for n in ops)
    # ... or in an op of their own beside an fp32 convolution (a roofline op, no kernels)
    fp32 = _ops(_run("fp32", zero_grad="zero"))
    assert fp32["bwd.layer1.0.conv1.accumulate"].bytes == 3 * 4 * 64 * 64
    assert "bwd.layer1.0.bn1.accumulate" not in fp32
    assert ops["fwd.input"].bytes == pytest.approx(
        (5 + 8 + 8 + 8 + 8 + 8 + 12) * 3 * 32 * 224 ** 2 + (8 + 8 + 8 + 12) * 32 * 1000)
    bare, full = ddlsim.predict(_run()), ddlsim.predict(_run(**dle))
    assert full.iteration_time_s > bare.iteration_time_s


@pytest.mark.parametrize("model, dtype, field", [
    ({"grad_scaler": True}, "bf16", "grad_scaler"),
    ({"compute": "proxy", "proxy_timings": {"forward": 0.0, "backward_per_bucket": 0.0},
      "zero_grad": "zero"}, "fp32", "zero_grad"),
])
def test_options_that_cannot_apply_are_refused(model, dtype, field):
    with pytest.raises(ddlsim.ConfigError, match=field):
        ddlsim.load_config(_run(dtype, **model))


def test_the_plan_names_the_step():
    from ddlsim.planinfo import plan_fields

    def plan_line(cfg):
        return cfg.family.plan_summary(cfg)
    cfg = ddlsim.load_config(_run(dp=8, zero_grad="zero", grad_scaler=True,
                                  input_pipeline="normalize_mixup"))
    assert plan_fields(cfg)["training_step"] == {
        "zero_grad": "zero", "grad_scaler": True, "input_pipeline": "normalize_mixup",
        "broadcast_buffers": True}
    assert plan_line(cfg).endswith("zeroed gradients, GradScaler, normalize + mixup on the "
                                   "device")
    bare = ddlsim.load_config(_run())
    assert plan_fields(bare)["training_step"]["broadcast_buffers"] is False   # one rank
    assert plan_line(bare).endswith("fp16 autocast (AMP)")

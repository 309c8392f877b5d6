"""The bert family's training-step kernels (ddlsim/workloads/bert/step.py, the separate bias
kernels of bert/kernels.py): bytes and launches derived by hand from the module docstrings."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.bert.kernels import head_kernels, layer_kernels
from ddlsim.workloads.bert.step import apex_master_kernels, autograd_accumulate_kernels
from ddlsim.workloads.resnet.step import multi_tensor_launches

B, S, H, F = 4, 128, 1024, 4096


def _cfg(micro_batches: int = 3, **model) -> ddlsim.RunConfig:
    return ddlsim.load_config({
        "model": {"preset": "bert-large", **model},
        "parallel": {"data_parallel_size": 1},
        "train": {"micro_batch_size": B, "global_batch_size": B * micro_batches,
                  "seq_length": S, "dtype": "fp16"},
        "system": {"preset": "dgx1-v100", "nodes": 1, "devices_per_node": 1}})


def _memory_bytes(kernels) -> float:
    return sum(k.bytes for k in kernels if k.kind == "memory")


@pytest.mark.parametrize("backward", [False, True])
def test_separate_biases_add_one_kernel_per_projection(backward):
    d, x, y = 2.0, B * S * H, B * S * F
    fused = layer_kernels(_cfg().model, B, S, d, "fp16", backward)[2]
    separate = layer_kernels(_cfg(linear_bias="separate").model, B, S, d, "fp16", backward)[2]
    assert len(separate) == len(fused) + 6      # query, key, value, out, FFN in, FFN out
    # forward: a read + write of each output; backward: a read of each output's gradient
    k = 1.0 if backward else 2.0
    assert _memory_bytes(separate) - _memory_bytes(fused) == pytest.approx(
        k * d * (5 * x + y))


def test_separate_biases_in_the_heads():
    m = _cfg(linear_bias="separate").model
    tokens, d = B * S, 2.0
    extra = _memory_bytes(head_kernels(m, B, S, d, "fp16", False)) - _memory_bytes(
        head_kernels(_cfg().model, B, S, d, "fp16", False))
    # the MLM transform's bias over T·h and the decoder's + self.bias over T·V logits
    assert extra == pytest.approx(2 * d * tokens * (H + m.vocab_size))


def test_multi_tensor_launches_by_tensor_count_and_chunks():
    # 400 chunks of one tensor: 320 then 80; 100 one-chunk tensors at 48 a launch: 48, 48, 4
    assert multi_tensor_launches([65536 * 400], 48) == 2
    assert multi_tensor_launches([10] * 100, 48) == 3
    assert multi_tensor_launches([10] * 100) == 1           # depth 1: 110 a launch


def test_apex_master_pass_bytes():
    numels = [1000, 2000, 3000]
    # first micro-batch: multi_tensor_scale, fp16 read + fp32 write; later: axpby adds the
    # stashed fp32 gradient (read) too
    assert _memory_bytes(apex_master_kernels(numels, True)) == pytest.approx(6 * 6000)
    assert _memory_bytes(apex_master_kernels(numels, False)) == pytest.approx(10 * 6000)
    assert _memory_bytes(autograd_accumulate_kernels(numels, 2.0)) == pytest.approx(6 * 6000)


def _block_bytes(workload, name: str) -> float:
    """Bytes the compute ops of block ``name`` of the first rank class move."""
    ops = workload.classes[0].program.blocks[name].flat.ops
    return sum(op.payload.bytes * op.repeat for op in ops if hasattr(op.payload, "flops"))


@pytest.mark.parametrize("mode, first, later", [
    ("autograd", 0.0, 3 * 2.0),        # AccumulateGrad in fp16: read two, write one
    ("apex_master", 6.0, 10.0)])       # unscale into fp32 master gradients
def test_the_first_micro_batch_starts_the_gradients(mode, first, later):
    from ddlsim.api import build_workload
    cfg = _cfg(grad_accumulation=mode)
    w, plain = build_workload(cfg), build_workload(_cfg())
    steps = [s.block for s in w.classes[0].program.steps]
    assert steps == ["F", "B.first", "F", "B", "F", "B.sync", "update"]
    n, base = cfg.model.params, _block_bytes(plain, "B")
    # the accumulation's bytes on top of the same backward without it
    assert _block_bytes(w, "B.first") - base == pytest.approx(first * n)
    assert _block_bytes(w, "B") - base == pytest.approx(later * n)
    assert _block_bytes(w, "B.sync") - base == pytest.approx(later * n)


def test_accumulation_costs_time_and_none_is_todays_trace():
    base = ddlsim.predict(_cfg()).iteration_time_s
    assert ddlsim.predict(_cfg(grad_accumulation="none")).iteration_time_s == base
    assert ddlsim.predict(_cfg(grad_accumulation="autograd")).iteration_time_s > base
    # one micro-batch: nothing to accumulate into
    one = _cfg(micro_batches=1, grad_accumulation="autograd")
    assert ddlsim.predict(one).iteration_time_s == ddlsim.predict(_cfg(1)).iteration_time_s


def test_bad_step_options_name_the_field():
    with pytest.raises(ddlsim.errors.ConfigError, match="grad_accumulation"):
        _cfg(grad_accumulation="sometimes")
    with pytest.raises(ddlsim.errors.ConfigError, match="linear_bias"):
        _cfg(linear_bias="yes")


@pytest.mark.parametrize("backward", [False, True])
def test_score_passes_at_their_bandwidths(backward):
    # scale and mask add: torch element-wise kernels at the streaming bandwidth; softmax and
    # dropout: the device's score-pass figure (bert/kernels.py docstring)
    _, core, _ = layer_kernels(_cfg().model, B, S, 2.0, "fp16", backward)
    passes = [k.variant for k in core if k.kind == "memory"]
    assert passes == ["", "", "scores", "scores"]

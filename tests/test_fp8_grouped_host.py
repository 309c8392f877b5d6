"""The host's work of an FP8 grouped linear's quantized tensors (Transformer Engine's
``split_quantize``: one ``create_tensor`` per problem, three tensors each on Hopper;
simulator/kernels/fp8recipe.py ``fp8_quantize_host_s``, workloads/decoder/fp8linear.py
``with_fp8_casts``)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels import kernel_device, op_time
from ddlsim.simulator.kernels.fp8recipe import (TE_QUANTIZED_TENSORS, TE_TENSOR_CREATE_S,
                                                fp8_quantize_host_s)
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder.fp8linear import with_fp8_casts
from ddlsim.workloads.trace import Compute, Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Qwen3-30B-A3B's fc1 per expert at EP16 (4,096 tokens, 2 × 768 wide, hidden 2,048)
M, N, K = 4096.0, 1536.0, 2048.0
#: one quantized tensor's host work: data, transpose and scale_inv, ~5 us each (TE PR #865)
PER_TENSOR_S = 3 * 5e-6


def _sw(recipe: str):
    return resolve_software(SoftwareSpec(stack="megatron-core-2025",
                                         kernels={"fp8_recipe": recipe}))


def _grouped(dtype: str, backward: bool, batch: int = 8) -> Compute:
    shapes = ((M, K, N), (K, N, M)) if backward else ((M, N, K),)
    return Compute("fwd.experts.fc1", 2 * M * N * K * batch * len(shapes), kind="gemm",
                   dtype=dtype, kernels=tuple(Kernel("gemm", s, batch=batch, dtype=dtype)
                                              for s in shapes))


def test_te_creates_three_tensors_of_five_microseconds_per_quantized_tensor():
    assert TE_QUANTIZED_TENSORS * TE_TENSOR_CREATE_S == pytest.approx(PER_TENSOR_S)
    for recipe in ("te_current", "te_delayed"):     # split_quantize's UNFUSED allocation
        assert fp8_quantize_host_s(recipe, 8) == pytest.approx(8 * PER_TENSOR_S)
    for recipe in ("tensorwise", "rowwise"):        # torchao: torch ops, timed per launch
        assert fp8_quantize_host_s(recipe, 8) == 0.0


def test_a_negative_tensor_count_is_refused_naming_it():
    with pytest.raises(ValueError, match="tensors = -1"):
        fp8_quantize_host_s("te_current", -1)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("experts", [1, 8])
def test_each_problem_of_a_grouped_fp8_linear_adds_its_quantized_tensor_to_the_host(
        backward, experts):
    # forward: each expert's input; backward: each expert's output gradient; the weights'
    # FP8 copies are cached (get_weight_workspace) and create nothing
    op = with_fp8_casts(_grouped("fp8", backward, experts), _sw("te_current"), M, N, K,
                        backward, batch=experts)
    assert op.host_s == pytest.approx(experts * PER_TENSOR_S)
    # one launch per expert (no grouped GEMM): the same tensors
    one = with_fp8_casts(_grouped("fp8", backward, 1), _sw("te_current"), M, N, K, backward,
                         batch=1, launches=experts)
    assert one.host_s == pytest.approx(op.host_s)


def test_a_bf16_grouped_linear_gets_no_quantize_host_time():
    op = _grouped("bf16", False)
    assert with_fp8_casts(op, _sw("te_current"), M, N, K, False, batch=8) is op


def test_the_host_time_is_inside_the_op_beside_its_launches():
    # eight experts' current-scaling quantizes with fc2's forward (4,096 x 768 -> 2,048) on an
    # H100: the op's time is max(sum t + n g, n h + host_s), so the tensors add to the
    # launches' host time, which already nearly bound it
    cfg = ddlsim.load_config(_qwen_fp8("te_current"))
    dev = kernel_device(cfg.system)
    fc2 = (M, K, N / 2)
    gemm = Compute("fwd.experts.fc2", 2 * M * K * N / 2 * 8, kind="gemm", dtype="fp8",
                   kernels=(Kernel("gemm", fc2, batch=8, dtype="fp8"),))
    op = with_fp8_casts(gemm, _sw("te_current"), *fc2, False, batch=8)
    bare = Compute(op.name, op.flops, kind=op.kind, dtype=op.dtype, kernels=op.kernels)
    launches = len(op.kernels) * dev.launch.host_s
    assert op_time(bare, dev) < launches + 8 * PER_TENSOR_S
    assert op_time(op, dev) == pytest.approx(launches + 8 * PER_TENSOR_S)


def _qwen_fp8(recipe: str) -> dict:
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "dtype": "fp8"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"fp8_recipe": recipe}}}}


def test_the_moe_layers_expert_linears_carry_the_host_time_in_the_trace():
    # EP8 of 128 experts: 16 local experts, fc1 and fc2 each, forward and backward
    w = ddlsim.build_workload(ddlsim.load_config(_qwen_fp8("te_current")))
    ops = [o.payload for b in w.classes[0].program.blocks.values() for o in b.flat.ops
           if isinstance(o.payload, Compute) and ".experts.fc" in o.payload.name
           and any(k.kind == "gemm" for k in o.payload.kernels or ())]
    # beside the quantized tensors' host time, each op carries its GroupedLinear passes' host
    # work (grouped_linear.pass_host_s: one pass forward, two backward)
    from ddlsim.workloads.decoder.grouped_linear import pass_host_s
    cfg = ddlsim.load_config(_qwen_fp8("te_current"))
    launch, mode = cfg.system.device.launch, cfg.software.host_dispatch
    assert ops and all(p.host_s == pytest.approx(
        16 * PER_TENSOR_S + pass_host_s(16, 4, 2 if p.name.startswith("bwd") else 1, launch,
                                        mode)) for p in ops)


def test_the_combined_1f1b_split_keeps_the_host_time_on_the_data_gradient():
    # the combined 1F1B splits a backward GEMM op into .dgrad and .wgrad; the output
    # gradients' quantized tensors are created before the data gradient, so that op keeps
    # the host time (it was dropped before 2026-11-30)
    from ddlsim.workloads.decoder.combined_nodes import _split_wgrad
    op = with_fp8_casts(_grouped("fp8", True), _sw("te_current"), M, N, K, True, batch=8)
    assert op.host_s > 0
    dgrad, wgrad = _split_wgrad(op)
    assert dgrad.host_s == op.host_s
    assert wgrad.host_s == 0

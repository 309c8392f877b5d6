"""Grouped GEMM as Transformer Engine's GroupedLinear runs it (megatron-core-2025: one cuBLAS
GEMM per local expert, expert ``i`` on stream ``i mod 4``; ``decoder/grouped_linear.py``): the
experts' GEMMs of one pass as rounds of at most four concurrent GEMMs, the casts unchanged.
"""

from __future__ import annotations

import pytest
from stage_ops import compute_ops

import ddlsim
from ddlsim.workloads.decoder.combined_nodes import _split_wgrad
from ddlsim.workloads.decoder.grouped_linear import multi_stream_gemms, stream_rounds
from ddlsim.workloads.trace import Compute, Kernel

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

H, F_E = 4096, 14336          # Mixtral 8x7B (its config.json): 8 experts, top-2


def _cfg(ep: int, stack: str = "megatron-core-2025", dtype: str = "bf16") -> dict:
    """Mixtral 8x7B cut to two layers on one DGX H100, TP1, DP8, EP ``ep`` (8/ep local
    experts), grouped GEMM."""
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": ep,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "dtype": dtype, "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def _gemms(op: Compute) -> list[Kernel]:
    return [k for k in op.kernels if k.kind == "gemm"]


@pytest.mark.parametrize("experts, streams, rounds",
                         [(16, 4, (4, 4, 4, 4)), (8, 4, (4, 4)), (6, 4, (4, 2)), (3, 4, (3,)),
                          (5, 1, (1,) * 5)])
def test_rounds_are_the_round_robin_issue(experts, streams, rounds):
    assert stream_rounds(experts, streams) == rounds


def test_rounds_refuse_nonsense():
    with pytest.raises(ValueError, match="streams >= 1"):
        stream_rounds(4, 0)


def test_eight_local_experts_run_as_two_rounds_of_four():
    # EP1: all 8 experts local, each computing n = ep·T·k/E = 4096·2/8 = 1024 tokens; fc1
    # is [1024, 4096]·[4096, 2·14336] per expert, two rounds of four
    ops = compute_ops(_cfg(1))
    fc1 = ops["fwd.experts.fc1"]
    assert [(k.shape, k.batch) for k in _gemms(fc1)] == [((1024, 2 * F_E, H), 4.0)] * 2
    assert fc1.flops == pytest.approx(2 * 1024 * 2 * F_E * H * 8)
    bwd = _gemms(ops["bwd.experts.fc2"])       # dgrad, wgrad per round, two rounds
    assert [k.shape for k in bwd] == [(1024, F_E, H), (F_E, H, 1024)] * 2
    assert all(k.batch == 4.0 for k in bwd)


def test_four_local_experts_are_one_round_as_before():
    gemms = _gemms(compute_ops(_cfg(2))["fwd.experts.fc1"])
    assert [(k.shape, k.batch) for k in gemms] == [((2048, 2 * F_E, H), 4.0)]


def test_a_stack_without_the_feature_keeps_one_grouped_launch():
    # megatron-core-2024 names no grouped_gemm_streams: one launch of all 8 problems
    gemms = _gemms(compute_ops(_cfg(1, "megatron-core-2024"))["fwd.experts.fc1"])
    assert [k.batch for k in gemms] == [8.0]


def test_fp8_casts_stay_one_pass_over_all_experts_and_wgrad_splits_per_round():
    ops = compute_ops(_cfg(1, dtype="fp8"))
    fwd = ops["fwd.experts.fc1"]
    casts = [k for k in fwd.kernels if k.kind != "gemm"]
    assert len(_gemms(fwd)) == 2 and casts       # two rounds, the cast pass(es) kept
    assert fwd.kernels[:len(casts)] == tuple(casts)   # casts before the GEMMs
    d, w = _split_wgrad(ops["bwd.experts.fc1"])
    assert [k.shape for k in _gemms(d)] == [(1024, H, 2 * F_E)] * 2
    assert [k.shape for k in _gemms(w)] == [(H, 2 * F_E, 1024)] * 2


def test_multi_stream_gemms_refuses_a_launch_of_another_size():
    op = Compute("x", 1.0, kernels=(Kernel("gemm", (8, 8, 8), batch=3),))
    with pytest.raises(ValueError, match="expected one grouped launch of 4"):
        multi_stream_gemms(op, 4, 4)


def test_more_local_experts_cost_more_device_time_than_one_launch():
    # 16 problems of M = 512 (EP8 of 128 experts): one launch fills the SMs in waves over all
    # 16 problems' tiles; four rounds of four leave each round's last wave partly idle
    from ddlsim.simulator.kernels.device import kernel_device, op_time
    dev = kernel_device(ddlsim.load_config(_cfg(1)).system)
    one = Compute("one", 0.0, kernels=(Kernel("gemm", (512, 3072, 4096), batch=16),))
    rounds = multi_stream_gemms(one, 16, 4)
    assert len(rounds.kernels) == 4
    assert op_time(rounds, dev) > op_time(one, dev)


def test_the_plan_line_says_how_grouped_gemm_runs():
    from ddlsim.workloads.decoder.moeplan import resolve_moe
    te = resolve_moe(ddlsim.load_config(_cfg(1)))
    assert te.gemm_streams == 4
    assert "grouped GEMM (one per expert on 4 streams)" in te.phrase()
    assert "TransformerEngine v2.9" in te.sources["grouped_gemm_streams"]
    one = resolve_moe(ddlsim.load_config(_cfg(1, "megatron-core-2024")))
    assert one.gemm_streams == 0 and "grouped GEMM," in one.phrase()


def test_pass_host_is_every_gemm_launched_and_prepared():
    # dgx-h200's measured launch facts (6.5 µs a launch, 0.72 µs eager): a pass of 16 GEMMs
    # on 4 streams is 16·(6.5 + 1.89) + 6.0 µs of host work, of which the rule counts its 4
    # rounds at 6.5 + 0.72 µs; a backward op holds two passes
    from ddlsim.config_system import LaunchSpec
    from ddlsim.workloads.decoder.grouped_linear import (TE_GEMM_HOST_S, TE_PASS_HOST_S,
                                                         pass_host_s)
    launch = LaunchSpec(host_launch_s=6.5e-6, eager_op_s=0.72e-6, stream_gap_s=1.54e-6,
                        graph_gap_s=0.18e-6, source="test")
    per_pass = 16 * (6.5e-6 + TE_GEMM_HOST_S) + TE_PASS_HOST_S - 4 * (6.5e-6 + 0.72e-6)
    assert pass_host_s(16, 4, 1, launch, "eager") == pytest.approx(per_pass)
    assert pass_host_s(16, 4, 2, launch, "eager") == pytest.approx(2 * per_pass)
    assert pass_host_s(16, 4, 1, launch, "cuda_graphs") == 0.0
    assert pass_host_s(16, 4, 1, None, "eager") == 0.0


def test_expert_ops_carry_the_passes_host_time():
    # EP1: 8 local experts; the forward fc1 one pass, the backward fc2 two (data and weight
    # gradients), each with the pass's host work beyond its two rounds' launches
    from ddlsim.simulator.kernels.host import launch_costs
    from ddlsim.workloads.decoder.grouped_linear import TE_GEMM_HOST_S, TE_PASS_HOST_S
    from ddlsim.config import build_config
    cfg = build_config(_cfg(1))
    launch = cfg.system.device.launch
    h = launch_costs(launch, cfg.software.host_dispatch).host_s
    per_pass = 8 * (launch.host_launch_s + TE_GEMM_HOST_S) + TE_PASS_HOST_S - 2 * h
    ops = compute_ops(_cfg(1))
    assert ops["fwd.experts.fc1"].host_s == pytest.approx(per_pass)
    assert ops["bwd.experts.fc2"].host_s == pytest.approx(2 * per_pass)


def test_combined_1f1b_gives_the_weight_gradients_their_own_pass():
    # delayed weight gradients (the combined 1F1B's mlp_wgrad node): the data gradient keeps
    # one pass's host work, the weight gradient takes the other
    from ddlsim.workloads.decoder.grouped_linear import pass_host_s
    from ddlsim.config import build_config
    cfg = _cfg(2)   # 4 local experts: one round, so the pass beyond it is the host work
    cfg["parallel"]["moe"].update(overlap_expert_parallel_comm=True, delay_wgrad_compute=True)
    w = ddlsim.build_workload(build_config(cfg))
    ops = {o.payload.name: o.payload for b in w.classes[0].program.blocks.values()
           for o in b.flat.ops if isinstance(o.payload, Compute)}
    run = build_config(cfg)
    one = pass_host_s(4, 4, 1, run.system.device.launch, run.software.host_dispatch)
    assert one > 0
    assert ops["bwd.experts.fc1.wgrad"].host_s == pytest.approx(one)
    assert ops["bwd.experts.fc1.dgrad"].host_s == pytest.approx(one)

"""Without the gradient-reduce overlap, Megatron-Core reduces the dense bucket groups' gradients
and then the experts' (each call synchronous: distributed_data_parallel.py lines 677-678,
param_and_grad_buffer.py lines 682-685 and 806-808 at d98e8a64), so the expert-data-parallel
collective starts when the dense one ends; with the overlap both are issued during the
backward (each bucket group's on its own communicator) and only waited for here."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _run(ep: int, zero: int, overlap: bool) -> dict:
    """Qwen3-30B-A3B cut to two layers on two DGX H100s, EP ``ep`` (experts reduced over
    ``16 / ep`` ranks)."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": ep, "zero_stage": zero,
                         "overlap_grad_reduce": overlap, "overlap_param_gather": False,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": 2,
                       "software": {"stack": "megatron-core-2025"}}}


def _update(run: dict):
    prog = build_workload(ddlsim.load_config(run)).classes[0].program
    return prog.blocks["update"].ops


@pytest.mark.parametrize("zero", [0, 1])
def test_the_experts_gradients_are_reduced_after_the_dense_ones(zero):
    ops = _update(_run(8, zero, False))
    at = {o.payload.name: i for i, o in enumerate(ops) if type(o.payload) is Collective}
    op = "all_reduce" if zero == 0 else "reduce_scatter"
    dense, expert = at[f"grad.{op}"], at[f"grad.expert.{op}"]
    assert ops[expert].deps == (dense,) and ops[dense].deps == (0,)


@pytest.mark.parametrize("zero", [0, 1])
def test_both_engines_time_the_two_reductions_in_turn(zero):
    """The analytical engine no longer times them side by side at each one's full rate (the
    DES shared the NICs between them: on this shape with HybridEP, 11.6 against 6.1 ms exposed at ZeRO-0 before); the
    exposed data-parallel time is now the same in both, and more than either alone."""
    cfg = ddlsim.load_config(_run(8, zero, False))
    a, d = (ddlsim.predict(cfg, engine=e, check_fit=False) for e in ("analytical", "des"))
    dp = [r.breakdown.exposed_comm_s["dp"] for r in (a, d)]
    assert dp[0] == pytest.approx(dp[1], rel=1e-6)
    whole = ddlsim.predict(ddlsim.load_config(_run(16, zero, False)),
                           check_fit=False).breakdown.exposed_comm_s["dp"]
    assert dp[0] > whole      # the dense reduction alone (EP 16: no expert group)


def test_with_the_overlap_the_update_only_waits():
    ops = _update(_run(8, 1, True))
    assert not any(type(o.payload) is Collective and o.payload.name.startswith("grad.")
                   for o in ops)

"""The measured host seconds of Megatron-Core's MoE router, dispatch and combine
(ddlsim/data/moe_host_measured.yaml, decoder/moe_host_chain.py ``measured_host``): what the
trace charges for them, forward and backward, and where the count × host rule stays."""

from __future__ import annotations

import dataclasses

import pytest
from test_moe_host import ALLTOALL, DEEPEP, HOST_OP_S, qwen3_30b

import ddlsim
from ddlsim.workloads.decoder import moe_host
from ddlsim.workloads.decoder.moe_host import DISPATCHER_HOST, dispatcher_host
from ddlsim.workloads.decoder.moe_host_chain import add_backward_dispatcher_host
from ddlsim.workloads.decoder.moe_host_measured import MEASURED_CODE, measured_host
from ddlsim.workloads.decoder.moe_router import router_host_calls
from ddlsim.workloads.decoder.moeplan import resolve_moe
from ddlsim.workloads.decoder.partition.oplist import OpList

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _block(cfg: dict, name: str) -> list:
    return ddlsim.build_workload(ddlsim.load_config(cfg)).classes[0].program.blocks[name].flat.ops


def _plan(cfg: dict):
    return resolve_moe(ddlsim.load_config(cfg))


def test_the_measured_code_is_the_stacks_and_its_figures_are_per_call():
    # megatron-core-2025 <-> d7288711 (DISPATCHER_HOST was counted there); per call: the
    # part's host seconds over its forward calls, pooled over the 4 and 16 local experts
    m = measured_host()
    assert m.code == MEASURED_CODE == "d7288711"
    assert set(m.fwd) == set(m.bwd) == {"router", "dispatch", "combine"}
    # tens of µs per call on this CPU, far above the per-op rule's 2 µs eager_op_s
    assert all(3e-6 < s < 40e-6 for s in (*m.fwd.values(), *m.bwd.values()))
    with pytest.raises(ValueError, match="has no Megatron-LM code 'abc'.*1e057005"):
        measured_host("abc")


def test_the_measured_seconds_reach_the_forward_trace():
    # alltoall: every counted call of the router, dispatch and combine takes its part's
    # measured seconds (host_s); the experts' 3 calls keep the host rule (one kernel each)
    cfg = qwen3_30b(ALLTOALL, layers=1)
    plan, m = _plan(cfg), measured_host()
    host = [o.payload for o in _block(cfg, "F0") if o.stream == "host"
            and not o.payload.name.endswith((".te", ".sync"))]
    router = 16 + router_host_calls(plan)
    want = router * m.fwd["router"] + (36 + 4 + 4 + 2) * m.fwd["dispatch"] \
        + (3 + 4 + 2) * m.fwd["combine"]
    assert sum(p.host_s for p in host) == pytest.approx(want, rel=1e-12)
    assert sum(len(p.kernels) for p in host) == 3
    issue = next(p for p in host if p.name == "fwd.dispatch.issue")
    assert issue.host_s == pytest.approx(4 * m.fwd["dispatch"]) and not issue.kernels


def test_the_backward_carries_the_measured_seconds_per_counted_call():
    cfg = qwen3_30b(ALLTOALL, layers=1)
    plan, m, ops = _plan(cfg), measured_host(), OpList()
    add_backward_dispatcher_host(ops, plan, "bf16")
    [op] = ops.ops
    want = (16 + router_host_calls(plan)) * m.bwd["router"] + 46 * m.bwd["dispatch"] \
        + 9 * m.bwd["combine"]
    assert (op.payload.name, op.stream, op.deps) == ("bwd.moe.host", "host", ())
    assert op.payload.host_s == pytest.approx(want, rel=1e-12) and op.payload.kernels == ()


@pytest.mark.parametrize("dispatcher, pad", [(DEEPEP, False), (ALLTOALL, True)])
def test_where_nothing_was_measured_the_count_and_the_rule_stay(dispatcher, pad):
    # DeepEP's (and HybridEP's) parts cannot run on CPU: count x host rule; padded to capacity
    # the dispatcher never waits and carries no host op either way
    cfg = qwen3_30b(dispatcher, layers=1, pad=pad)
    host = [o.payload for o in _block(cfg, "F0") if o.stream == "host"]
    assert all(not p.host_s for p in host)
    ops = OpList()
    add_backward_dispatcher_host(ops, _plan(cfg), "bf16")
    assert not ops.ops


def test_the_measured_seconds_move_the_forward_and_both_engines_time_them(monkeypatch):
    # one DGX H100, one layer: after the wait for the router the issue (4 dispatch calls) and
    # the chain's steps meet a device with little queued, so the measured seconds, above the
    # rule's 5.8 µs per call, show; by at most the forward's whole excess over the rule
    cfg = qwen3_30b(ALLTOALL, layers=1)
    measured = ddlsim.predict(cfg, "analytical").iteration_time_s
    assert ddlsim.predict(cfg, "des").iteration_time_s == pytest.approx(measured, rel=1e-9)
    monkeypatch.setitem(DISPATCHER_HOST, "alltoall",
                        dataclasses.replace(DISPATCHER_HOST["alltoall"], work_parts=()))
    ruled = ddlsim.predict(cfg, "analytical").iteration_time_s
    m, plan = measured_host(), _plan(cfg)
    excess = sum(n * (m.fwd[p] - HOST_OP_S) for p, n in (
        ("router", 16 + router_host_calls(plan)), ("dispatch", 46), ("combine", 9)))
    assert 0 < measured - ruled <= excess


def test_parts_that_do_not_sum_to_the_counts_are_refused():
    base = DISPATCHER_HOST["alltoall"]
    with pytest.raises(ValueError, match="not the sums of their parts"):
        dataclasses.replace(base, work_parts=(("router", 16),))
    assert dispatcher_host(_plan(qwen3_30b(ALLTOALL))).measured is not None
    assert moe_host.work_op("x", 2, (), dataclasses.replace(base, measured=None),
                            "bf16").kernels == (moe_host.host_op("x", 2, "bf16").kernels)

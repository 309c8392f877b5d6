"""The host's wait for the device in each forward dispatch of Megatron-Core's MoE layer
(decoder/moe_host.py, docs/moe.md "The dispatcher's host synchronisation")."""

from __future__ import annotations

import dataclasses

import pytest

import ddlsim
from ddlsim.workloads.decoder import moe_host
from ddlsim.workloads.decoder.moe_host import DISPATCHER_HOST, SYNC_WAKE_S, dispatcher_host
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ALLTOALL = {"token_dispatcher_type": "alltoall"}
DEEPEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}
HYBRIDEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "hybridep"}
ALLGATHER = {"token_dispatcher_type": "allgather"}
#: the dgx-h100 preset's eager host time per operation: eager_op_s 2 µs + host_launch_s 3.8 µs
HOST_OP_S = 5.8e-6


def qwen3_30b(dispatcher: dict, layers: int = 2, pad: bool = False, **parallel) -> dict:
    """Qwen3-30B-A3B cut to ``layers`` layers on one DGX H100, EP8, one micro-batch."""
    moe = {**dispatcher, "grouped_gemm": True, "permute_fusion": True,
           "router_force_load_balancing": True}
    model = {"preset": "qwen3-30b-a3b", "num_hidden_layers": layers}
    if pad:
        moe["pad_expert_input_to_capacity"] = True
        model["capacity_factor"] = 1.0
    return {"model": model,
            "parallel": {"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                         "moe": moe, **parallel},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _ops(cfg: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o for b in w.classes[0].program.blocks.values() for o in b.flat.ops]


def _iteration(cfg: dict) -> float:
    return ddlsim.predict(cfg, "analytical").to_dict()["iteration_time_s"]


@pytest.fixture
def no_waits(monkeypatch):
    """Every dispatcher as if it never waited (its sizes known on the host)."""
    for key, host in list(DISPATCHER_HOST.items()):
        monkeypatch.setitem(DISPATCHER_HOST, key,
                            dataclasses.replace(host, waits_when=lambda plan: False))


# ---------------------------------------------------------------- which dispatcher waits
@pytest.mark.parametrize("dispatcher, pad, waits", [
    (ALLTOALL, False, [("router", 1, 4)]), (ALLTOALL, True, None),
    (ALLGATHER, False, [("dispatch", 1, 3)]),
    (DEEPEP, False, [("router", 1, 4), ("dispatch", 3, 8)]),
    (HYBRIDEP, False, [("router", 1, 4)]), (HYBRIDEP, True, None)])
def test_dispatchers_wait_as_their_code_does(dispatcher, pad, waits):
    # Megatron-LM d7288711: alltoall and HybridEP know every size on the host only when padded
    # to capacity; DeepEP's dispatch always waits (and cannot pad), then its multihot
    # conversion three times more; allgather's .cpu() waits for the gather
    cfg = ddlsim.load_config(qwen3_30b(dispatcher, pad=pad))
    host = dispatcher_host(resolve_moe(cfg))
    if waits is None:
        assert host is None
    else:
        assert [(w.after, w.wakes, w.issue_ops) for w in host.waits] == waits
        assert "line" in host.source and host.work_ops > 0


def test_every_dispatcher_names_its_source():
    assert set(DISPATCHER_HOST) == {"alltoall", "allgather", "deepep", "hybridep"}
    assert all(h.source and h.waits for h in DISPATCHER_HOST.values())


# ---------------------------------------------------------------- the trace
def test_the_forward_waits_for_the_router_and_the_dispatch_and_the_device_for_the_issue():
    w = ddlsim.build_workload(ddlsim.load_config(qwen3_30b(DEEPEP, layers=1)))
    block = w.classes[0].program.blocks["F0"].flat.ops
    names = [o.payload.name for o in block]
    syncs = [i for i, n in enumerate(names) if n == "fwd.dispatch.sync"]
    issues = [i for i, n in enumerate(names) if n == "fwd.dispatch.issue"]
    work, dispatch, sort = (names.index(n) for n in ("fwd.moe.host", "fwd.dispatch", "fwd.sort"))
    assert {block[i].stream for i in (*syncs, *issues, work)} == {"host"}
    # the first wait: for the router; the dispatch waits for its issue
    assert names.index("fwd.router") in block[syncs[0]].deps
    assert syncs[0] in block[issues[0]].deps and issues[0] in block[dispatch].deps
    # DeepEP's multihot conversion: three wake-ups after the dispatch, then the permutation
    assert dispatch in block[syncs[1]].deps and issues[1] in block[sort].deps
    assert [block[i].payload.seconds for i in syncs] == [SYNC_WAKE_S, 3 * SYNC_WAKE_S]
    assert [len(block[i].payload.kernels) for i in issues] == [4, 8]
    assert len(block[work].payload.kernels) == DISPATCHER_HOST["deepep"].work_ops


def test_no_backward_pass_waits():
    names = [o.payload.name for o in _ops(qwen3_30b(ALLTOALL))]
    assert names.count("fwd.dispatch.sync") == 2          # one per MoE layer's forward
    assert not any(n.startswith("bwd.") and n.endswith(".sync") for n in names)


def test_a_recomputed_forward_waits_again():
    cfg = qwen3_30b(ALLTOALL)
    cfg["train"]["recompute"] = "full"
    blocks = ddlsim.build_workload(ddlsim.load_config(cfg)).classes[0].program.blocks
    names = [o.payload.name for o in blocks["B0"].flat.ops]
    assert names.count("recompute.dispatch.sync") == 2   # the backward's recomputed forwards'
    assert not [n for n in names if n.startswith("bwd.") and n.endswith(".sync")]


def test_padded_to_capacity_the_trace_has_no_host_op():
    assert not [o for o in _ops(qwen3_30b(ALLTOALL, pad=True)) if o.stream == "host"]


# ---------------------------------------------------------------- the time
def test_a_wait_exposes_the_wake_and_the_issue_per_forward_layer(no_waits, monkeypatch):
    # DeepEP: nothing is queued on the device after the router, nor after the dispatch, so
    # each of the 2 forward layers idles the device for 1 + 3 wakes and 4 + 8 host operations
    # of 5.8 µs; the 47 operations of work run ahead of the device, hidden
    cfg = qwen3_30b(DEEPEP)
    without = _iteration(cfg)
    monkeypatch.undo()
    assert _iteration(cfg) - without == pytest.approx(
        2 * (4 * SYNC_WAKE_S + 12 * HOST_OP_S), rel=1e-6)


def test_without_a_wait_nothing_changes(no_waits):
    # padded to capacity the dispatcher never waits: the same trace with or without the model
    cfg = qwen3_30b(ALLTOALL, pad=True)
    assert not [o for o in _ops(cfg) if o.stream == "host"]
    assert _iteration(cfg) == _iteration(qwen3_30b(ALLTOALL, pad=True))


def test_alltoall_hides_the_wait_behind_permutation_1_where_it_is_longer(no_waits,
                                                                         monkeypatch):
    # the host waits for the router's counts, not for permutation 1 issued after them: the
    # device idles for the wake and issue less the permutation
    cfg = qwen3_30b(ALLTOALL)
    without = _iteration(cfg)
    monkeypatch.undo()
    delta = _iteration(cfg) - without
    assert 0 <= delta <= 2 * (SYNC_WAKE_S + 4 * HOST_OP_S) * (1 + 1e-9)


def test_both_engines_time_the_wait():
    cfg = qwen3_30b(DEEPEP, layers=1)
    ana, des = (ddlsim.predict(cfg, e).to_dict()["iteration_time_s"]
                for e in ("analytical", "des"))
    assert des == pytest.approx(ana, rel=0.01)


def test_the_combined_1f1b_forward_nodes_open_with_the_waits():
    from ddlsim.workloads.decoder.builder import StageBuilder
    from ddlsim.workloads.decoder.combined import moe_layer_nodes
    cfg = ddlsim.load_config(qwen3_30b(DEEPEP))
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    nodes = moe_layer_nodes(b, False)
    assert [(o.payload.name, o.stream, o.deps) for o in nodes["dispatch"][:3]] == [
        ("fwd.dispatch.sync", "host", ()), ("fwd.dispatch.issue", "host", (0,)),
        ("fwd.dispatch", "ep", (1,))]
    mlp = nodes["mlp"]      # DeepEP's post-dispatch waits, then the layer's host work
    assert [(o.payload.name, o.stream) for o in mlp[:4]] == [
        ("fwd.dispatch.sync", "host"), ("fwd.dispatch.issue", "host"),
        ("fwd.moe.host", "host"), ("fwd.moe.host.te", "host")]
    assert mlp[4].deps == (1,) and mlp[0].payload.seconds == 3 * SYNC_WAKE_S
    assert not [o for o in nodes["dispatch"] if o.payload.name.startswith("fwd.moe.host")]
    back = moe_layer_nodes(b, True)
    assert not [o for n in back.values() for o in n if o.stream == "host"]
    assert moe_host.node_with_waits("fwd", None, "router", "bf16", mlp[4:]) == mlp[4:]


def test_the_hosts_work_binds_only_where_it_outlasts_the_device(monkeypatch):
    # the work after a layer's last issue runs ahead of the device until the next layer's
    # wait: with the published 115 µs per TE linear it is hidden; at 5 ms per linear (20 ms of
    # host work per layer) the second layer's wait starts late, the first layer's does not
    base = {n: _iteration(qwen3_30b(DEEPEP, layers=n)) for n in (1, 2)}
    monkeypatch.setattr(moe_host, "TE_LINEAR_HOST_S", 5e-3)
    slow = {n: _iteration(qwen3_30b(DEEPEP, layers=n)) for n in (1, 2)}
    assert slow[1] == base[1]
    assert 15e-3 < slow[2] - base[2] < 20e-3


def test_with_one_wait_the_combined_dispatch_node_carries_the_hosts_work():
    from ddlsim.workloads.decoder.builder import StageBuilder
    from ddlsim.workloads.decoder.combined import moe_layer_nodes
    cfg = ddlsim.load_config(qwen3_30b(ALLTOALL))
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    node = moe_layer_nodes(b, False)["dispatch"]
    assert [o.payload.name for o in node[:5]] == [
        "fwd.dispatch.sync", "fwd.dispatch.issue", "fwd.moe.host", "fwd.moe.host.te",
        "fwd.dispatch"]
    assert node[4].deps == (1,)       # the all-to-all waits for the issue, not the work

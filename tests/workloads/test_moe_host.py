"""The host's wait for the device in each forward dispatch of Megatron-Core's MoE layer
(decoder/moe_host.py, docs/moe.md "The dispatcher's host synchronisation")."""

from __future__ import annotations

import dataclasses

import pytest

import ddlsim
from ddlsim.workloads.decoder import moe_host, moe_host_chain
from ddlsim.workloads.decoder.moe_host import DISPATCHER_HOST, SYNC_WAKE_S, dispatcher_host
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ALLTOALL = {"token_dispatcher_type": "alltoall"}
DEEPEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}
HYBRIDEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "hybridep"}
ALLGATHER = {"token_dispatcher_type": "allgather"}
#: the dgx-h100 preset's eager host time per operation: eager_op_s 2 µs + host_launch_s 3.8 µs
HOST_OP_S = 5.8e-6
#: one TE grouped linear's forward host time in the chain for Qwen3-30B-A3B at EP8 (16 local
#: experts): a TE linear's, and the 15 further experts' measured per-expert time
GROUPED_TE_S = moe_host.TE_LINEAR_HOST_S + 15 * moe_host_chain.GROUPED_LINEAR_FWD_S


def qwen3_30b(dispatcher: dict, layers: int = 2, pad: bool = False, **parallel) -> dict:
    """Qwen3-30B-A3B cut to ``layers`` layers on one DGX H100, EP8, one micro-batch."""
    moe = {**dispatcher, "grouped_gemm": True, "permute_fusion": True,
           "router_force_load_balancing": True,
           "aux_loss_coeff": 0.0}   # no loss kernels after top-k (not its config.json's 1e-3)
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
    cfg = ddlsim.load_config(qwen3_30b(DEEPEP, layers=1))
    w = ddlsim.build_workload(cfg)
    block = w.classes[0].program.blocks["F0"].flat.ops
    names = [o.payload.name for o in block]
    syncs = [i for i, n in enumerate(names) if n == "fwd.dispatch.sync"]
    issues = [i for i, n in enumerate(names) if n == "fwd.dispatch.issue"]
    work, dispatch, sort = (names.index(n) for n in ("fwd.moe.host", "fwd.dispatch", "fwd.sort"))
    assert {block[i].stream for i in (*syncs, *issues, work)} == {"host"}
    # the first wait: for the router's last kernels (top-k, .moe_router); the dispatch waits
    # for its issue
    assert names.index("fwd.router.kernels") in block[syncs[0]].deps
    assert syncs[0] in block[issues[0]].deps and issues[0] in block[dispatch].deps
    # DeepEP's multihot conversion: three wake-ups after the dispatch, then the permutation
    assert dispatch in block[syncs[1]].deps and issues[1] in block[sort].deps
    assert [block[i].payload.seconds for i in syncs] == [SYNC_WAKE_S, 3 * SYNC_WAKE_S]
    assert [len(block[i].payload.kernels) for i in issues] == [4, 8]
    # the rest of the work: less the steps to the combine (with the unfused router's calls)
    host = dispatcher_host(resolve_moe(cfg))
    assert len(block[work].payload.kernels) == host.work_ops - sum(s.ops for s in host.chain)


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


def _forward_host(ops) -> list:
    """The forward's host ops (the backward's per-expert host work has no wait)."""
    return [o for o in ops if o.stream == "host" and not o.payload.name.startswith("bwd.")]


def test_padded_to_capacity_the_forward_has_no_host_op():
    ops = _ops(qwen3_30b(ALLTOALL, pad=True))
    assert not _forward_host(ops)
    assert {o.payload.name for o in ops if o.stream == "host"} == {"bwd.experts.host"}


# ---------------------------------------------------------------- the time
def test_a_wait_exposes_the_wake_and_the_issue_per_forward_layer(no_waits, monkeypatch):
    # DeepEP: nothing is queued on the device after the router, nor after the dispatch, so
    # each of the 2 forward layers idles the device for 1 + 3 wakes and 4 + 8 host operations
    # of 5.8 µs; the 47 operations of work run ahead of the device, hidden
    # (the host's steps after the last wait, which the permutation partly covers: next test)
    cfg = qwen3_30b(DEEPEP)
    without = _iteration(cfg)
    monkeypatch.undo()
    monkeypatch.setitem(DISPATCHER_HOST, "deepep",
                        dataclasses.replace(DISPATCHER_HOST["deepep"], chain=()))
    assert _iteration(cfg) - without == pytest.approx(
        2 * (4 * SYNC_WAKE_S + 12 * HOST_OP_S), rel=1e-6)


def test_without_a_wait_nothing_changes(no_waits):
    # padded to capacity the dispatcher never waits: the same trace with or without the model
    cfg = qwen3_30b(ALLTOALL, pad=True)
    assert not _forward_host(_ops(cfg))
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


def _combined_nodes(dispatcher: dict, backward: bool = False) -> dict:
    from ddlsim.workloads.decoder.builder import StageBuilder
    from ddlsim.workloads.decoder.combined_nodes import moe_layer_nodes
    cfg = ddlsim.load_config(qwen3_30b(dispatcher))
    return moe_layer_nodes(StageBuilder.from_config(cfg, cfg.model.shape()), backward)


def test_the_combined_1f1b_forward_nodes_open_with_the_waits():
    nodes = _combined_nodes(DEEPEP)
    assert [(o.payload.name, o.stream, o.deps) for o in nodes["dispatch"][:3]] == [
        ("fwd.dispatch.sync", "host", ()), ("fwd.dispatch.issue", "host", (0,)),
        ("fwd.dispatch", "ep", (1,))]
    mlp = nodes["mlp"]      # DeepEP's post-dispatch waits, then the permutation by expert
    assert [(o.payload.name, o.stream) for o in mlp[:4]] == [
        ("fwd.dispatch.drain", "host"), ("fwd.dispatch.sync", "host"),
        ("fwd.dispatch.issue", "host"), ("fwd.sort", "compute")]
    assert mlp[3].deps == (2,) and mlp[1].payload.seconds == 3 * SYNC_WAKE_S
    assert not [o for o in nodes["dispatch"] if o.payload.name.startswith("fwd.moe.host")]
    assert not [o for n in _combined_nodes(DEEPEP, True).values() for o in n
                if o.stream == "host"]
    assert moe_host_chain.node_with_waits("fwd", None, "router", "bf16", mlp[3:]) == mlp[3:]


def test_the_combined_mlp_nodes_waits_drain_the_compute_stream_and_its_steps_gate_fc1_fc2():
    # DeepEP's multihot waits run in the mlp node on the compute stream: a stream sync that
    # waits for the paired backward's expert gradients issued before it (Wait on "compute"),
    # after which the host's steps launch fc1 and fc2 as outside the combined schedule; the
    # counted work stays the layer's, and the node still ends on the device
    from ddlsim.workloads.trace import Wait
    mlp = _combined_nodes(DEEPEP)["mlp"]
    drain = mlp[0].payload
    assert isinstance(drain, Wait) and drain.stream == "compute" and mlp[0].stream == "host"
    names = [o.payload.name for o in mlp]
    for device, step in (("fwd.experts.fc1", "fwd.experts.fc1.host.te"),
                         ("fwd.experts.fc2", "fwd.experts.fc2.host.te")):
        assert names.index(step) in mlp[names.index(device)].deps
    assert mlp[-1].stream == "compute"
    host = dispatcher_host(resolve_moe(ddlsim.load_config(qwen3_30b(DEEPEP))))
    counted = sum(len(o.payload.kernels) for o in mlp if o.stream == "host"
                  and o.payload.name.endswith(".host"))
    te = sum(o.payload.seconds for o in mlp if o.payload.name.endswith(".host.te"))
    assert counted == host.work_ops     # qkv and proj run ahead; fc1 and fc2 are grouped
    assert te == pytest.approx(2 * moe_host.TE_LINEAR_HOST_S + 2 * GROUPED_TE_S)


def _overlapped(dispatcher: dict, layers: int = 2) -> dict:
    """:func:`qwen3_30b` with Megatron-Core's combined 1F1B: two micro-batches, one combined
    step (F0, B0 + F1, B1)."""
    cfg = qwen3_30b(dispatcher, layers=layers)
    cfg["train"]["global_batch_size"] = 16
    cfg["parallel"]["moe"].update(overlap_expert_parallel_comm=True, delay_wgrad_compute=True)
    return cfg


def test_in_a_combined_step_fc1_starts_after_the_backward_wgrad_the_wakes_and_the_steps():
    # one combined step (B0 + F1), DES timeline of rank 0: each forward MoE layer's multihot
    # waits start when the paired backward's last expert weight gradient ends, and fc1 starts
    # 3 wakes, the 8 issue calls, fc1's 3 calls and its TE linear later (the compute stream
    # idles meanwhile: its next work, the attention backward, is issued after this node)
    r = ddlsim.predict(_overlapped(DEEPEP), "des")
    spans = [s for s in r.spans if s.rank == 0]
    wgrad = [s for s in spans if s.name == "bwd.experts.fc1.wgrad"]
    fc1 = [s for s in spans if s.name == "fwd.experts.fc1"]
    late = [f for f in fc1 if f.start_s > wgrad[0].start_s]    # the combined step's forwards
    assert len(wgrad) == 2 and len(late) == 2       # B0's two layers beside F1's two
    gap = 3 * SYNC_WAKE_S + (8 + 3) * HOST_OP_S + GROUPED_TE_S
    for w, f in zip(wgrad, late):
        assert f.start_s - w.end_s == pytest.approx(gap, rel=1e-6)


def test_both_engines_time_the_combined_deepep_step():
    cfg = _overlapped(DEEPEP)
    ana, des = (ddlsim.predict(cfg, e).iteration_time_s for e in ("analytical", "des"))
    assert des == pytest.approx(ana, rel=0.01)


def test_the_hosts_work_binds_only_where_it_outlasts_the_device(monkeypatch):
    # at 5 ms per TE linear: the experts' two (fc1, fc2) are steps of the chain after the
    # last wait, which the device cannot outrun (10 ms per layer, less the sort and fc1 it
    # runs meanwhile); the attention's two (qkv, proj, 10 ms) run ahead with the rest of the
    # work, and bind only at the next layer's wait, late by them less the device's work
    base = {n: _iteration(qwen3_30b(DEEPEP, layers=n)) for n in (1, 2)}
    monkeypatch.setattr(moe_host, "TE_LINEAR_HOST_S", 5e-3)
    slow = {n: _iteration(qwen3_30b(DEEPEP, layers=n)) for n in (1, 2)}
    chain = slow[1] - base[1]
    assert 9e-3 < chain <= 10e-3 + 3 * HOST_OP_S
    assert 8e-3 < slow[2] - base[2] - 2 * chain < 10e-3


def test_after_the_last_wait_each_expert_op_waits_for_the_hosts_step():
    w = ddlsim.build_workload(ddlsim.load_config(qwen3_30b(DEEPEP, layers=1)))
    block = w.classes[0].program.blocks["F0"].flat.ops
    names = [o.payload.name for o in block]
    for device, step in (("fwd.experts.fc1", "fwd.experts.fc1.host.te"),
                         ("fwd.experts.fc2", "fwd.experts.fc2.host.te"),
                         ("fwd.combine", "fwd.combine.host")):
        assert block[names.index(step)].stream == "host"
        assert names.index(step) in block[names.index(device)].deps
    # the short ops between them (sort, act, unsort) are launched by the next step's calls
    assert not [n for n in names if n.endswith((".sort.host", ".act.host", ".unsort.host"))]
    # the chain is a part of the layer's counted work, not more of it
    host = dispatcher_host(resolve_moe(ddlsim.load_config(qwen3_30b(DEEPEP, layers=1))))
    counted = sum(len(o.payload.kernels) for o in block if o.stream == "host"
                  and o.payload.name.endswith(".host"))
    te = sum(o.payload.seconds for o in block if o.payload.name.endswith(".host.te"))
    assert counted == host.work_ops
    assert te == pytest.approx(2 * moe_host.TE_LINEAR_HOST_S + 2 * GROUPED_TE_S)


@pytest.mark.parametrize("dispatcher, exposed", [(DEEPEP, True), (ALLTOALL, False)])
def test_the_chain_exposes_what_the_device_has_not_to_run(dispatcher, exposed, monkeypatch):
    # DeepEP: after its multihot waits the device has only the permutation to run while the
    # host reaches fc1 (3 operations and fc1's TE linear): exposed less the permutation, per
    # layer; alltoall: the dispatch all-to-all, issued before the steps, outlasts them
    cfg = qwen3_30b(dispatcher)
    with_chain = _iteration(cfg)
    key = "deepep" if dispatcher is DEEPEP else "alltoall"
    monkeypatch.setitem(DISPATCHER_HOST, key,
                        dataclasses.replace(DISPATCHER_HOST[key], chain=()))
    delta = with_chain - _iteration(cfg)
    if exposed:
        assert 0 < delta <= 2 * (3 * HOST_OP_S + GROUPED_TE_S) * (1 + 1e-9)
    else:
        assert delta == 0


def test_the_backward_charges_grouped_linears_measured_per_expert_host_time(monkeypatch):
    # TE's GroupedLinear backward, autograd and Megatron's DDP hook: measured seconds per local
    # expert and linear (moe_host_chain.GROUPED_LINEAR_BWD_S, benchmarks/te_grouped_host.py;
    # 16 local experts, fc1 and fc2), no kernel; no wait: it binds only where the host's total
    # outlasts the device's (here at 2.9 ms each, not at 58 µs)
    cfg = qwen3_30b(ALLTOALL, layers=1)
    block = ddlsim.build_workload(ddlsim.load_config(cfg)).classes[0].program.blocks["B0"]
    host = [o for o in block.flat.ops if o.stream == "host"]
    assert [o.payload.name for o in host] == ["bwd.moe.host", "bwd.experts.host"]  # measured
    bwd = host[1:]       # after the router's, dispatch's and combine's (test_moe_host_measured)
    assert [(o.payload.name, len(o.payload.kernels)) for o in bwd] == [("bwd.experts.host", 0)]
    assert bwd[0].payload.host_s == pytest.approx(2 * 16 * moe_host_chain.GROUPED_LINEAR_BWD_S)
    assert all(block.flat.ops[d].stream != "host" and not block.flat.ops[d].payload.name
               .startswith("bwd.experts") for d in bwd[0].deps)   # none on the experts
    base = _iteration(cfg)
    monkeypatch.setattr(moe_host_chain, "GROUPED_LINEAR_BWD_S", 58e-6)   # 1.9 ms: hidden
    assert _iteration(cfg) == base
    monkeypatch.setattr(moe_host_chain, "GROUPED_LINEAR_BWD_S", 2.9e-3)
    assert _iteration(cfg) > base + 0.5 * 2 * 16 * 2.9e-3


def test_with_one_wait_the_combined_dispatch_node_carries_the_hosts_work():
    node = _combined_nodes(ALLTOALL)["dispatch"]
    assert [o.payload.name for o in node[:5]] == [
        "fwd.dispatch.sync", "fwd.dispatch.issue", "fwd.moe.host", "fwd.moe.host.te",
        "fwd.dispatch"]
    assert node[4].deps == (1,)       # the all-to-all waits for the issue, not the work

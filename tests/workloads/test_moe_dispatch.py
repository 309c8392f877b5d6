"""Megatron-Core's flex token dispatcher (DeepEP, HybridEP): the node-deduplicated traffic
against a brute-force enumeration of every routing, the kernel tables it was derived from,
its ops in the MoE layer, both engines, and the refusals (docs/moe.md, "Dispatchers")."""

from __future__ import annotations

from itertools import combinations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.collectives import GroupNet, collective_time
from ddlsim.simulator.collectives.flex import (KERNELS, flex_algorithm, flex_time,
                                               flex_traffic, hit_probability)
from ddlsim.workloads.trace import Collective, Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


# ---------------------------------------------------------------- the deduplicated traffic
def _brute_force(experts: int, top_k: int, replicas: int, p: int, g: int) -> tuple[float, float]:
    """Mean over every top-k subset of the experts (uniform routing) of the remote nodes and
    the members one token reaches; member m holds experts of EP index m // replicas."""
    ep = p // replicas
    per_ep = experts // ep
    member_of = [[e // per_ep * replicas + r for r in range(replicas)] for e in range(experts)]
    remote = members = count = 0
    for pick in combinations(range(experts), top_k):
        hit = {m for e in pick for m in member_of[e]}
        nodes = {m // g for m in hit}
        remote += len(nodes - {0})       # the sender is member 0, on node 0
        members += len(hit)
        count += 1
    return remote / count, members / count


@pytest.mark.parametrize("experts, top_k, replicas, p, g", [
    (8, 2, 1, 4, 2), (12, 3, 1, 6, 3), (16, 4, 1, 8, 4), (8, 3, 2, 8, 4), (10, 1, 1, 10, 5),
    (8, 8, 1, 4, 2), (6, 2, 1, 6, 6)])
def test_dedup_expectation_matches_every_routing_enumerated(experts, top_k, replicas, p, g):
    # per token (1 byte): RDMA bytes = expected remote nodes reached; NVLink bytes received by a
    # member = p · P(member reached) = expected members one token reaches (symmetry)
    t = flex_traffic(1.0, experts, top_k, replicas, p, g)
    remote, members = _brute_force(experts, top_k, replicas, p, g)
    assert t.rdma_bytes == pytest.approx(remote, rel=1e-12)
    assert t.nvl_bytes == pytest.approx(members, rel=1e-12)


def test_hit_probability_closed_form():
    # one expert of 4, top-2: 1 − C(3,2)/C(4,2) = 1 − 3/6; all experts held: certain
    assert hit_probability(4, 1, 2) == pytest.approx(0.5)
    assert hit_probability(8, 8, 3) == 1.0 and hit_probability(8, 0, 3) == 0.0
    with pytest.raises(ValueError, match="top_k"):
        hit_probability(4, 1, 5)


@pytest.mark.parametrize("experts, top_k, p, g", [
    (128, 8, 16, 8), (256, 8, 64, 8), (64, 6, 32, 8), (128, 2, 16, 4), (160, 6, 32, 8)])
def test_flex_sends_fewer_bytes_across_nodes_than_alltoall(experts, top_k, p, g):
    # alltoall: T·k copies, (p − g)/p of them to other nodes; flex: each token once per
    # remote node it reaches, at most min(k, N − 1) of them
    t = flex_traffic(1.0, experts, top_k, 1, p, g)
    assert t.rdma_bytes < top_k * (p - g) / p
    assert t.rdma_bytes <= min(top_k, p // g - 1)


@pytest.mark.parametrize("experts, top_k, p", [(8, 2, 8), (16, 4, 16), (64, 1, 8)])
def test_inside_one_node_flex_receives_what_alltoall_sends_when_nothing_dedups(experts,
                                                                               top_k, p):
    # one expert per member (E = p) or top-1: no two copies of a token share a member, so the
    # NVLink bytes equal the alltoall dispatcher's T·k; with several experts per member fewer
    t = flex_traffic(1.0, experts, top_k, 1, p, p)
    if experts == p or top_k == 1:
        assert t.nvl_bytes == pytest.approx(top_k)
        assert t.rdma_bytes == 0.0
    else:
        assert t.nvl_bytes < top_k


def test_experts_that_do_not_split_over_members_are_refused():
    with pytest.raises(ValueError, match="do not split evenly"):
        flex_traffic(1.0, 10, 2, 1, 4, 2)


# ---------------------------------------------------------------- the kernel tables
def _net(p: int, nvlink: float) -> GroupNet:
    """p members, 8 per node, 400 Gb/s (50 GB/s) per GPU, latency left out."""
    return GroupNet(p, min(p, 8), 0.0, nvlink, 0.0, 8 * 50e9 if p > 8 else float("inf"),
                    max(1, p // 8))


def _counted_GBps(backend: str, kernel: str, experts: int, p: int, nvlink: float) -> float:
    """The tables' own figure: 4096 tokens × hidden 7168 × 2 B to each distinct node (own
    included; DeepEP tests/test_internode.py line 222, hybrid-ep tests/utils.py) or received
    (inside a node), over the kernel's time."""
    token = 4096 * 7168 * 2
    t = flex_traffic(token, experts, 8, 1, p, min(p, 8))
    seconds = flex_time(t, KERNELS[(backend, kernel)], _net(p, nvlink))
    counted = t.nvl_bytes if p <= 8 else token * (p // 8) * t.q_node
    return counted / seconds / 1e9


@pytest.mark.parametrize("kernel, p, published", [
    ("dispatch", 16, 54.47), ("combine", 16, 53.35), ("dispatch", 32, 47.36),
    ("combine", 32, 52.53)])
def test_hybridep_reproduces_the_h100_rows_it_was_derived_from(kernel, p, published):
    # DeepEP hybrid-ep 7febc6e docs/README_Hybrid-EP.md, H100, 16 SMs, Torch API, BF16
    assert _counted_GBps("hybridep", kernel, 8 * p, p, 450e9) == pytest.approx(published,
                                                                              rel=3e-3)


@pytest.mark.parametrize("kernel, published", [("dispatch", 41.24), ("combine", 46.57)])
def test_hybridep_predicts_the_held_out_64_rank_row_within_3_percent(kernel, published):
    # not used in the derivation: 8 nodes, 512 experts; NIC-bound, so the 32-rank row's
    # efficiency must carry over (0.722 vs 0.710 dispatch, 0.815 vs 0.788 combine)
    got = _counted_GBps("hybridep", kernel, 512, 64, 450e9)
    assert got == pytest.approx(published, rel=0.035)


@pytest.mark.parametrize("kernel, p, published", [
    ("dispatch", 8, 153), ("combine", 8, 158), ("dispatch", 16, 43), ("combine", 16, 43),
    ("dispatch", 32, 58), ("combine", 32, 57)])
def test_deepep_reproduces_its_h800_readme_rows(kernel, p, published):
    # DeepEP 567632d README (H800: NVLink 200 GB/s per direction), 256 experts, top-8; at 2
    # and 4 nodes the top-4-groups limit picks every node, so routing is uniform
    assert _counted_GBps("deepep", kernel, 256, p, 200e9) == pytest.approx(published, rel=3e-3)


def test_each_kernel_names_its_source():
    for (backend, _), k in KERNELS.items():
        assert {"deepep": "567632d", "hybridep": "7febc6e"}[backend] in k.source
        assert 0 < k.nic_efficiency <= 1 and 0 < k.nvl_efficiency <= 1


def test_the_algorithm_is_made_from_its_name_and_never_listed_or_picked_by_auto():
    from ddlsim.simulator.collectives import algorithms_for, get_algorithm
    name = flex_algorithm("hybridep", "dispatch", 8, 128, 1)
    assert name == "hybridep_dispatch[k=8,E=128,r=1]"
    assert get_algorithm("all_to_all", name).backend == "flex"
    assert name not in algorithms_for("all_to_all")
    assert collective_time("all_to_all", name, 1e6, _net(1, 450e9)) == 0.0
    # 16 members on 2 nodes: the NVLink-bound kernel, as flex_time computes it
    t = flex_traffic(1e6 / 8, 128, 8, 1, 16, 8)
    assert collective_time("all_to_all", name, 1e6, _net(16, 450e9)) == pytest.approx(
        flex_time(t, KERNELS[("hybridep", "dispatch")], _net(16, 450e9)))
    with pytest.raises(ConfigError, match="no algorithm 'hybridep_dispatch\\[k=8\\]'"):
        get_algorithm("all_to_all", "hybridep_dispatch[k=8]")
    with pytest.raises(ValueError, match="allowed deepep_dispatch"):
        flex_algorithm("nccl", "dispatch", 8, 128, 1)


# ---------------------------------------------------------------- the MoE layer
def qwen3_30b(dispatcher: dict, nodes: int = 2, ep: int = 16, layers: int = 2) -> dict:
    """Qwen3-30B-A3B (128 experts, top-8) cut to ``layers`` layers, EP over every GPU."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": layers},
            "parallel": {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1,
                         "moe": {**dispatcher, "grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * nodes,
                      "seq_length": 4096, "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": nodes,
                       "software": {"stack": "megatron-core-2025"}}}


HYBRIDEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "hybridep"}


def _moe_ops(cfg: dict):
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    body = w.classes[0].program.blocks
    return [o.payload for b in body.values() for o in b.flat.ops]


def test_the_layer_issues_one_fused_dispatch_and_combine_per_direction():
    ops = _moe_ops(qwen3_30b(HYBRIDEP))
    a2a = [p for p in ops if isinstance(p, Collective) and p.op == "all_to_all"]
    # forward: dispatch kernel, combine kernel; backward: the combine's gradient runs the
    # dispatch kernel, the dispatch's the combine kernel (fused_a2a.py)
    fwd = [p for p in a2a if p.name.startswith("fwd.")][:2]    # the first layer's
    assert [p.algorithm.split("[")[0] for p in fwd] == ["hybridep_dispatch", "hybridep_combine"]
    bwd = [p for p in a2a if p.name.startswith("bwd.")][:2]
    assert [(p.name, p.algorithm.split("[")[0]) for p in bwd] == [
        ("bwd.combine", "hybridep_dispatch"), ("bwd.dispatch", "hybridep_combine")]
    assert fwd[0].algorithm == "hybridep_dispatch[k=8,E=128,r=1]"
    # the alltoall dispatcher's bytes: T·k·h·2 = 4096 · 8 · 2048 · 2
    assert {p.bytes for p in a2a} == {4096 * 8 * 2048 * 2}
    # no permutation before the dispatch: the passes are the received tokens' (sort/unsort)
    names = [p.name for p in ops if isinstance(p, Compute)]
    assert "fwd.permute" not in names and "fwd.sort" in names and "fwd.unsort" in names


def test_flex_exposes_less_expert_parallel_time_than_alltoall_across_two_nodes():
    a2a = ddlsim.predict(qwen3_30b({"token_dispatcher_type": "alltoall"}), "analytical")
    flex = ddlsim.predict(qwen3_30b(HYBRIDEP), "analytical")
    ep = [r.to_dict()["breakdown"]["exposed_comm_s"]["ep"] for r in (a2a, flex)]
    assert 0 < ep[1] < 0.7 * ep[0]
    cfg = ddlsim.load_config(qwen3_30b(HYBRIDEP))
    assert "MoE flex/hybridep (16 SMs) dispatch" in cfg.family.plan_summary(cfg)


@pytest.mark.parametrize("nodes, ep", [(1, 8), (2, 16), (4, 32)])
def test_the_discrete_event_engine_replays_the_flex_flows(nodes, ep):
    # the same flows, each pair's bytes over the kernel's efficiency on its link, each RDMA
    # pair through its sender's own NIC (Phase.own_rail): the engines agree (one layer, one
    # micro-batch; exposed ep 1.37 / 2.62 / 5.09 ms analytical, the DES within 1 %; until
    # 2026-12-01 the DES striped the RDMA pairs over every NIC of the node, through NVLink,
    # and read up to 14 % more)
    cfg = qwen3_30b(HYBRIDEP, layers=1, nodes=nodes, ep=ep)
    ana, des = (ddlsim.predict(cfg, e).to_dict() for e in ("analytical", "des"))
    ep_a, ep_d = (r["breakdown"]["exposed_comm_s"]["ep"] for r in (ana, des))
    assert ep_d == pytest.approx(ep_a, rel=0.02)
    assert des["iteration_time_s"] == pytest.approx(ana["iteration_time_s"], rel=0.01)


# ---------------------------------------------------------------- refusals
def test_a_backend_without_the_flex_dispatcher_is_refused():
    cfg = qwen3_30b({"token_dispatcher_type": "alltoall", "flex_dispatcher_backend": "deepep"})
    with pytest.raises(ConfigError, match="flex_dispatcher_backend = 'deepep'.*flex"):
        ddlsim.load_config(cfg)


def test_a_hot_rank_with_flex_is_refused_as_not_modelled():
    cfg = qwen3_30b(HYBRIDEP)
    cfg["parallel"]["moe"].update(router_force_load_balancing=False, router_imbalance=2.0)
    with pytest.raises(ConfigError, match="router_imbalance = 2.0 with token_dispatcher_type"):
        ddlsim.load_config(cfg)


def test_an_unknown_backend_names_the_choices():
    cfg = qwen3_30b({"token_dispatcher_type": "flex", "flex_dispatcher_backend": "nccl"})
    with pytest.raises(ConfigError, match="deepep.*hybridep"):
        ddlsim.load_config(cfg)


def test_flex_defaults_to_megatrons_deepep_and_says_where_that_came_from():
    from ddlsim.workloads.decoder.moeplan import resolve_moe
    plan = resolve_moe(ddlsim.load_config(qwen3_30b({"token_dispatcher_type": "flex"})))
    assert plan.flex_backend == "deepep"
    assert "d7288711" in plan.sources["flex_dispatcher_backend"]


@pytest.mark.parametrize("stack, change, rule", [
    ("megatron-core-2024", {}, "no_flex_dispatcher"),          # 900f1b76: allgather, alltoall
    ("deepspeed", {}, "no_flex_dispatcher"),                   # DeepSpeed's _AllToAll only
    ("megatron-core-2025", {"ep": 1, "nodes": 1}, "flex_needs_tp_ep"),   # TP x EP > 1
    ("megatron-core-2025", {"pad": True}, "deepep_no_pad")])
def test_what_the_stacks_code_refuses_is_refused(stack, change, rule):
    cfg = qwen3_30b({"token_dispatcher_type": "flex"}, nodes=change.get("nodes", 2),
                    ep=change.get("ep", 16))
    cfg["system"]["software"] = {"stack": stack}
    if change.get("pad"):
        cfg["model"]["capacity_factor"] = 1.25
        cfg["parallel"]["moe"]["pad_expert_input_to_capacity"] = True
    with pytest.raises(ConfigError, match=f"rule {rule}"):
        ddlsim.load_config(cfg)


def test_hybridep_pads_to_capacity_where_deepep_cannot():
    # Megatron-LM d7288711 _HybridEPManager: drop_and_pad permutes to capacity · p · local
    # experts; the expert GEMMs compute the padded slots, the kernels move the routed tokens
    cfg = qwen3_30b({**HYBRIDEP, "pad_expert_input_to_capacity": True})
    cfg["model"]["capacity_factor"] = 1.25
    ddlsim.load_config(cfg)


# ---------------------------------------------------------------- the importer
def test_megatron_flex_arguments_are_read():
    from ddlsim.importers.megatron import read_megatron
    # Megatron-LM d7288711 (the backend flag) and 9c1a5351 (--moe-enable-deepep)
    new = read_megatron("torchrun pretrain_gpt.py --num-experts 128 --moe-router-topk 8 "
                        "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
                        "hybridep --moe-hybridep-num-sms 16 --expert-model-parallel-size 16",
                        "run.sh")
    assert new.fields["parallel.moe.token_dispatcher_type"] == "flex"
    assert new.fields["parallel.moe.flex_dispatcher_backend"] == "hybridep"
    assert not new.refused
    old = read_megatron("torchrun pretrain_gpt.py --moe-token-dispatcher-type flex "
                        "--moe-enable-deepep", "run.sh")
    assert old.fields["parallel.moe.flex_dispatcher_backend"] == "deepep"
    bad = read_megatron("torchrun pretrain_gpt.py --moe-flex-dispatcher-backend nccl", "run.sh")
    assert bad.refused


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_one_flex_kernel_across_two_nodes_takes_its_closed_form_in_the_des(backend):
    """One dispatch of 16 ranks on two DGX H100s, alone: the DES's flows (the RDMA pairs on
    each sender's own NIC, the NVLink forwarding) end within 2 % of the closed form
    max(RDMA, NVLink) (the latency differs: the DES's path latency, the closed form's α)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "simulator"))
    from scenarios import cost_model, single_collective
    from ddlsim.simulator.analytical.engine import simulate_analytical
    from ddlsim.simulator.collectives.flex import flex_algorithm
    from ddlsim.simulator.des import run_des
    system = ddlsim.load_config(qwen3_30b(HYBRIDEP, layers=1, nodes=2, ep=16)).system
    wl = single_collective("all_to_all", flex_algorithm(backend, "dispatch", 8, 128, 1),
                           134e6, 16)
    a = simulate_analytical(wl, cost_model(system, wl)).timings[0].end
    d = run_des(wl, cost_model(system, wl), record_spans=False)[0].timings[0].end
    assert d == pytest.approx(a, rel=0.02)


# ---------------------------------------------------------------- the flex kernels' SMs
def _overlapped(sms: int | None, overlap: bool = True) -> dict:
    """Qwen3-30B's HybridEP run with the EP overlap (4 micro-batches a replica), its kernels
    holding ``sms`` SMs (None: Megatron-Core's default)."""
    cfg = qwen3_30b({**HYBRIDEP, "overlap_expert_parallel_comm": overlap,
                     "delay_wgrad_compute": False})
    cfg["train"]["global_batch_size"] = 64
    if sms is not None:
        cfg["parallel"]["moe"]["flex_dispatcher_num_sms"] = sms
    return cfg


def test_the_flex_kernels_sms_slow_the_compute_they_overlap_and_nothing_else():
    # Megatron-Bridge's scripts give HybridEP 32 SMs (overrides.py, perf_recipes/_common.py),
    # Megatron-Core's default 16: more SMs held, less left to the overlapped compute
    # (Contention: (k/S)·min(C, G_k)); without the overlap the count changes nothing
    t = {s: ddlsim.predict(_overlapped(s)).iteration_time_s for s in (None, 16, 32, 64)}
    assert t[None] == t[16]                       # the default is Megatron-Core's 16
    assert t[16] < t[32] < t[64]
    off = [ddlsim.predict(_overlapped(s, overlap=False)).iteration_time_s for s in (16, 64)]
    assert off[0] == off[1]


@pytest.mark.parametrize("moe, match", [
    ({"token_dispatcher_type": "alltoall", "flex_dispatcher_num_sms": 32},
     "flex_dispatcher_num_sms = 32 sizes the flex.*token_dispatcher_type = 'alltoall'"),
    ({**HYBRIDEP, "flex_dispatcher_num_sms": 4}, "= 4 with the hybridep backend.*from 8 SMs"),
    ({"token_dispatcher_type": "flex", "flex_dispatcher_num_sms": 16},
     "= 16 with the deepep backend.*from 20 SMs"),
    ({**HYBRIDEP, "flex_dispatcher_num_sms": 132}, "every SM.*132.*fewer than 132"),
    ({**HYBRIDEP, "flex_dispatcher_num_sms": True}, "flex_dispatcher_num_sms")])
def test_an_sm_count_the_model_cannot_honour_is_refused(moe, match):
    with pytest.raises(ConfigError, match=match):
        ddlsim.load_config(qwen3_30b(moe))


def test_megatron_sm_count_arguments_set_the_field():
    from ddlsim.importers.megatron import read_megatron
    base = "torchrun pretrain_gpt.py --moe-token-dispatcher-type flex "
    for flag in ("moe-flex-dispatcher-num-sms", "moe-hybridep-num-sms", "moe-deepep-num-sms"):
        draft = read_megatron(base + f"--{flag} 32", "run.sh")
        assert draft.fields["parallel.moe.flex_dispatcher_num_sms"] == 32 and not draft.refused
    both = read_megatron(base + "--moe-deepep-num-sms 24 --moe-hybridep-num-sms 32", "run.sh")
    assert both.refused      # Megatron-LM d98e8a64 raises on conflicting deprecated counts

"""Group-limited (node-limited) routing, DeepSeek-V2/V3's: the expected nodes and GPUs one token
reaches, against every routing enumerated and a seeded Monte Carlo of the rule; the flex
dispatcher's traffic under it; what it leaves alone (the alltoall dispatcher's bytes, models
without groups); the layouts refused; the plan line; and the config.json reading
(docs/moe.md, "Group-limited routing")."""

from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np
import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.collectives.flex import flex_algorithm, flex_traffic, hit_probability
from ddlsim.workloads.models.hf_router import router_groups
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


# ---------------------------------------------------------------- the expectation
def _enumerated(experts: int, groups: int, topk_groups: int, top_k: int,
                held: int) -> float:
    """Exact mean over every routing the rule allows, each group choice equally likely and,
    inside it, every top-k subset of the chosen groups' experts: P(a token reaches the
    ``held`` consecutive experts starting at 0)."""
    m = experts // groups
    hits = total = 0.0
    for chosen in combinations(range(groups), topk_groups):
        pool = [g * m + i for g in chosen for i in range(m)]
        picks = list(combinations(pool, top_k))
        hits += sum(any(e < held for e in pick) for pick in picks) / len(picks)
        total += 1
    return hits / total


@pytest.mark.parametrize("experts, groups, topk_groups, top_k, held", [
    (12, 4, 2, 3, 3), (12, 4, 2, 3, 6), (12, 4, 2, 3, 1), (16, 4, 1, 2, 8), (16, 8, 3, 4, 2),
    (16, 8, 3, 4, 4), (12, 3, 3, 2, 4)])
def test_the_closed_form_is_every_allowed_routing_enumerated(experts, groups, topk_groups,
                                                             top_k, held):
    assert hit_probability(experts, held, top_k, groups, topk_groups) == pytest.approx(
        _enumerated(experts, groups, topk_groups, top_k, held), rel=1e-12)


def _monte_carlo(experts: int, groups: int, topk_groups: int, top_k: int, per_node: int,
                 per_gpu: int, samples: int = 100_000) -> tuple[np.ndarray, np.ndarray]:
    """Distinct nodes and GPUs each of ``samples`` tokens reaches, routed by the rule (a
    uniform set of groups, then a uniform top-k of their experts), seed 0."""
    rng = np.random.default_rng(0)
    m = experts // groups
    chosen = np.argsort(rng.random((samples, groups)), axis=1)[:, :topk_groups]
    slot = np.argsort(rng.random((samples, topk_groups * m)), axis=1)[:, :top_k]
    expert = np.take_along_axis(chosen, slot // m, axis=1) * m + slot % m

    def distinct(block: int) -> np.ndarray:
        owner = np.sort(expert // block, axis=1)
        return 1 + (np.diff(owner, axis=1) != 0).sum(axis=1)

    return distinct(per_node), distinct(per_gpu)


@pytest.mark.parametrize("experts, groups, topk_groups, top_k, p, g", [
    (256, 8, 4, 8, 64, 8),     # DeepSeek-V3, EP64 over 8 nodes: one group per node
    (256, 8, 4, 8, 128, 8),    # EP128 over 16 nodes: a group spans 2 nodes
    (256, 8, 4, 8, 32, 8),     # EP32 over 4 nodes: 2 groups per node
    (160, 8, 3, 6, 32, 8),     # DeepSeek-V2, EP32 over 4 nodes: 2 groups per node
    (160, 8, 3, 6, 8, 8)])     # EP inside one node: 20 experts per GPU, one group each
def test_expected_nodes_and_gpus_match_a_seeded_monte_carlo(experts, groups, topk_groups,
                                                            top_k, p, g):
    per_gpu = experts // p
    nodes, gpus = _monte_carlo(experts, groups, topk_groups, top_k, g * per_gpu, per_gpu)
    t = flex_traffic(1.0, experts, top_k, 1, p, g, groups, topk_groups)
    expected_nodes = p // g * t.q_node
    for sample, expected in ((nodes, expected_nodes), (gpus, t.nvl_bytes)):
        error = sample.std() / np.sqrt(sample.size)
        assert abs(sample.mean() - expected) <= 4 * error + 1e-12
    assert nodes.max() <= max(1, topk_groups * max(1, (experts // groups) // (g * per_gpu)))


def test_without_a_group_limit_it_is_the_uniform_form():
    # one group, or every group allowed: 1 − C(E−e, k)/C(E, k)
    uniform = 1 - comb(256 - 32, 8) / comb(256, 8)
    assert hit_probability(256, 32, 8) == pytest.approx(uniform, rel=1e-15)
    assert hit_probability(256, 32, 8, 8, 8) == pytest.approx(uniform, rel=1e-15)
    assert hit_probability(256, 32, 8, 1, 1) == pytest.approx(uniform, rel=1e-15)


def test_deepseek_v3_on_eight_nodes_reaches_at_most_four_and_fewer_than_uniform():
    # EP64, 8 per node: node = one group of 32; P(node) = 4/8 · (1 − C(96,8)/C(128,8))
    t = flex_traffic(1.0, 256, 8, 1, 64, 8, 8, 4)
    assert t.q_node == pytest.approx(0.5 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-14)
    uniform = flex_traffic(1.0, 256, 8, 1, 64, 8)
    assert 8 * t.q_node < 4 < 8 * uniform.q_node
    assert t.rdma_bytes < 0.75 * uniform.rdma_bytes and t.nvl_bytes < uniform.nvl_bytes


# ---------------------------------------------------------------- refused layouts
def test_experts_that_straddle_a_group_boundary_are_refused_by_name():
    # 160 experts in groups of 20; 16 per node crosses every other boundary
    with pytest.raises(ValueError, match="neither fill whole groups of 20 experts nor lie "
                                         "inside one"):
        hit_probability(160, 16, 6, 8, 3)
    with pytest.raises(ValueError, match="neither fill whole groups"):
        flex_traffic(1.0, 160, 6, 1, 80, 8, 8, 3)
    with pytest.raises(ValueError, match="top_k = 9 exceeds the 8 experts"):
        hit_probability(16, 4, 9, 8, 4)
    with pytest.raises(ValueError, match="groups dividing the experts"):
        hit_probability(16, 4, 2, 3, 1)


# ---------------------------------------------------------------- the MoE layer
def qwen3_30b(moe: dict, nodes: int = 4, ep: int = 32, layers: int = 2) -> dict:
    """Qwen3-30B-A3B (128 experts, top-8) cut to ``layers`` layers, EP over every GPU, with
    the routing's groups given in ``moe`` as Megatron-LM's --moe-router-* arguments."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": layers},
            "parallel": {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1,
                         "moe": {"grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True, **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * nodes,
                      "seq_length": 4096, "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": nodes,
                       "software": {"stack": "megatron-core-2025"}}}


FLEX = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}
GROUPS = {"router_num_groups": 8, "router_group_topk": 2}


def _collectives(cfg: dict) -> list[Collective]:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o.payload for b in w.classes[0].program.blocks.values() for o in b.flat.ops
            if isinstance(o.payload, Collective) and o.payload.op == "all_to_all"]


def _ep_exposed(cfg: dict) -> float:
    return ddlsim.predict(cfg, "analytical").to_dict()["breakdown"]["exposed_comm_s"]["ep"]


def test_flex_traffic_drops_on_a_multi_node_ep_under_group_limited_routing():
    # 4 nodes of 32 experts (2 groups of 16 each); a token's 8 experts in 2 of the 8 groups
    ops = _collectives(qwen3_30b({**FLEX, **GROUPS}))
    assert {p.algorithm for p in ops if p.name == "fwd.dispatch"} == {
        "deepep_dispatch[k=8,E=128,r=1,G=8,M=2]"}
    before, after = _ep_exposed(qwen3_30b(FLEX)), _ep_exposed(qwen3_30b({**FLEX, **GROUPS}))
    assert 0 < after < 0.8 * before


def test_the_alltoall_dispatcher_is_unchanged_every_expert_keeps_its_tokens():
    # each expert is picked with probability (M/G)·k/(M·m) = k/E: the per-destination bytes
    # and each expert's tokens are uniform routing's
    cfg = {"token_dispatcher_type": "alltoall"}
    plain, grouped = qwen3_30b(cfg), qwen3_30b({**cfg, **GROUPS})
    assert [(p.name, p.bytes, p.split_bytes) for p in _collectives(plain)] == \
        [(p.name, p.bytes, p.split_bytes) for p in _collectives(grouped)]
    assert ddlsim.predict(grouped, "analytical").iteration_time_s == \
        ddlsim.predict(plain, "analytical").iteration_time_s


@pytest.mark.parametrize("moe", [{}, {"router_num_groups": 1, "router_group_topk": 1},
                                 {"router_num_groups": 8, "router_group_topk": 8}])
def test_without_a_group_limit_the_flex_trace_and_time_are_unchanged(moe):
    cfg = qwen3_30b({**FLEX, **moe})
    assert {p.algorithm for p in _collectives(cfg) if p.name == "fwd.dispatch"} == {
        "deepep_dispatch[k=8,E=128,r=1]"}
    assert ddlsim.predict(cfg, "analytical").iteration_time_s == \
        ddlsim.predict(qwen3_30b(FLEX), "analytical").iteration_time_s


def test_the_plan_line_and_json_name_the_routing():
    cfg = ddlsim.load_config(qwen3_30b({**FLEX, **GROUPS}))
    assert "group-limited 2 of 8 groups" in cfg.family.plan_summary(cfg)
    plan = ddlsim.predict(qwen3_30b({**FLEX, **GROUPS}), "analytical").to_dict()["plan"]
    assert plan["moe"]["routing"].endswith("group-limited 2 of 8 groups")
    plain = ddlsim.load_config(qwen3_30b(FLEX))
    assert "group-limited" not in plain.family.plan_summary(plain)


@pytest.mark.parametrize("moe, match", [
    ({"router_num_groups": 8}, "needs both"),
    ({"router_num_groups": 6, "router_group_topk": 2}, "groups dividing the experts"),
    ({"router_num_groups": 32, "router_group_topk": 1}, "top-k at most")])
def test_bad_groups_are_refused_naming_the_fields(moe, match):
    with pytest.raises(ConfigError, match=match):
        ddlsim.load_config(qwen3_30b({**FLEX, **moe}))


def test_a_flex_layout_that_straddles_the_groups_is_refused_by_name():
    # 96 experts over EP32: 3 consecutive experts per rank; groups of 12 and of 6 hold whole
    # ranks (nested), groups of 4 (24 groups) cut across them
    cfg = qwen3_30b({**FLEX, "router_num_groups": 8, "router_group_topk": 2})
    cfg["model"]["num_local_experts"] = 96
    ddlsim.load_config(cfg)
    cfg["parallel"]["moe"]["router_num_groups"] = 16
    ddlsim.load_config(cfg)
    cfg["parallel"]["moe"].update(router_num_groups=24, router_group_topk=4)
    with pytest.raises(ConfigError, match="holds 3 consecutive experts, which neither fill "
                                          "whole groups of 4 nor lie inside one"):
        ddlsim.load_config(cfg)
    cfg["parallel"]["moe"]["token_dispatcher_type"] = "alltoall"    # bytes per copy: any
    del cfg["parallel"]["moe"]["flex_dispatcher_backend"]
    ddlsim.load_config(cfg)


def test_a_node_that_straddles_the_groups_is_refused_when_the_dispatch_is_timed():
    # 96 experts in groups of 12 over EP24 on 3 nodes: 4 per rank (inside a group), 32 per
    # node, which cuts across the groups
    cfg = qwen3_30b({**FLEX, **GROUPS}, nodes=3, ep=24)
    cfg["model"]["num_local_experts"] = 96
    with pytest.raises(ConfigError, match=r"deepep_dispatch\[k=8,E=96,r=1,G=8,M=2\] on 24 "
                                          r"ranks, 8 per node: group-limited routing: 32 "
                                          r"consecutive experts on one node"):
        ddlsim.predict(cfg, "analytical")


# ---------------------------------------------------------------- config.json
def _deepseek(**keys) -> dict:
    base = dict(model_type="deepseek_v2", n_routed_experts=160, num_experts_per_tok=6,
                n_group=8, topk_group=3, topk_method="group_limited_greedy")
    return {**base, **keys}


def test_router_groups_are_read_where_the_router_limits_them():
    assert router_groups(_deepseek(), "v2") == (8, 3)
    assert router_groups(_deepseek(topk_method="greedy"), "v2") is None   # V2-Lite's rule
    assert router_groups(_deepseek(n_group=1, topk_group=1), "v2") is None
    assert router_groups(_deepseek(topk_group=8), "v2") is None            # every group
    v3 = _deepseek(model_type="deepseek_v3", n_routed_experts=256, num_experts_per_tok=8,
                   topk_group=4, topk_method="noaux_tc")
    assert router_groups(v3, "v3") == (8, 4)
    assert router_groups({"model_type": "qwen3_moe", "n_group": 8, "topk_group": 4}, "q") \
        is None


@pytest.mark.parametrize("keys, match", [
    (dict(n_group=7), "n_group = 7 is not allowed; a divisor of n_routed_experts = 160"),
    (dict(topk_group=9), "topk_group = 9 is not allowed; between 1 and n_group = 8"),
    (dict(n_group=80, topk_group=2), "topk_group = 2 is not allowed; .* at least "
                                     "num_experts_per_tok = 6"),
    (dict(topk_group=True), "topk_group = True is not allowed")])
def test_bad_router_groups_in_config_json_are_refused(keys, match):
    with pytest.raises(ConfigError, match=match):
        router_groups(_deepseek(**keys), "v2")


def test_the_flex_algorithm_name_carries_the_groups_only_when_they_limit():
    assert flex_algorithm("deepep", "combine", 8, 256, 1, 8, 4) == \
        "deepep_combine[k=8,E=256,r=1,G=8,M=4]"
    assert flex_algorithm("deepep", "combine", 8, 256, 1, 8, 8) == "deepep_combine[k=8,E=256,r=1]"

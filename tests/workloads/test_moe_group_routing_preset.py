"""Group-limited routing read from the models' config.json (DeepSeek-V3's n_group 8, topk_group 4;
DeepSeek-V2's 8 and 3): the model section carries them, parallel.moe's router_num_groups and
router_group_topk default to them, the plan names them, the flex dispatcher's traffic follows,
and a model without a group limit (DeepSeek-V2-Lite, greedy over one group) has none
(docs/moe.md, "Group-limited routing")."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def deepseek(model: str, moe: dict, ep: int = 32, nodes: int = 4) -> dict:
    """``model`` cut to 4 layers (the first dense), EP over every GPU of ``nodes`` DGX H100s."""
    return {"model": {"preset": model, "num_hidden_layers": 4},
            "parallel": {"expert_model_parallel_size": ep,
                         "moe": {"grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True, **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * nodes,
                      "seq_length": 4096, "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": nodes,
                       "software": {"stack": "megatron-core-2025"}}}


FLEX = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}


def _dispatch_algorithms(cfg: dict) -> set[str]:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return {o.payload.algorithm for b in w.classes[0].program.blocks.values()
            for o in b.flat.ops
            if isinstance(o.payload, Collective) and o.payload.name == "fwd.dispatch"}


@pytest.mark.parametrize("model, groups, phrase", [
    ("deepseek-v3", (8, 4), "group-limited 4 of 8 groups"),
    ("deepseek-v2", (8, 3), "group-limited 3 of 8 groups")])
def test_the_model_s_groups_are_the_plan_s_default(model, groups, phrase):
    cfg = ddlsim.load_config(deepseek(model, FLEX))
    assert (cfg.model.n_group, cfg.model.topk_group) == groups
    assert phrase in cfg.family.plan_summary(cfg)
    plan = cfg.family.moe_plan(cfg)
    assert plan.sources["router_groups"] == "model.n_group, model.topk_group"


def test_deepseek_v3_flex_traffic_and_exposed_ep_drop_against_uniform_routing():
    # 4 nodes of 64 experts (2 groups each); uniform routing given explicitly: 8 of 8 groups
    grouped, uniform = deepseek("deepseek-v3", FLEX), deepseek(
        "deepseek-v3", {**FLEX, "router_num_groups": 8, "router_group_topk": 8})
    assert _dispatch_algorithms(grouped) == {"deepep_dispatch[k=8,E=256,r=1,G=8,M=4]"}
    assert _dispatch_algorithms(uniform) == {"deepep_dispatch[k=8,E=256,r=1]"}
    ep = [ddlsim.predict(c, "analytical", check_fit=False).to_dict()["breakdown"]
          ["exposed_comm_s"]["ep"] for c in (uniform, grouped)]   # 82 GiB at ZeRO 0: no matter
    assert 0 < ep[1] < ep[0]


def test_deepseek_v2_lite_routes_over_all_experts():
    cfg = ddlsim.load_config(deepseek("deepseek-v2-lite", FLEX, ep=16, nodes=2))
    assert cfg.model.n_group is None
    assert "group-limited" not in cfg.family.plan_summary(cfg)


def test_parallel_moe_overrides_the_model_s_groups():
    cfg = ddlsim.load_config(deepseek("deepseek-v2", {**FLEX, "router_num_groups": 8,
                                                      "router_group_topk": 2}))
    assert "group-limited 2 of 8 groups" in cfg.family.plan_summary(cfg)
    assert cfg.family.moe_plan(cfg).sources["router_groups"].startswith("parallel.moe")


def test_deepseek_v2_on_ranks_that_straddle_its_groups_is_refused_with_flex():
    # 160 experts in groups of 20: EP16 gives 10 per rank (inside one group), EP32 5, both
    # nested; with 40 groups of 4, EP32's 5 per rank straddle them
    ddlsim.load_config(deepseek("deepseek-v2", FLEX, ep=16, nodes=2))
    cfg = deepseek("deepseek-v2", {**FLEX, "router_num_groups": 40, "router_group_topk": 8})
    with pytest.raises(ConfigError, match="holds 5 consecutive experts, which neither fill "
                                          "whole groups of 4"):
        ddlsim.load_config(cfg)

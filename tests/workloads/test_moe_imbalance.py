"""Dropless MoE routing is not silently balanced (issues 28/29): when nobody gives
``parallel.moe.router_imbalance`` and the router is not forced to balance, ddlsim times the
hottest expert-parallel rank at the mean (1) as an assumption, because no published
measurement gives a default (docs/moe.md, "Load imbalance under dropless routing"), and says
so on the plan line and in the JSON result's ``plan.moe.routing``. A given imbalance wins;
forced balance derives the hottest rank of its random routing (and says so); a capacity factor
reads as before."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.planinfo import plan_fields
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Mixtral 8x7B cut to 2 layers, EP8 on one DGX H100, Megatron-Core of 2025, dropless
#: (its config.json has no capacity factor), routing left to the defaults
MOE = {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}

ASSUMED = "dropless, balanced (router_imbalance 1, assumed: no measured default)"


def load(moe: dict | None = None, model: dict | None = None) -> ddlsim.RunConfig:
    d = copy.deepcopy(MOE)
    d["parallel"]["moe"].update(moe or {})
    d["model"].update(model or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def line(cfg: ddlsim.RunConfig) -> str:
    return cfg.family.plan_summary(cfg)


def test_unset_dropless_names_the_balance_it_assumes():
    cfg = load()
    plan = resolve_moe(cfg)
    assert (plan.imbalance, plan.imbalance_basis) == (1.0, "assumed")
    assert line(cfg).endswith(f"ETP1, {ASSUMED}")
    moe = plan_fields(cfg)["moe"]
    assert moe["routing"] == ASSUMED and moe["router_imbalance"] == 1.0


def test_the_json_result_names_it():
    result = ddlsim.predict(load())
    assert result.to_dict()["plan"]["moe"]["routing"] == ASSUMED


@pytest.mark.parametrize("given, phrase", [
    (1.0, ", dropless"),                          # a 1 given is the user's, not assumed
    (1.5, ", dropless, hot EP rank ×1.5"),
])
def test_a_given_imbalance_wins(given, phrase):
    cfg = load({"router_imbalance": given})
    plan = resolve_moe(cfg)
    assert (plan.imbalance, plan.imbalance_basis) == (given, "given")
    assert line(cfg).endswith(phrase) and "assumed" not in line(cfg)
    assert plan_fields(cfg)["moe"]["routing"] == "dropless"


FORCED = ("dropless, forced balance (router_imbalance 1.02, the hottest of EP8 ranks under "
          "top-k sampling of random logits)")


def test_forced_balance_derives_the_hottest_rank_of_random_routing():
    """Random logits route each token to a uniform top-2 of 8 experts: balanced in
    expectation, but the 8 ranks of 16,384 routed tokens (8 × 2,048) are not all at the mean,
    and the hottest sets the layer: 1 + e(8)·sqrt(8·6/(7·16384·2)) = 1.0206."""
    from ddlsim.workloads.decoder.moe_balance import expected_max_normal
    cfg = load({"router_force_load_balancing": True})
    plan = resolve_moe(cfg)
    hand = 1 + expected_max_normal(8) * (8 * 6 / (7 * 16384 * 2)) ** 0.5
    assert plan.imbalance_basis == "forced"
    assert plan.imbalance == pytest.approx(hand, rel=1e-12) and plan.imbalance > 1.02
    assert line(cfg).endswith(f"ETP1, {FORCED}")
    assert plan_fields(cfg)["moe"]["routing"] == FORCED
    given = load({"router_force_load_balancing": True, "router_imbalance": 1.0})
    assert line(given).endswith("ETP1, dropless, forced balance")   # the user's 1, named
    balanced = ddlsim.predict(given).iteration_time_s
    assert ddlsim.predict(cfg).iteration_time_s > balanced   # a 1 given still times as 1


def test_forced_balance_on_one_expert_parallel_rank_has_no_hot_rank():
    d = copy.deepcopy(MOE)
    d["parallel"]["expert_model_parallel_size"] = 1
    d["parallel"]["moe"]["router_force_load_balancing"] = True
    d["system"]["nodes"], d["train"]["global_batch_size"] = 1, 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(d)
    plan = resolve_moe(cfg)
    assert (plan.imbalance, plan.imbalance_basis) == (1.0, "forced")
    assert line(cfg).endswith("ETP1, dropless, forced balance")


def test_forced_balance_with_group_limited_routing_is_a_lower_bound_and_says_so():
    """Groups picked first correlate the ranks of a group, which spreads the loads further
    than the exchangeable closed form: the same ρ, named a lower bound."""
    plain = resolve_moe(load({"router_force_load_balancing": True}))
    cfg = load({"router_force_load_balancing": True, "router_num_groups": 4,
                "router_group_topk": 2})
    plan = resolve_moe(cfg)
    assert (plan.imbalance, plan.imbalance_basis) == (plain.imbalance, "forced")
    assert ("ranks under top-k sampling of random logits, a lower bound under group-limited "
            "routing), group-limited 2 of 4 groups") in line(cfg)


@pytest.mark.parametrize("pad, phrase", [(False, "capacity 1.25"),
                                         (True, "capacity 1.25, padded")])
def test_a_capacity_factor_reads_as_before(pad, phrase):
    cfg = load({"pad_expert_input_to_capacity": pad}, {"capacity_factor": 1.25})
    assert line(cfg).endswith(f"ETP1, {phrase}")
    assert plan_fields(cfg)["moe"]["routing"] == phrase


def test_the_assumption_is_the_value_one_not_a_cost():
    """Naming the assumption moves no time: unset times as a given 1 does."""
    assumed = ddlsim.predict(load()).iteration_time_s
    assert assumed == ddlsim.predict(load({"router_imbalance": 1.0})).iteration_time_s
    assert ddlsim.predict(load({"router_imbalance": 2.0})).iteration_time_s > assumed


@pytest.mark.parametrize("value", [0.5, True])
def test_a_bad_imbalance_names_the_field(value):
    with pytest.raises(ConfigError, match="router_imbalance"):
        load({"router_imbalance": value})

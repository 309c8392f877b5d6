"""Auxiliary-loss-free (expert-bias) balancing as a plan option: ``parallel.moe.
router_enable_expert_bias`` with its score function and update rate, Megatron-Core's rules on
them, the hot rank's load derived from Wang et al.'s Loss-Free MaxVio_global 0.04, and
DeepSeek's config.json balancing keys read by ``hf_router.router_balancing`` (issues 28, 29)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.planinfo import plan_fields
from ddlsim.workloads.decoder import moe_balance as mb
from ddlsim.workloads.decoder.moeplan import resolve_moe
from ddlsim.workloads.models.hf_router import router_balancing

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Qwen3-30B-A3B cut to 2 layers, EP 8 on one DGX H100, dropless, with a sigmoid router and
#: the expert bias (Megatron-LM's --moe-router-score-function sigmoid
#: --moe-router-enable-expert-bias)
MOE = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                            "router_score_function": "sigmoid",
                            "router_enable_expert_bias": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}


def load(moe: dict | None = None, drop: tuple[str, ...] = ()) -> ddlsim.RunConfig:
    d = copy.deepcopy(MOE)
    d["parallel"]["moe"].update(moe or {})
    for key in drop:
        del d["parallel"]["moe"][key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


# ------------------------------------------------------------------ the statistic
def test_the_loss_free_statistic_is_the_published_one():
    """arXiv:2408.15664 Table 2: Loss-Free MaxVio_global 0.04 (1B and 3B); §4.1: u = 0.001."""
    assert mb.MAXVIO_GLOBAL_BIAS == 0.04 and mb.SOURCE_BIAS_RATE == 1e-3
    assert mb.expert_dispersion(0.04) == pytest.approx(0.04 / mb.expected_max_normal(64))


def test_the_bias_formula_by_hand():
    """Qwen3-30B at EP 8 (128 experts, top-8), 32,768 routed tokens, c = 0.04/e(64):
    1 + e(8)·sqrt(8·(c²/128 + 120/(127·32768·8))) = 1.0098, against 1.079 under the loss."""
    c, e8 = 0.04 / mb.expected_max_normal(64), mb.expected_max_normal(8)
    hand = 1 + e8 * math.sqrt(8 * (c * c / 128 + 120 / (127 * 32768 * 8)))
    got = mb.hot_rank_load(128, 8, 8, 32768, mb.MAXVIO_GLOBAL_BIAS)
    assert got == pytest.approx(hand, rel=1e-12) and got == pytest.approx(1.0098, abs=1e-4)
    assert 1 < got < mb.hot_rank_load(128, 8, 8, 32768)


@pytest.mark.parametrize("rate, balancing, coeff, applies", [
    (1e-3, "aux_loss", 0.0, True),              # Megatron's default: no loss beside it
    (1e-3, "seq_aux_loss", 1e-4, True),         # DeepSeek-V3's: the bias governs
    (1e-3, "aux_loss", 1e-3, True),
    (1e-3, "none", 0.0, True),
    (1e-3, "aux_loss", 1e-2, False),            # a stronger loss than either source's
    (1e-2, "aux_loss", 0.0, False),             # another rate than the source's
    (1e-3, "sinkhorn", 0.0, False)])
def test_the_bias_statistic_applies_where_its_source_bounds_the_router(rate, balancing, coeff,
                                                                       applies):
    assert mb.bias_applies(rate, balancing, coeff) is applies


# ------------------------------------------------------------------ the plan
def test_the_expert_bias_derives_the_hot_rank_and_names_it():
    cfg = load()
    plan = resolve_moe(cfg)
    expected = mb.hot_rank_load(128, 8, 8, 8 * 4096, mb.MAXVIO_GLOBAL_BIAS)
    assert plan.expert_bias and plan.bias_update_rate == 1e-3
    assert (plan.imbalance, plan.imbalance_basis) == (pytest.approx(expected), "derived")
    phrase = (f"dropless, expert-bias router (router_imbalance {expected:.3g}, a lower bound "
              f"derived from {mb.SOURCE_BIAS})")
    assert plan_fields(cfg)["moe"]["routing"] == phrase
    assert plan_fields(cfg)["moe"]["router_imbalance"] == pytest.approx(expected)
    assert cfg.family.plan_summary(cfg).endswith(f"ETP1, {phrase}, sigmoid scores")


def test_a_small_sequence_loss_beside_the_bias_leaves_the_bias_governing():
    """DeepSeek-V3's recipe: seq_aux_loss with α = 1e-4 and the bias (arXiv:2412.19437
    §2.1.2, §4.2): the bias's statistic, the loss's kernels, the plan line says both."""
    cfg = load({"router_load_balancing_type": "seq_aux_loss", "aux_loss_coeff": 1e-4})
    plan = resolve_moe(cfg)
    assert plan.imbalance == pytest.approx(resolve_moe(load()).imbalance)
    assert plan.aux_loss and plan.imbalance_basis == "derived"
    assert cfg.family.plan_summary(cfg).endswith("sigmoid scores, seq aux loss 0.0001")


@pytest.mark.parametrize("moe, basis", [
    ({"router_bias_update_rate": 1e-2}, "assumed"),     # not the source's rate
    ({"aux_loss_coeff": 1e-2}, "assumed"),              # a stronger loss beside it
    ({"router_force_load_balancing": True}, "forced"),
    ({"router_imbalance": 1.5}, "given")])
def test_other_rates_losses_forced_and_given_keep_their_basis(moe, basis):
    plan = resolve_moe(load(moe))
    assert plan.imbalance_basis == basis
    forced = mb.random_routing_load(128, 8, 8, 8 * 4096)   # random logits: sampling alone
    assert plan.imbalance == {"given": 1.5, "forced": forced}.get(basis, 1.0)


def test_the_bias_is_off_by_default_and_costs_time_only_through_the_hot_rank():
    """Megatron's default is off (transformer_config.py line 816); with it on, ρ given as the
    derived value predicts the same time as the derived default, and ρ = 1 less."""
    off = resolve_moe(load(drop=("router_enable_expert_bias",)))
    assert not off.expert_bias and off.imbalance_basis == "assumed"
    rho = resolve_moe(load()).imbalance
    derived = ddlsim.predict(load()).iteration_time_s
    given = ddlsim.predict(load({"router_imbalance": rho})).iteration_time_s
    balanced = ddlsim.predict(load({"router_imbalance": 1.0})).iteration_time_s
    assert derived == pytest.approx(given, rel=1e-12) and derived > balanced


# ------------------------------------------------------------------ Megatron-Core's rules
@pytest.mark.parametrize("moe, drop, match", [
    ({}, ("router_score_function",),
     r"router_enable_expert_bias = true .* router_score_function = 'softmax' .*sigmoid or "
     r"sqrtsoftplus"),
    ({"router_score_function": "softmax"}, (), r"needs the sigmoid or sqrtsoftplus"),
    ({"router_load_balancing_type": "sinkhorn"}, (), r"sinkhorn routing ignores the expert bias"),
    ({"router_enable_expert_bias": False, "router_bias_update_rate": 1e-3}, (),
     r"router_bias_update_rate = 0.001 without expert bias"),
    ({"router_bias_update_rate": 0}, (), r"router_bias_update_rate"),
    ({"router_bias_update_rate": True}, (), r"router_bias_update_rate"),
    ({"router_enable_expert_bias": "yes"}, (), r"router_enable_expert_bias"),
    ({"router_score_function": "tanh"}, (), r"router_score_function")])
def test_megatron_core_refuses_what_it_refuses(moe, drop, match):
    with pytest.raises(ConfigError, match=match):
        load(moe, drop)


def test_sqrtsoftplus_takes_the_bias_too():
    """d98e8a64 transformer_config.py lines 2617-2625: sigmoid or sqrtsoftplus."""
    assert resolve_moe(load({"router_score_function": "sqrtsoftplus"})).expert_bias


# ------------------------------------------------------------------ DeepSeek's config.json
def _doc(model_type: str, **keys) -> dict:
    return dict(model_type=model_type, n_routed_experts=64, num_experts_per_tok=6, **keys)


def test_deepseek_v3_routes_with_the_bias_and_a_sequence_loss():
    """The published V3 file (ddlsim/data/hf/deepseek-v3.json): noaux_tc, sigmoid, seq_aux,
    aux_loss_alpha 0.001 (the report's 1e-4: the same kernels, the bias governs)."""
    import json
    from importlib.resources import files
    doc = json.loads(files("ddlsim.data.hf").joinpath("deepseek-v3.json").read_text())
    assert router_balancing(doc, "v3") == {"scoring_func": "sigmoid", "topk_method": "noaux_tc",
                                           "router_aux_loss_coef": 0.001, "seq_aux": True}


@pytest.mark.parametrize("keys, expected", [
    (dict(topk_method="group_limited_greedy", scoring_func="softmax", seq_aux=True,
          aux_loss_alpha=0.001),                                         # DeepSeek-V2
     {"scoring_func": "softmax", "topk_method": "group_limited_greedy",
      "router_aux_loss_coef": 0.001, "seq_aux": True}),
    (dict(topk_method="greedy", aux_loss_alpha=0.0),                     # no loss: no seq_aux
     {"scoring_func": "softmax", "topk_method": "greedy"}),
    ({}, {"scoring_func": "softmax", "topk_method": "greedy"})])         # remote code defaults
def test_deepseek_v2_keys(keys, expected):
    assert router_balancing(_doc("deepseek_v2", **keys), "v2") == expected


def test_other_model_types_have_no_deepseek_balancing():
    assert router_balancing(dict(model_type="mixtral", num_local_experts=8,
                                 num_experts_per_tok=2, scoring_func="sigmoid"), "m") == {}


@pytest.mark.parametrize("key, value", [("topk_method", "noaux"), ("scoring_func", "tanh"),
                                        ("aux_loss_alpha", -1), ("aux_loss_alpha", True),
                                        ("seq_aux", "yes")])
def test_bad_deepseek_balancing_keys_are_refused_by_name(key, value):
    keys = {"aux_loss_alpha": 0.001, key: value}
    with pytest.raises(ConfigError, match=rf"{key} = {value!r} is not allowed"):
        router_balancing(_doc("deepseek_v2", **keys), "v2")


def test_capacity_routing_names_the_bias_and_keeps_its_load():
    """Megatron-Core drops tokens after the bias's top-k (router.py routing lines 792-800): the
    capacity bounds the hot rank as before; the phrase names the router."""
    d = copy.deepcopy(MOE)
    d["model"]["capacity_factor"] = 1.25
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = resolve_moe(ddlsim.load_config(d))
    assert plan.routing_phrase() == "capacity 1.25, expert-bias router"
    assert (plan.load, plan.imbalance_basis) == (1.0, "assumed")


def test_flex_takes_the_bias_default_with_its_traffic_at_the_mean():
    cfg = load({"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"})
    plan = resolve_moe(cfg)
    assert plan.imbalance_basis == "derived" and plan.expert_bias
    assert plan.routing_phrase().endswith("top-k sampling, flex traffic at the mean)")
    assert ddlsim.predict(cfg).iteration_time_s > 0

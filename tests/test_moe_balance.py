"""The hottest expert-parallel rank's load under dropless auxiliary-loss routing
(``ddlsim/workloads/decoder/moe_balance.py``): the closed form against the order statistics it
uses and a seeded simulation of the model it states, and ``router_imbalance``'s default where a
plan leaves it unset (issues 28, 29)."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.planinfo import plan_fields
from ddlsim.workloads.decoder import moe_balance as mb
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


# ------------------------------------------------------------------ the closed form
@pytest.mark.parametrize("n, exact", [(1, 0.0), (2, 1 / math.sqrt(math.pi)),
                                      (3, 1.5 / math.sqrt(math.pi))])
def test_expected_max_of_normals_is_the_order_statistic(n, exact):
    """e(2) = 1/√π, e(3) = 3/(2√π) (David and Nagaraja, Order Statistics, §3.1)."""
    assert mb.expected_max_normal(n) == pytest.approx(exact, abs=1e-9)


@pytest.mark.parametrize("n", [8, 16, 32, 64, 256])
def test_expected_max_agrees_with_the_tail_integral(n):
    """An independent form of the same expectation, by scipy's adaptive quadrature:
    ``E[max] = ∫₀^∞ (1 − Φ(x)ⁿ) dx − ∫_{−∞}^0 Φ(x)ⁿ dx`` (e(8) = 1.4236, e(16) = 1.7660)."""
    from scipy.integrate import quad
    from scipy.stats import norm
    upper = quad(lambda x: 1 - norm.cdf(x) ** n, 0, np.inf)[0]
    lower = quad(lambda x: norm.cdf(x) ** n, -np.inf, 0)[0]
    assert mb.expected_max_normal(n) == pytest.approx(upper - lower, abs=1e-7)


def test_the_dispersion_is_the_published_maxvio_over_e64():
    assert mb.MAXVIO_GLOBAL == 0.52 and mb.SOURCE_EXPERTS == 64
    assert mb.expert_dispersion() == pytest.approx(0.52 / mb.expected_max_normal(64))
    assert mb.expert_dispersion() == pytest.approx(0.2219, abs=1e-4)


def test_the_formula_by_hand():
    """Qwen3-235B at EP 8 (128 experts, top-8), 32,768 tokens per micro-batch:
    1 + e(8)·sqrt(8·(c²/128 + 120/(127·32768·8)))."""
    c, e8 = mb.expert_dispersion(), mb.expected_max_normal(8)
    hand = 1 + e8 * math.sqrt(8 * (c * c / 128 + 120 / (127 * 32768 * 8)))
    assert mb.hot_rank_load(128, 8, 8, 32768) == pytest.approx(hand, rel=1e-12)
    assert mb.hot_rank_load(128, 8, 8, 32768) == pytest.approx(1.079, abs=1e-3)
    assert mb.hot_rank_load(128, 8, 1, 32768) == 1.0


def _simulated_max(experts, top_k, ep, tokens, c, trials, seed):
    """The model the closed form states, sampled: each expert's systematic share
    ``1 + c·(z − z̄)``; each token's k distinct experts drawn uniformly, kept with those
    shares by thinning; the most loaded rank (consecutive experts) over the mean."""
    rng = np.random.default_rng(seed)
    m, out = experts // ep, []
    for _ in range(trials):
        z = rng.standard_normal(experts)
        share = 1 + c * (z - z.mean())
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
        counts = np.bincount(picks.ravel(), minlength=experts) * share
        ranks = counts.reshape(ep, m).sum(axis=1)
        out.append(ranks.max() / ranks.mean())
    return float(np.mean(out))


@pytest.mark.parametrize("c, tokens", [(0.0, 256), (0.2, 20000)])
def test_the_closed_form_matches_a_seeded_simulation(c, tokens):
    """Sampling alone (c = 0, few tokens) and the systematic term alone (many tokens): the
    simulated mean of the hottest rank's load is the closed form's within 1 %."""
    experts, top_k, ep = 32, 4, 8
    sim = _simulated_max(experts, top_k, ep, tokens, c, trials=400, seed=7)
    m = experts // ep
    if c == 0.0:
        closed = 1 + mb.expected_max_normal(ep) * math.sqrt(
            ep * (experts - top_k) / ((experts - 1) * tokens * top_k))
    else:
        # the sampling part of 20,000 tokens adds under 0.2 % here; the systematic one is c/√m
        closed = 1 + mb.expected_max_normal(ep) * math.sqrt(
            c * c / m + ep * (experts - top_k) / ((experts - 1) * tokens * top_k))
    assert sim == pytest.approx(closed, rel=0.01)


@pytest.mark.parametrize("balancing, coeff, applies", [
    ("aux_loss", 1e-3, True), ("seq_aux_loss", 1e-4, True),
    ("aux_loss", 1e-2, False),        # a stronger loss than the source's: not bounded by it
    ("aux_loss", 0.0, False), ("sinkhorn", 0.0, False), ("none", 0.0, False)])
def test_it_applies_where_the_source_bounds_the_router(balancing, coeff, applies):
    assert mb.applies(balancing, coeff) is applies


# ------------------------------------------------------------------ the plan's default
#: Qwen3-30B-A3B cut to 2 layers, EP 8 on one DGX H100, dropless, the Qwen3 recipes' aux loss
MOE = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                            "aux_loss_coeff": 1e-3}},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}


def load(moe: dict | None = None, model: dict | None = None) -> ddlsim.RunConfig:
    d = copy.deepcopy(MOE)
    d["parallel"]["moe"].update(moe or {})
    d["model"].update(model or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def test_unset_dropless_aux_loss_routing_derives_the_hot_rank():
    cfg = load()
    plan = resolve_moe(cfg)
    expected = mb.hot_rank_load(128, 8, 8, 8 * 4096)           # N = ep · b·s
    assert (plan.imbalance, plan.imbalance_basis) == (pytest.approx(expected), "derived")
    phrase = (f"dropless, aux-loss router (router_imbalance {expected:.3g}, a lower bound "
              f"derived from {mb.SOURCE})")
    assert plan_fields(cfg)["moe"]["routing"] == phrase
    assert plan_fields(cfg)["moe"]["router_imbalance"] == pytest.approx(expected)
    assert cfg.family.plan_summary(cfg).endswith(f"ETP1, {phrase}, aux loss 0.001")


def test_the_derived_hot_rank_costs_time():
    derived = ddlsim.predict(load()).iteration_time_s
    forced = ddlsim.predict(load({"router_force_load_balancing": True})).iteration_time_s
    rho = resolve_moe(load()).imbalance
    given = ddlsim.predict(load({"router_imbalance": rho})).iteration_time_s
    assert derived > forced and derived == pytest.approx(given, rel=1e-12)


@pytest.mark.parametrize("moe, model, basis", [
    ({"router_imbalance": 1.5}, {}, "given"),
    ({"router_force_load_balancing": True}, {}, "forced"),
    ({}, {"capacity_factor": 1.25}, "assumed"),                 # capacity routing unchanged
    ({"aux_loss_coeff": 1e-2}, {}, "assumed"),
    ({"aux_loss_coeff": 0.0}, {}, "assumed"),
    ({"aux_loss_coeff": 0.0, "router_load_balancing_type": "sinkhorn"}, {}, "assumed")])
def test_given_forced_capacity_and_other_routers_keep_their_basis(moe, model, basis):
    plan = resolve_moe(load(moe, model))
    assert plan.imbalance_basis == basis
    forced = mb.random_routing_load(128, 8, 8, 8 * 4096)      # top-k sampling alone
    assert plan.imbalance == {"given": 1.5, "forced": forced}.get(basis, 1.0)


def test_forced_balance_is_the_sampling_term_alone():
    """Random logits have no systematic spread: ρ is the closed form with c = 0, which the
    seeded simulation above checks (Qwen3-30B at EP 8: 1 + e(8)·sqrt(8·120/(127·32768·8)))."""
    hand = 1 + mb.expected_max_normal(8) * math.sqrt(8 * 120 / (127 * 32768 * 8))
    assert mb.random_routing_load(128, 8, 8, 32768) == pytest.approx(hand, rel=1e-12)
    assert mb.random_routing_load(128, 8, 8, 32768) == mb.hot_rank_load(128, 8, 8, 32768, 0.0)
    assert mb.random_routing_load(128, 8, 1, 32768) == 1.0
    assert 1 < mb.random_routing_load(128, 8, 8, 32768) < mb.hot_rank_load(128, 8, 8, 32768)


def test_the_tokens_follow_the_micro_batch_and_the_parallel_split():
    """N = etp·ep·b·s/cp (/tp with sequence parallelism): four times the tokens, a smaller
    sampling term, a (slightly) smaller hot rank."""
    d = copy.deepcopy(MOE)
    d["train"].update(micro_batch_size=4, global_batch_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        four = resolve_moe(ddlsim.load_config(d)).imbalance
    assert four == pytest.approx(mb.hot_rank_load(128, 8, 8, 8 * 4 * 4096))
    assert 1 < four < resolve_moe(load()).imbalance


def test_flex_takes_the_derived_default_and_says_its_traffic_stays_at_the_mean():
    cfg = load({"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"})
    plan = resolve_moe(cfg)
    assert plan.imbalance_basis == "derived" and plan.imbalance > 1
    assert "flex traffic at the mean" in plan_fields(cfg)["moe"]["routing"]
    ddlsim.predict(cfg)                                  # accepted, unlike a given one
    with pytest.raises(ConfigError, match="router_imbalance = 1.5 with token_dispatcher_type"):
        load({"token_dispatcher_type": "flex", "router_imbalance": 1.5})


def test_the_default_is_deterministic_and_fast():
    import time
    load()                                               # warm the caches
    start = time.process_time()
    values = {resolve_moe(load()).imbalance for _ in range(5)}
    assert len(values) == 1
    assert (time.process_time() - start) / 5 < 0.5      # a config load, not a simulation

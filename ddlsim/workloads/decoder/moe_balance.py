"""The hottest expert-parallel rank's load under dropless top-k routing balanced by an
auxiliary loss or by an expert bias (derived from a published statistic), or forced to balance
by random logits (derived from the code): ``router_imbalance``'s default.

Each MoE layer's dispatch, experts and combine wait for the expert-parallel rank that receives
the most routed token copies in that micro-batch. Two things spread the ranks' loads:

1. **The router's own imbalance** (systematic): a router trained with an auxiliary loss does not
   send every expert the same share even over a whole data set. Wang et al. (2024) publish it
   as ``MaxVio_global = (max_i Load_i − mean Load_i) / mean Load_i`` over the validation set
   (Table 2, :data:`MAXVIO_GLOBAL`). Read as the expected largest of ``E_src`` experts' relative
   loads ``1 + c·(z_i − z̄)``, ``z_i`` independent standard normals, it gives the per-expert
   dispersion ``c = MaxVio / e(E_src)`` (``e(n)``: the expected maximum of ``n`` independent
   standard normals, :func:`expected_max_normal`).
2. **Finite-sample routing** (statistical): ``N`` tokens, each sending ``k`` copies to ``k``
   distinct of ``E`` experts; the copies one rank's ``m = E/EP`` experts receive are a sum of
   ``N`` hypergeometric counts, relative variance ``(EP−1)(E−k) / ((E−1)·N·k)``.

An EP rank holds ``m`` consecutive experts, whose loads are taken as independent of where
Megatron-Core places them (an expert's index says nothing of its load). The EP ranks' relative
loads are then exchangeable normals summing to EP, and the expected largest is

    ρ = 1 + e(EP) · sqrt(EP · (c²/E + (E − k) / ((E − 1)·N·k)))

(the ``EP/(EP−1)`` factor of a sum-constrained set folded in: the systematic term's ``c²/m``,
the sampling term's ``EP·(E−k)/((E−1)·N·k)``). ``N`` is the tokens the rank's ``tp_ep`` group
routes in one micro-batch (``etp·ep·T``, ``T`` the MoE layer's tokens per rank).

What ρ leaves out, so that it is a lower bound for the routers it is applied to: the tokens of
one micro-batch are not independent (a few documents; their topics share experts), which
spreads the loads further than (2), and ``MaxVio_batch`` (Wang et al., Figure 3, published as a
curve only) is larger than ``MaxVio_global``. It is applied only where the source's statistic
bounds the run's router: aux_loss or seq_aux_loss balancing with a coefficient above 0 and at
most the source's ``α = 1e-3`` (a stronger loss balances better than measured; ``none`` or
``sinkhorn`` routing has no published statistic). docs/moe.md, "Load imbalance under dropless
routing".

**Expert-bias (auxiliary-loss-free) routing.** Wang et al.'s Loss-Free Balancing adds a
per-expert bias to the scores before top-k and moves it by ``±u`` each step towards the mean
load (Megatron-Core's ``--moe-router-enable-expert-bias``, ``--moe-router-bias-update-rate``;
DeepSeek-V3's ``noaux_tc``). Its MaxVio_global is published for the same two models,
0.04 at both sizes (Table 2, :data:`MAXVIO_GLOBAL_BIAS`); the same ρ with ``c = 0.04 /
e(64)`` (:func:`hot_rank_load`'s ``maxvio``) is a lower bound for the same reasons, applied
where the run's rate is the source's ``u = 1e-3`` (:func:`bias_applies`). With the bias on, a
sequence-wise or batch auxiliary loss of coefficient at most 1e-3 beside it (DeepSeek-V3:
``seq_aux`` with α = 1e-4, arXiv:2412.19437 §2.1.2 Eq. 17-20 and §4.2) does not change the
statistic: the bias sets the balance over the batch, the "extremely small" loss only keeps
a single sequence from extreme imbalance (§2.1.2), so the bias's statistic governs; a larger
coefficient is a stronger loss than either source measured, and leaves ρ assumed 1.

**Forced balance** (Megatron-Core's benchmark mode, ``--moe-router-force-load-balancing``):
the router's logits are replaced by independent standard normal noise (``RandomSTE``:
``logits.clone().normal_()``, NVIDIA/Megatron-LM 1e057005 ``moe_utils.py`` lines 785-822,
``router.py`` lines 449-451; d7288711 ``moe_utils.py`` lines 1194-1231), so each token's
top-k is a uniformly random ``k``-subset of the ``E`` experts, drawn afresh per token. The
systematic term is then exactly 0 and the sampling term is the whole spread: ρ is
:func:`hot_rank_load` with ``maxvio = 0`` (:func:`random_routing_load`), the expected
hottest rank under the normal approximation of its sum of ``N`` independent hypergeometric
counts — not a bound, the model of what the code does. Balanced in expectation, every rank;
not in one micro-batch, where the all-to-alls wait for the hottest (Qwen3-235B at EP 32,
65,536 routed tokens: 1.016). Group-limited routing (groups picked first, then the top-k
inside them) keeps every expert's expected tokens but correlates the ranks of a group, which
spreads the loads further than the exchangeable closed form: there ρ is a lower bound.

References
----------
Wang, Gao, Zhao, Sun, Dai, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts",
arXiv:2408.15664 v1 (2024): §3 (the bias update ``b_i += u·sign(mean load − load_i)``), §4.1
(baseline auxiliary loss coefficient α = 0.001; update rate u = 0.001; Eq. 4, MaxVio_global),
§4.2 Table 2 (Loss-Controlled: 1B 0.72, 3B 0.52; Loss-Free: 0.04 both), Appendix Table 5
(both models: 64 routed experts, 6 activated, 2 shared).
DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024): §2.1.2 (auxiliary-loss-
free balancing with a complementary sequence-wise balance loss of an extremely small α),
§4.2 (bias update speed γ = 0.001, balance factor α = 0.0001).
Order statistics of the normal distribution: ``e(n) = ∫ x · n·φ(x)·Φ(x)^(n−1) dx`` (David and
Nagaraja, "Order Statistics", 3rd ed., 2003, §3.1).
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["MAXVIO_GLOBAL", "MAXVIO_GLOBAL_BIAS", "SOURCE_EXPERTS", "SOURCE_AUX_COEFF",
           "SOURCE_BIAS_RATE", "SOURCE", "SOURCE_BIAS", "SOURCE_FORCED", "expected_max_normal",
           "expert_dispersion", "hot_rank_load", "random_routing_load", "applies",
           "bias_applies"]

#: MaxVio_global of the auxiliary-loss-controlled 3B model (Wang et al. 2024, arXiv:2408.15664,
#: Table 2: 0.52; the 1B model's 0.72 is the larger; the smaller is taken so that ρ stays a
#: lower bound)
MAXVIO_GLOBAL = 0.52
#: routed experts per MoE layer of that model (arXiv:2408.15664, Appendix Table 5: 64 routed
#: experts, 6 activated, 2 shared)
SOURCE_EXPERTS = 64
#: that model's auxiliary-loss coefficient α (arXiv:2408.15664 §4.1: "set the auxiliary loss
#: coefficient α to 0.001")
SOURCE_AUX_COEFF = 1e-3
#: how the plan line names the source
SOURCE = "Wang et al. 2024 MaxVio_global 0.52 and top-k sampling"
#: MaxVio_global of the Loss-Free (expert-bias) models, both sizes (arXiv:2408.15664,
#: Table 2: 0.04 at 1B and at 3B)
MAXVIO_GLOBAL_BIAS = 0.04
#: the bias update rate those models trained with (arXiv:2408.15664 §4.1: u = 0.001; the same
#: as Megatron-LM d98e8a64 ``transformer_config.py`` line 821's default
#: ``moe_router_bias_update_rate = 1e-3``, "same as that used in DeepSeekV3", and
#: arXiv:2412.19437 §4.2's γ = 0.001)
SOURCE_BIAS_RATE = 1e-3
#: how the plan line names the expert-bias source
SOURCE_BIAS = "Wang et al. 2024 MaxVio_global 0.04 and top-k sampling"

#: how the plan line names forced balance's derivation
SOURCE_FORCED = "top-k sampling of random logits"

#: balancing types whose router the source's auxiliary loss stands for
_AUX_BALANCING = ("aux_loss", "seq_aux_loss")


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """``e(n)``: the expected maximum of ``n`` independent standard normal variables.

    Parameters
    ----------
    n : int
        How many (≥ 1).

    Returns
    -------
    float
        ``∫ x · n·φ(x)·Φ(x)^(n−1) dx`` by Simpson's rule on [−10, 10] with step 0.005 (the
        integrand is below 1e-20 outside it for n ≤ 2^20); 0 for n = 1, 1/√π for n = 2.
    """
    if n < 1:
        raise ValueError(f"expected_max_normal needs n >= 1, got {n}")
    if n == 1:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += weight * x * n * pdf * cdf ** (n - 1)
    return total * h / 3


def expert_dispersion(maxvio: float = MAXVIO_GLOBAL) -> float:
    """``c``: the standard deviation of one expert's load over the mean that a source's
    MaxVio_global implies (``maxvio / e(SOURCE_EXPERTS)``: about 0.22 for the auxiliary-loss
    router's 0.52, 0.017 for the expert bias's 0.04)."""
    return maxvio / expected_max_normal(SOURCE_EXPERTS)


def hot_rank_load(experts: int, top_k: int, ep: int, tokens: float,
                  maxvio: float = MAXVIO_GLOBAL) -> float:
    """ρ: the expected tokens of the most loaded of ``ep`` expert-parallel ranks over the mean.

    Parameters
    ----------
    experts : int
        Routed experts ``E`` of the layer.
    top_k : int
        Experts per token ``k``.
    ep : int
        Expert-parallel ranks (each holds ``E/EP`` experts).
    tokens : float
        Tokens ``N`` the EP group routes in one micro-batch.
    maxvio : float
        The router's published MaxVio_global over the source's 64 experts:
        :data:`MAXVIO_GLOBAL` (auxiliary loss) or :data:`MAXVIO_GLOBAL_BIAS` (expert bias).

    Returns
    -------
    float
        ``1 + e(EP)·sqrt(EP·(c²/E + (E−k)/((E−1)·N·k)))`` (module docstring); 1 for EP 1.
    """
    if ep <= 1:
        return 1.0
    c = expert_dispersion(maxvio)
    sampling = (experts - top_k) / ((experts - 1) * tokens * top_k) if experts > 1 else 0.0
    return 1.0 + expected_max_normal(ep) * math.sqrt(ep * (c * c / experts + sampling))


def random_routing_load(experts: int, top_k: int, ep: int, tokens: float) -> float:
    """ρ under forced balance: the expected tokens of the hottest of ``ep`` expert-parallel
    ranks over the mean when each of ``tokens`` tokens picks ``top_k`` distinct experts of
    ``experts`` uniformly at random (module docstring, "Forced balance"):
    ``1 + e(EP)·sqrt(EP·(E−k)/((E−1)·N·k))``, :func:`hot_rank_load` without a systematic
    term; 1 for EP 1."""
    return hot_rank_load(experts, top_k, ep, tokens, maxvio=0.0)


def applies(balancing: str, aux_loss_coeff: float) -> bool:
    """Whether the source's statistic bounds the run's router: aux_loss or seq_aux_loss
    balancing with a coefficient in (0, :data:`SOURCE_AUX_COEFF`]."""
    return balancing in _AUX_BALANCING and 0 < aux_loss_coeff <= SOURCE_AUX_COEFF


def bias_applies(update_rate: float, balancing: str, aux_loss_coeff: float) -> bool:
    """Whether the expert bias's statistic bounds the run's router: the source's update rate
    (:data:`SOURCE_BIAS_RATE`), and no auxiliary loss stronger than 1e-3 beside it (none, or
    aux_loss/seq_aux_loss with a coefficient at most :data:`SOURCE_AUX_COEFF`: the bias sets
    the balance, module docstring); sinkhorn routing ignores the bias."""
    if not math.isclose(update_rate, SOURCE_BIAS_RATE, rel_tol=1e-9):
        return False
    if balancing == "sinkhorn":
        return False
    return balancing not in _AUX_BALANCING or aux_loss_coeff <= SOURCE_AUX_COEFF

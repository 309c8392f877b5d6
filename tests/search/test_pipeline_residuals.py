"""Two terms of the search tier's pipeline closed form (:func:`ddlsim.search.pipeline.
iteration_time`, issue 27: one physics), against the exact engine.

* **The last stage's end.** The last micro-batch's gradient leaves the last stage's last
  backward, crosses every hop and runs each earlier stage's chunk-0 backward; the first
  stage's is a middle stage's plus the embedding's backward. The tier left that out, so its
  last stage ended the embedding's backward late (+2.1103 ms on llama-3.1-8b TP 1, overlap
  on or off): it decides the iteration where the last stage's tail and update outlast the
  drain.
* **Each stage's own hops.** With blocking P2P a stage's period gains the transfers it
  waits for. Across nodes at PP ≥ 4 the hops differ (one leaves its node, the others do
  not); the tier charged their mean to the first and last stages, (m − 1)·(mean − own hop)
  slow: TP2 PP4 DP2 on 2 nodes +0.379 ms = 7 × (0.0761 − 0.022) ms, TP1 PP8 DP2 +1.379 ms =
  31 × (0.0852 − 0.0407) ms.

Both now equal the exact engine to rounding (1F1B and GPipe)."""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.family import StageCosts, vector_family
from ddlsim.search.pipeline import iteration_time
from ddlsim.search.plans import SCHEDULE, VECTOR_FIELDS, enumerate_plans
from ddlsim.search.run import plan_overrides
from ddlsim.search.spec import Constraints



def _llama(tp: int, pp: int, dp: int, nodes: int, layers: int, gbs: int, *,
           schedule: str = "1f1b", overlap: bool = True) -> dict:
    """llama-3.1-8b cut to ``layers`` layers on ``nodes`` DGX H100, full recomputation,
    micro-batches of one (``gbs / dp`` of them per pipeline), Megatron-Core's stack (a what-if
    under GPipe, which it has no schedule for)."""
    return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": layers},
            "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                         "data_parallel_size": dp, "schedule": schedule},
            "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 2048,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": nodes,
                       # Megatron-Core has no GPipe (rule no_gpipe): a what-if there
                       "software": {"stack": "megatron-core-2024",
                                    "what_if": schedule == "gpipe",
                                    "overlap": {"overlap_grad_reduce": overlap}}}}


def _tier_and_exact(data: dict):
    """(the search tier's costs and plans of the one plan ``data``, the exact engine's
    result of it)."""
    cfg = build_config(data, [])
    fields = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = cfg.parallel.schedule
    plans = enumerate_plans({}, fields, cfg.system.num_devices)
    assert len(plans) == 1
    family = vector_family(cfg.model.architecture)
    return family.costs(family.prepare(cfg), plans, None), plans, \
        ddlsim.predict(cfg, check_fit=False)


#: TP, PP, DP, nodes, layers, global batch: one node (the embedding's backward alone), and
#: the two 2-node plans whose hops differ (both residuals)
PLANS = [(1, 2, 4, 1, 8, 32), (1, 4, 2, 1, 8, 32), (2, 4, 2, 2, 16, 16),
         (1, 8, 2, 2, 16, 64)]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("tp, pp, dp, nodes, layers, gbs", PLANS)
def test_last_stage_ends_when_the_exact_engine_ends_it(tp, pp, dp, nodes, layers, gbs,
                                                       overlap, schedule):
    """The tier's end of the last stage (its iteration time with the first stage's tail
    taken away, so the last stage decides it) is the exact engine's ``stage{PP − 1}``."""
    costs, plans, exact = _tier_and_exact(_llama(tp, pp, dp, nodes, layers, gbs,
                                                 schedule=schedule, overlap=overlap))
    tier = iteration_time(costs._replace(tail_first=costs.tail_first - 1.0), plans)[0]
    assert tier == pytest.approx(exact.per_class_time_s[f"stage{pp - 1}"], rel=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("tp, pp, dp, gbs", [(2, 4, 2, 16), (1, 8, 2, 64)])
def test_stages_wait_for_their_own_hops_across_nodes(tp, pp, dp, gbs, schedule):
    """On 2 nodes one hop leaves its node; the search's iteration time (a grid of one plan,
    through :func:`evaluate_grid`) is the exact engine's."""
    data = _llama(tp, pp, dp, 2, 16, gbs, schedule=schedule)
    axes = {"parallel.virtual_pipeline_model_parallel_size": [None], "parallel.zero_stage": [0]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    assert frame.attrs["tier"] == "vectorised" and len(frame) == 1
    columns = [c for c in frame.columns if "." in c]
    cfg = build_config(data, plan_overrides(frame.iloc[0], columns))
    assert cfg.parallel.pipeline_model_parallel_size == pp and cfg.parallel.schedule == schedule
    exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert frame["iteration_time_s"].iloc[0] == pytest.approx(exact, rel=1e-9)


def test_one_hop_leaves_its_node():
    """The plans above are what they are said to be: on TP2 PP4 DP2 over 2 nodes the middle
    hop leaves its node and costs more than the two inside it: the first stage receives
    over one inside (h0), the last over one inside (h2 = h0), each middle stage over one of
    each (h0 + h1: stages 1 and 2, the two orders)."""
    costs, _, _ = _tier_and_exact(_llama(2, 4, 2, 2, 16, 16))
    rows = costs.stage_hops[0]
    h0, h1 = rows[0, 1], rows[2:].max()
    assert rows[1, 0] == h0 < h1 and np.isneginf(rows[0, 0]) and np.isneginf(rows[1, 1])
    assert sorted(map(tuple, rows[2:])) == [(h0, h1), (h1, h0)]
    assert 2 * h0 + h1 == pytest.approx(costs.p2p_s[0], rel=1e-12)


def _stage_rows(hops) -> np.ndarray:
    """One plan's ``stage_hops`` of the hops s → s + 1 ``hops`` (seconds): the first stage
    (none, h0), the last (h_{p−2}, none), each middle stage (h_{s−1}, h_s)."""
    h = list(hops)
    rows = [(-np.inf, h[0]), (h[-1], -np.inf), *zip(h[:-1], h[1:])]
    return np.array([rows], dtype=float)


def _by_hand(hops, **changed) -> StageCosts:
    """Four stages, fwd/bwd (s): first 1/3 (its backward 1 s of embedding beyond a middle
    stage's 2), middle 1/2, last 1.5/2.5; free tails, a 0.5 s update on each end."""
    one = np.ones(1)
    costs = dict(fwd_first=one, fwd_mid=one, fwd_last=1.5 * one, bwd_first=3 * one,
                 bwd_mid=2 * one, bwd_last=2.5 * one, bwd_chunk=2 * one,
                 p2p_s=np.array([sum(hops)]), wrap_s=0 * one, tail_first=0 * one,
                 tail_last=0 * one, update_first=0.5 * one, update_last=0.5 * one,
                 whole=np.full(1, np.nan), blocking=True, stage_hops=_stage_rows(hops))
    return StageCosts(**{**costs, **changed})


_PLAN = {"pp": np.array([4]), "v": np.array([1]), "gbs": np.array([8]), "mbs": np.array([1]),
         "dp": np.array([1]), "schedule": np.array([SCHEDULE.index("1f1b")])}


def test_blocking_period_takes_each_stage_own_hops_by_hand():
    """1F1B, blocking P2P, m = 8, hops 0.1, 0.5, 0.1 s: the period is the largest of
    t_first + 0.1 = 4.1, t_last + 0.1 = 4.1 and t_mid + 0.6 = 3.6 s (with the mean hop,
    0.7/3 s, it was 4.2333 s); T = 7·4.1 + Σ t_s (14) + 2·P2P (1.4) + 0.5 = 44.6 s."""
    assert iteration_time(_by_hand((0.1, 0.5, 0.1)), _PLAN)[0] == pytest.approx(44.6)
    # a middle stage whose two hops outlast the ends' one: 3 + 0.1 + 1.5 = 4.6 s per period
    assert iteration_time(_by_hand((0.1, 1.5, 0.1)), _PLAN)[0] == pytest.approx(
        7 * 4.6 + 14 + 2 * 1.7 + 0.5)


def test_last_stage_drain_runs_the_first_stage_backward_by_hand():
    """Hops as above, the last stage's tail 10 s: its last backward ends the drain
    (2 middle chunk backwards, 2·2 s, the first stage's 3 s, the hops' 0.7 s) before the
    first stage's, at 44.1 − 7.7 = 36.4 s; T = 36.4 + 10 + 0.5 = 46.9 s (with the drain
    leaving out the first stage's embedding backward: 47.9 s)."""
    costs = _by_hand((0.1, 0.5, 0.1), tail_last=np.array([10.0]))
    assert iteration_time(costs, _PLAN)[0] == pytest.approx(46.9)


def test_gpipe_stages_wait_for_the_hop_each_pass_arrives_by_by_hand():
    """GPipe, stages as above, hops 0.1, 0.5, 2.0 s, m = 8. Forwards: a middle stage waits
    for its activations over the hop before it (at most 0.5 s), the last stage over 2.0 s:
    period max(1, 1.5 + 2.0, 1 + 0.5) = 3.5 s, 7·3.5 + 4.5 = 29 s. Backwards: a middle stage
    waits for its gradients over the hop after it (at most 2.0 s), the first over 0.1 s:
    period max(3 + 0.1, 2.5, 2 + 2.0) = 4 s, 7·4 + 9.5 = 37.5 s. T = 66.5 + 2·2.6 + 0.5 s.
    The hops the other way round: forwards max(1, 1.5 + 0.1, 1 + 2.0) = 3 s, 21 + 4.5 s;
    backwards max(3 + 2.0, 2.5, 2 + 0.5) = 5 s, 35 + 9.5 s; T = 70 + 5.2 + 0.5 s."""
    plan = {**_PLAN, "schedule": np.array([SCHEDULE.index("gpipe")])}
    assert iteration_time(_by_hand((0.1, 0.5, 2.0)), plan)[0] == pytest.approx(72.2)
    assert iteration_time(_by_hand((2.0, 0.5, 0.1)), plan)[0] == pytest.approx(75.7)

"""Plans as arrays: enumeration order, derived fields, and the vectorised config rules that
accept exactly the plans RunConfig accepts (checked plan by plan on a grid)."""

from __future__ import annotations

import numpy as np

from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.search.evaluate import evaluate_grid, pareto_mask
from ddlsim.search.plans import RECOMPUTE, SCHEDULE, enumerate_plans
from ddlsim.search.spec import Constraints
from ddlsim.sweeps import _setting

BASE = {"parallel.tensor_model_parallel_size": 1, "parallel.pipeline_model_parallel_size": 1,
        "parallel.data_parallel_size": None, "parallel.virtual_pipeline_model_parallel_size": None,
        "parallel.sequence_parallel": False, "parallel.zero_stage": 0,
        "train.micro_batch_size": 1, "train.global_batch_size": 16, "train.recompute": "none",
        "parallel.schedule": "1f1b"}


def test_first_axis_varies_slowest_and_dp_fills_the_devices():
    plans = enumerate_plans({"parallel.tensor_model_parallel_size": [1, 2, 4],
                             "parallel.pipeline_model_parallel_size": [1, 3]}, BASE, 8)
    assert plans["tp"].tolist() == [1, 1, 2, 2, 4, 4]
    assert plans["pp"].tolist() == [1, 3, 1, 3, 1, 3]
    # DP = 8 // (TP·PP) where TP·PP divides 8, else 0 (a rule rejects it)
    assert plans["dp"].tolist() == [8, 0, 4, 0, 2, 0]


def test_vpp_axis_picks_the_interleaved_schedule():
    plans = enumerate_plans({"parallel.virtual_pipeline_model_parallel_size": [None, 2],
                             "train.recompute": ["full", "none"]}, BASE, 8)
    assert [SCHEDULE[s] for s in plans["schedule"]] == ["1f1b", "1f1b", "interleaved",
                                                         "interleaved"]
    assert [RECOMPUTE[r] for r in plans["recompute"]] == ["full", "none", "full", "none"]
    assert plans.overrides(2)["parallel.virtual_pipeline_model_parallel_size"] == 2
    assert plans.overrides(0)["parallel.virtual_pipeline_model_parallel_size"] is None


AXES = {"parallel.tensor_model_parallel_size": [1, 2, 4, 8, 16],
        "parallel.pipeline_model_parallel_size": [1, 2, 3, 4],
        "parallel.virtual_pipeline_model_parallel_size": [None, 2, 3],
        "parallel.sequence_parallel": [False, True],
        "parallel.zero_stage": [0, 3],
        "train.micro_batch_size": [1, 3, 4]}


def test_rules_accept_exactly_what_runconfig_accepts(base_dict):
    """Every plan of a 720-plan grid on 8 GPUs (gpt3-1.3b: 24 layers, 32 heads), sampled:
    valid for the vectorised rules iff RunConfig builds it."""
    base_dict["parallel"] = {"tensor_model_parallel_size": 2}
    base_dict["system"]["nodes"] = 1
    grid = evaluate_grid(base_dict, None, [], AXES, Constraints(must_fit=False))
    valid = set(grid.frame["plan"].tolist())
    assert grid.total == 720 and 0 < len(valid) < 720
    plans = enumerate_plans(AXES, {**BASE, "train.global_batch_size": 16}, 8)
    for i in np.random.default_rng(7).choice(720, 80, replace=False).tolist():
        sets = [_setting(p, v) for p, v in plans.overrides(i).items()]
        try:
            build_config(base_dict, sets)
            ok = True
        except ConfigError:
            ok = False
        assert ok == (i in valid), (i, sets)


def test_rules_on_the_grid_match_rules_plan_by_plan(base_dict):
    """plan_rules and the config's group rules on the product's axes (each rule once per
    distinct value of its fields) give every rule's mask exactly as on the flat arrays,
    context and derived DP included."""
    from ddlsim.search.planconfig import group_rules, plan_sections
    from ddlsim.search.plans import PlanSet, plan_rules, stack_plan_rules

    axes = {**AXES, "train.dtype": ["bf16", "fp16"], "parallel.data_parallel_size": [None, 2]}
    plans = enumerate_plans(axes, {**BASE, "train.global_batch_size": 16}, 8)
    flat = PlanSet(dict(plans), plans.contexts)  # the same arrays, no grid
    cfgs = [build_config(base_dict, [_setting(p, v) for p, v in c.items()])
            for c in plans.contexts]
    sections = plan_sections(base_dict, None, [])
    on_grid = plan_rules(plans, cfgs, 8, 4) + group_rules(plans, cfgs, cfgs[0], sections) + \
        stack_plan_rules(plans, cfgs)
    one_by_one = plan_rules(flat, cfgs, 8, 4) + group_rules(flat, cfgs, cfgs[0], sections) + \
        stack_plan_rules(flat, cfgs)
    assert [r for r, _ in on_grid] == [r for r, _ in one_by_one]
    assert any("num_hidden_layers = 24" in r for r, _ in on_grid)   # e.g. PP 3 × VPP 3
    for (reason, a), (_, b) in zip(on_grid, one_by_one):
        assert a.shape == (len(plans),) and np.array_equal(a, b), reason


def test_rejections_are_counted_per_reason(base_dict):
    axes = {**AXES, "parallel.data_parallel_size": [1, 2, 8]}
    grid = evaluate_grid(base_dict, None, [], axes, Constraints(must_fit=False, max_gpus=4))
    assert sum(grid.rejected.values()) + len(grid.frame) == grid.total
    assert "more than max_gpus = 4 GPUs" in grid.rejected
    sp = "parallel: sequence_parallel = true needs tensor_model_parallel_size > 1 (got 1)"
    assert sum(c for r, c in grid.rejected.items() if r.startswith(sp)) > 0   # predict's words
    counts = list(grid.rejected.values())
    assert counts == sorted(counts, reverse=True)
    assert (grid.frame["gpus"] <= 4).all()


def test_context_axes_group_plans(base_dict):
    """A non-vectorised axis (dtype) makes one base config per value; a value the config
    rejects (fp8 has no peak on an A100) rejects its plans with the config's reason."""
    axes = {"train.dtype": ["bf16", "fp8"], "parallel.tensor_model_parallel_size": [1, 2]}
    grid = evaluate_grid(base_dict, None, [], axes, Constraints(must_fit=False))
    assert grid.total == 4
    assert set(grid.frame["train.dtype"]) == {"bf16"}
    (reason, count), = grid.rejected.items()
    assert count == 2 and "fp8" in reason


def test_pareto_front_by_hand():
    """(time, memory): a (1, 9) b (2, 5) c (3, 5) d (4, 1) e (2, 7): c is beaten by b (slower,
    as heavy), e by b (as fast, heavier); the front is a, b, d."""
    t = np.array([1.0, 2.0, 3.0, 4.0, 2.0])
    m = np.array([9.0, 5.0, 5.0, 1.0, 7.0])
    assert pareto_mask(t, m).tolist() == [True, True, False, True, False]


def test_must_fit_rejects_plans_over_memory(base_dict):
    axes = {"parallel.tensor_model_parallel_size": [1, 8], "train.micro_batch_size": [1, 16]}
    base_dict["model"] = "gpt3-13b"
    loose = evaluate_grid(base_dict, None, [], axes, Constraints(must_fit=False))
    strict = evaluate_grid(base_dict, None, [], axes, Constraints())
    over = int((~loose.frame["fits"]).sum())
    assert over > 0
    assert strict.rejected["does not fit in device memory"] == over
    assert strict.frame["fits"].all()


def test_plans_that_must_fit_and_do_not_are_not_timed(base_dict, monkeypatch):
    """With must_fit, memory comes first: only the plans that fit reach the stage costs, and
    they get the figures a loose search gives them."""
    from ddlsim.search.decoder import DecoderVectors

    timed = []
    costs = DecoderVectors.costs

    def counting(self, ctx, plans, nets):
        timed.append(len(plans))
        return costs(self, ctx, plans, nets)

    monkeypatch.setattr(DecoderVectors, "costs", counting)
    axes = {"parallel.tensor_model_parallel_size": [1, 8], "train.micro_batch_size": [1, 16]}
    base_dict["model"] = "gpt3-13b"
    loose = evaluate_grid(base_dict, None, [], axes, Constraints(must_fit=False))
    timed_loose, timed[:] = sum(timed), []
    strict = evaluate_grid(base_dict, None, [], axes, Constraints())
    assert sum(timed) == len(strict.frame) < timed_loose == len(loose.frame)
    fit = loose.frame[loose.frame["fits"]].set_index("plan")["iteration_time_s"]
    assert np.array_equal(strict.frame.set_index("plan")["iteration_time_s"].loc[fit.index],
                          fit.to_numpy())

"""The interleaved schedule's micro-batch groups as each stack runs them
(``system.software.kernels.interleaved_groups``, ``parallel.microbatch_group_size_per_vp_stage``;
``workloads/schedules.py``): Megatron's groups of PP, Megatron-Core's groups of its option (the
last group what is left), torch.distributed.pipelining's rounds. Until 2026-12-01 every stack
had Megatron's rule, so a torchtitan plan with 10 micro-batches on 4 stages was refused, and
Megatron-Core's option could not be said."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.schedules import (group_refusal, groups_refused, microbatch_group,
                                        schedule, schedule_arrays, warmup)


def _config(stack: str, gbs: int, pp: int = 4, vpp: int = 2, **parallel):
    par = {"pipeline_model_parallel_size": pp, "virtual_pipeline_model_parallel_size": vpp,
           "schedule": "interleaved", "data_parallel_size": 1,
           "zero_stage": 3 if stack.startswith("torchtitan") else 1, **parallel}
    return ddlsim.load_config({
        "model": "llama-3.1-8b", "parallel": par,
        "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 2048},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": stack}})


def _forwards(order):
    return [(mb, c) for kind, mb, c in order if kind == "F"]


def test_megatron_cores_documented_examples():
    """Megatron-LM d98e8a64 model_parallel_config.py lines 441-448: PP 2, VP 2, groups of 2
    over 4 micro-batches run 0 1 0 1 2 3 2 3 on rank 0; groups of 3 over 5 run
    0 1 2 0 1 2 3 4 3 4 (the last group the two left)."""
    two = _forwards(schedule("interleaved", 0, 2, 4, 2, group=2))
    assert [mb for mb, _ in two] == [0, 1, 0, 1, 2, 3, 2, 3]
    assert [c for _, c in two] == [0, 0, 1, 1, 0, 0, 1, 1]
    three = _forwards(schedule("interleaved", 0, 2, 5, 2, group=3))
    assert [mb for mb, _ in three] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in three] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def _megatron_2021(stage, p, m, v):
    """Megatron-LM 6985e58's order (schedules.py get_model_chunk_id: groups of p), written
    apart from ddlsim's."""
    total, warm = m * v, min((p - stage - 1) * 2 + (v - 1) * p, m * v)

    def ident(k, forward):
        within = k % (p * v)
        chunk = within // p
        return (k // (p * v)) * p + within % p, chunk if forward else v - 1 - chunk
    out = [("F", *ident(k, True)) for k in range(warm)]
    for k in range(total - warm):
        out += [("F", *ident(warm + k, True)), ("B", *ident(k, False))]
    return out + [("B", *ident(k, False)) for k in range(total - warm, total)]


@pytest.mark.parametrize("p, v", [(2, 2), (3, 4), (4, 2), (8, 3)])
def test_groups_of_pp_are_megatrons_order_bit_for_bit(p, v):
    for m, stage in itertools.product(range(p, 5 * p + 1, p), range(p)):
        assert list(schedule("interleaved", stage, p, m, v)) == _megatron_2021(stage, p, m, v)
        assert schedule("interleaved", stage, p, m, v) == \
            schedule("interleaved", stage, p, m, v, group=p)


@pytest.mark.parametrize("p, v, m, g", [(4, 2, 10, 5), (4, 3, 7, 7), (2, 2, 5, 3),
                                        (4, 2, 10, 6), (8, 2, 12, 12)])
def test_every_group_runs_each_forward_once_and_each_backward_after_it(p, v, m, g):
    backward, ordinal, mb, chunk, warm = schedule_arrays("interleaved", p, m, v, g)
    for s in range(p):
        order = schedule("interleaved", s, p, m, v, group=g)
        assert warm[s] == warmup("interleaved", s, p, m, v, group=g) \
            == min(2 * (p - s - 1) + (v - 1) * g, m * v)
        seen = {}
        for j, (kind, b, c) in enumerate(order):
            assert (kind == "B") == bool(backward[s, j]) and (b, c) == (mb[s, j], chunk[s, j])
            if kind == "F":
                assert (b, c) not in seen
                seen[(b, c)] = j
            else:
                assert seen[(b, c)] < j
        assert sorted(seen) == sorted(itertools.product(range(m), range(v)))
        for c in range(v):    # each chunk takes its micro-batches in order
            fwd = [b for kind, b, cc in order if kind == "F" and cc == c]
            assert fwd == sorted(fwd)


def test_torch_rounds_as_torch_pipelining_counts_them():
    """ScheduleInterleaved1F1B: max(1, m // PP) rounds of m / rounds micro-batches."""
    assert [microbatch_group("torch_rounds", 4, m) for m in (3, 4, 7, 8, 10, 12)] == \
        [3, 4, 7, 4, 5, 4]
    assert [bool(groups_refused("torch_rounds", 4, m)) for m in (6, 9, 10, 11)] == \
        [False, True, False, True]
    assert np.array_equal(groups_refused("torch_rounds", np.array([4, 4]), np.array([9, 10])),
                          [True, False])
    assert group_refusal("torch_rounds", 4, 10) is None
    assert "rounds max(1, micro-batches // pipeline_model_parallel_size) = 2" in \
        group_refusal("torch_rounds", 4, 9)


def test_megatron_core_rules_on_the_group_and_the_last_group():
    assert group_refusal("megatron_core", 4, 10, 5) is None
    assert group_refusal("megatron_core", 4, 10, 6) is None            # last group 4 = PP
    assert "last group of micro-batches has 2" in group_refusal("megatron_core", 4, 10, 4)
    assert "between pipeline_model_parallel_size = 4" in group_refusal("megatron_core", 4, 10, 3)
    assert "between" in group_refusal("megatron_core", 4, 10, 11)
    assert "groups them otherwise" in group_refusal("megatron_core", 4, 6)
    assert "no such option" in group_refusal("pipeline_size", 4, 8, 4)


def test_torchtitan_runs_ten_micro_batches_on_four_stages():
    """Refused with Megatron's rule until 2026-12-01; both engines time it alike, and the plan
    line and the JSON name the groups."""
    cfg = _config("torchtitan-2025", 10)
    assert cfg.microbatch_group == 5
    a = ddlsim.predict(cfg, check_fit=False)
    d = ddlsim.predict(cfg, engine="des", check_fit=False)
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.01)
    assert "PP4(v2, micro-batches in groups of 5)" in cfg.family.plan_summary(cfg)
    assert a.to_dict()["plan"]["microbatch_group"] == 5
    with pytest.raises(ConfigError, match="ScheduleInterleaved1F1B"):
        _config("torchtitan-2025", 9)
    with pytest.raises(ConfigError, match="no such option"):
        _config("torchtitan-2024", 8, microbatch_group_size_per_vp_stage=4)


def test_megatron_core_2025_takes_its_option_and_2024_refuses_it():
    with pytest.raises(ConfigError, match="multiple of pipeline_model_parallel_size = 4 "
                                          r"\(Megatron-Core's groups of PP"):
        _config("megatron-core-2025", 6)
    six = _config("megatron-core-2025", 6, microbatch_group_size_per_vp_stage=6)
    assert six.microbatch_group == 6
    assert ddlsim.predict(six, check_fit=False).iteration_time_s > 0
    with pytest.raises(ConfigError, match="no such option"):
        _config("megatron-core-2024", 8, microbatch_group_size_per_vp_stage=4)
    with pytest.raises(ConfigError, match="needs schedule = 'interleaved'"):
        ddlsim.load_config({"model": "gpt2-124m", "parallel": {
            "pipeline_model_parallel_size": 2, "microbatch_group_size_per_vp_stage": 2},
            "system": {"preset": "dgx-a100", "nodes": 1}})


def test_groups_of_pp_given_outright_change_nothing():
    base = ddlsim.predict(_config("megatron-core-2025", 8), check_fit=False)
    given = ddlsim.predict(_config("megatron-core-2025", 8, microbatch_group_size_per_vp_stage=4),
                           check_fit=False)
    assert base.iteration_time_s == given.iteration_time_s
    assert "microbatch_group" not in base.to_dict()["plan"]


def test_larger_groups_hold_more_activations():
    """The warm-up grows with the group (2(p − s − 1) + (v − 1)·g forwards), and so does the
    first stage's peak of activations."""
    four = ddlsim.predict(_config("megatron-core-2025", 12), check_fit=False)
    twelve = ddlsim.predict(_config("megatron-core-2025", 12,
                                    microbatch_group_size_per_vp_stage=12), check_fit=False)
    assert twelve.memory.total > four.memory.total


def test_search_counts_each_stacks_rule():
    """A torchtitan grid over the global batch: 9 micro-batches rejected with torch's reason,
    10 evaluated (by the exact engine, as every FSDP2 stack)."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    data = {"model": "llama-3.1-8b",
            "parallel": {"pipeline_model_parallel_size": 4, "schedule": "interleaved",
                         "virtual_pipeline_model_parallel_size": 2, "zero_stage": 3,
                         "data_parallel_size": 1},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2025"}}
    grid = evaluate_grid(data, None, [], {"train.global_batch_size": [9, 10]},
                         Constraints(must_fit=False, max_gpus=4))
    assert list(grid.frame["train.global_batch_size"]) == [10]
    assert list(grid.rejected.values()) == [1]
    assert "rounds max(1, micro-batches // pipeline_model_parallel_size) = 2" in \
        next(iter(grid.rejected))


def test_a_vectorised_grid_with_torchs_other_groups_goes_to_the_exact_engine():
    """torchtitan's DDP plans with an even split are searched by the vectorised tier, whose
    closed form has groups of PP: a grid whose plans all have PP | m stays there; one with 10
    micro-batches on PP 4 (groups of 5) is searched by the exact engine, both plans ranked."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    data = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8},
            "parallel": {"pipeline_model_parallel_size": 4, "schedule": "interleaved",
                         "virtual_pipeline_model_parallel_size": 2, "data_parallel_size": 1,
                         "zero_stage": 0},   # DDP written (unset: the stack's, per plan)
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {
                "stack": "torchtitan-2025",
                "kernels": {"selective_recompute": "attention_core", "pipeline_split": "even"},
                "overlap": {"zero3_reshard_after_forward": "always", "zero3_copy_out": False}}}}
    limits = Constraints(must_fit=False, max_gpus=4)
    even = evaluate_grid(data, None, [], {"train.global_batch_size": [8, 12]}, limits).frame
    assert even.attrs["tier"] == "vectorised" and len(even) == 2
    other = evaluate_grid(data, None, [], {"train.global_batch_size": [8, 10]}, limits).frame
    assert other.attrs["tier"] == "exact"
    assert sorted(other["train.global_batch_size"]) == [8, 10]



@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 6), v=st.integers(2, 4), m=st.integers(2, 30), g=st.integers(2, 30))
def test_any_group_megatron_core_runs_gives_a_valid_order(p, v, m, g):
    """Every (PP, VPP, micro-batches, group) Megatron-Core's checks pass: each stage runs each
    (micro-batch, chunk) forward once, its backward later, the chunks' micro-batches in order,
    the warm-up of ``get_pp_rank_microbatches``; the arrays the builder reads agree."""
    if groups_refused("megatron_core", p, m, g):
        assert group_refusal("megatron_core", p, m, g) is not None
        return
    backward, _, mb, chunk, warm = schedule_arrays("interleaved", p, m, v, g)
    for s in range(p):
        order = schedule("interleaved", s, p, m, v, group=g)
        assert warm[s] == min(2 * (p - s - 1) + (v - 1) * g, m * v)
        done = set()
        for j, (kind, b, c) in enumerate(order):
            assert (kind == "B", b, c) == (bool(backward[s, j]), mb[s, j], chunk[s, j])
            assert ((b, c) in done) == (kind == "B")
            done.add((b, c))
        assert len(order) == 2 * m * v

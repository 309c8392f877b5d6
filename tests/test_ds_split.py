"""The ``deepspeed`` stack splits the transformer layers over its pipeline stages as DeepSpeed's
``type:transformer`` partition does (``workloads/decoder/ds_split.py``). Until 2026-12-01 a
layer count the stages do not divide (GPT-3 13B's 40 layers on PP 3) was refused as Megatron
refuses it, though DeepSpeed runs it."""

import numpy as np
import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder.ds_split import split_deepspeed
from ddlsim.workloads.decoder.split import chunk_layers


def _balanced(weights: list[int], parts: int) -> list[int]:
    """The linear-partition programme of DeepSpeed 38327e07 ``runtime/utils.py``
    ``partition_balanced``, written here apart (over arrays) from its description: contiguous
    parts of ``weights`` minimising the heaviest part's weight less the lightest's, the
    state after ``i`` items in ``j`` parts keeping the (heaviest, lightest) of its chosen
    split, the last of the equally good boundaries winning. Returns the boundaries."""
    n = len(weights)
    s = np.concatenate([[0.0], np.cumsum(weights)])
    hi = np.full((n + 1, parts + 1), np.inf)
    lo = np.full((n + 1, parts + 1), np.inf)
    cost = np.full((n + 1, parts + 1), np.inf)
    at = np.zeros((n + 1, parts + 1), dtype=int)
    hi[0, 0] = cost[0, 0] = 0.0
    i, k = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    seg = s[i] - s[k]                       # weight of items k..i-1, for k < i
    for j in range(1, parts + 1):
        top = np.maximum(hi[None, :, j - 1], seg)
        low = np.minimum(lo[None, :, j - 1], seg)
        with np.errstate(invalid="ignore"):
            c = top - low
        c = np.where((k < i) & ~np.isnan(c), c, np.nan)
        for row in range(j, n + 1):
            best = np.nanmin(c[row]) if not np.all(np.isnan(c[row])) else np.nan
            if np.isnan(best):
                continue
            kk = np.flatnonzero(c[row] == best)[-1]
            cost[row, j], hi[row, j], lo[row, j], at[row, j] = best, top[row, kk], low[row, kk], kk
    out = [n]
    for j in range(parts, 0, -1):
        out.append(at[out[-1], j])
    return out[::-1]


@pytest.mark.parametrize("after", [2, 3, 4])
@pytest.mark.parametrize("stages", [2, 3, 4, 5, 7, 8, 16, 24, 64])
def test_the_first_stages_take_the_remainder_as_deepspeeds_programme_does(stages, after):
    """Megatron-DeepSpeed lists two specs before the layers (the cast, the embedding) and
    two to four after (the MoE loss, the norm, the output, the cast back): the programme's
    layers per stage are the closed form's for every count from the stages to 200 (stepped)."""
    for layers in range(stages, 200, max(1, stages // 2)):
        weights = [0, 0] + [1] * layers + [0] * after
        b = _balanced(weights, stages)
        got = [sum(weights[b[s]:b[s + 1]]) for s in range(stages)]
        assert got == split_deepspeed(layers, stages), (layers, stages)


def _cfg(stack: str, pp: int, layers: int = 40, **parallel):
    return ddlsim.load_config({
        "model": {"preset": "gpt3-13b", "num_hidden_layers": layers},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": pp,
                     "data_parallel_size": 2, "zero_stage": 1, **parallel},
        "train": {"micro_batch_size": 1, "global_batch_size": 48, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 2, "software": stack}})


def test_40_layers_on_three_stages_run_as_deepspeed_splits_them():
    cfg = _cfg("deepspeed", 3)
    assert chunk_layers(cfg) == ((14,), (13,), (13,))
    a = ddlsim.predict(cfg, check_fit=False)
    d = ddlsim.predict(cfg, engine="des", check_fit=False)
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.02)
    assert "[14+13×2 layers per stage (deepspeed's split)]" in \
        cfg.family.plan_summary(cfg)
    assert ddlsim.predict(cfg, check_fit=False).to_dict()["plan"]["pipeline_split"] == "deepspeed"


def test_divisible_counts_keep_the_even_split_and_its_plan_line():
    cfg = _cfg("deepspeed", 4)
    assert chunk_layers(cfg) == ((10,),) * 4
    assert "deepspeed's split" not in cfg.family.plan_summary(cfg)


def test_deepspeed_2021_and_megatron_keep_their_refusal():
    """DeepSpeed v0.3.13 balanced with another search (not modelled); Megatron splits evenly."""
    for stack in ("deepspeed-2021", "megatron-core-2024"):
        with pytest.raises(ConfigError, match="40 is not divisible by"):
            ddlsim.build_workload(_cfg(stack, 3))


def test_fewer_layers_than_stages_are_refused_with_deepspeeds_reason():
    with pytest.raises(ConfigError, match="leaves a stage without a transformer layer"):
        ddlsim.build_workload(_cfg("deepspeed", 3, layers=2, tensor_model_parallel_size=1,
                                   data_parallel_size=1))


def test_search_sends_deepspeeds_uneven_split_to_the_exact_engine():
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    data = {"model": {"preset": "gpt3-13b", "num_hidden_layers": 40},
            "parallel": {"tensor_model_parallel_size": 2, "zero_stage": 1},
            "train": {"micro_batch_size": 1, "global_batch_size": 48, "seq_length": 2048},
            "system": {"preset": "dgx-a100", "nodes": 2, "software": "deepspeed"}}
    limits = Constraints(must_fit=False)
    even = evaluate_grid(data, None, [], {"parallel.pipeline_model_parallel_size": [2, 4]},
                         limits).frame
    assert even.attrs["tier"] == "vectorised" and len(even) == 2
    uneven = evaluate_grid(data, None, [], {"parallel.pipeline_model_parallel_size": [2, 3],
                                            "parallel.data_parallel_size": [2]},
                           limits).frame
    assert uneven.attrs["tier"] == "exact"
    assert sorted(uneven["parallel.pipeline_model_parallel_size"]) == [2, 3]

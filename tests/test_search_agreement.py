"""The vectorised tier agrees with the exact analytical engine on the issue's three grids, on
a sample (benchmarks/search_speed.py reports the full grids): the best plans it ranks and a
random sample of the others are predicted again by ddlsim.predict.

Targets (issue 13): p90 |error| <= 1 %, max <= 3 %, and the same top-10 set. Here the top-10
check is the part a sample can make: among the tier's best 15, the exact engine's best 10
are the tier's best 10.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.run import plan_overrides
from ddlsim.search.spec import Constraints

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import search_speed  # noqa: E402  (the benchmark's grids)
PLAN = {"parallel.tensor_model_parallel_size": [1, 2, 4, 8],
        "parallel.pipeline_model_parallel_size": [1, 2, 4, 8, 16],
        "parallel.virtual_pipeline_model_parallel_size": [None, 2, 4],
        "parallel.sequence_parallel": [False, True],
        "parallel.zero_stage": [0, 1, 3],
        "train.micro_batch_size": [1, 2],
        "train.recompute": ["selective", "full"]}
#: The benchmark's three systems and batches (benchmarks/search_speed.py), on smaller plans.
_BASES = [base for base, _ in search_speed.GRIDS.values()]
GRIDS = {
    "gpt3-175b on 1,024 A100s": (_BASES[0], PLAN),
    "llama-2-70b on 256 H100s": (_BASES[1], PLAN),
    "gpt2-124m on the 10 GbE CPU cluster": (
        _BASES[2],
        {**PLAN, "parallel.tensor_model_parallel_size": [1, 2, 4],
         "parallel.pipeline_model_parallel_size": [1, 2, 4],
         "parallel.virtual_pipeline_model_parallel_size": [None, 3],
         "train.micro_batch_size": [1, 4]}),
}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_agreement_with_the_exact_engine_on_a_sample(name):
    data, axes = GRIDS[name]
    grid = evaluate_grid(data, None, [], axes, Constraints())
    frame = grid.frame
    assert len(frame) > 100
    rng = np.random.default_rng(13)
    rest = rng.choice(np.arange(12, len(frame)), 8, replace=False).tolist()
    rows = list(range(12)) + rest
    columns = [c for c in frame.columns if "." in c]
    exact = {}
    for i in rows:
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        exact[i] = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    err = np.array([abs(frame["iteration_time_s"].iloc[i] / exact[i] - 1) for i in rows])
    assert np.percentile(err, 90) <= 0.01, sorted(err)[-5:]
    assert err.max() <= 0.03
    # The same top 10, up to ties the tier cannot resolve: a plan may swap across the 10th
    # place only with one whose exact time is within the tier's own largest error of it.
    best_exact = sorted(range(12), key=lambda i: (exact[i], i))[:10]
    tenth = exact[best_exact[-1]]
    for i in set(best_exact) ^ set(range(10)):
        assert abs(exact[i] / tenth - 1) <= err.max(), (i, exact[i], tenth)


def test_overlapped_param_gather_on_a_slow_network_agrees():
    """The plan family that was 4.3 % apart (10 GbE, PP 2, DP 16, ZeRO-1, micro-batch 2, four
    micro-batches per pipeline): the overlapped parameter gather outlasts stage 0's first
    forward, which holds every later stage; tier and exact engine agree to the issue's 3 %."""
    axes = {"parallel.tensor_model_parallel_size": [1],
            "parallel.pipeline_model_parallel_size": [2],
            "parallel.virtual_pipeline_model_parallel_size": [None],
            "parallel.sequence_parallel": [False], "parallel.zero_stage": [1, 2],
            "train.micro_batch_size": [2], "train.recompute": ["none"]}
    # ZeRO-2 under the default stack (Megatron-Core has none): an explicit what-if
    base = {**_BASES[2], "system": {**_BASES[2]["system"],
                                    "software": {"stack": "megatron-core-2024", "what_if": True}}}
    frame = evaluate_grid(base, None, [], axes, Constraints()).frame
    assert len(frame) == 2
    columns = [c for c in frame.columns if "." in c]
    for i in range(len(frame)):
        cfg = build_config(base, plan_overrides(frame.iloc[i], columns))
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=0.03)

"""The decoder family's memory floor (``DecoderVectors.memory_floor``: the model states of the
first and last stages) is never above its memory, to the last bit, so rejecting the plans over
capacity on the floor first (``search/evaluate.py``) changes neither the frame nor the
rejection counts; checked on every plan the rules pass, over four software stacks, the ZeRO
stages, recomputation and micro-batch sizes on a grid where many plans do not fit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ddlsim.search.decoder import DecoderVectors
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints

AXES = {"parallel.tensor_model_parallel_size": [1, 2, 8],
        "parallel.pipeline_model_parallel_size": [1, 2, 4],
        "parallel.zero_stage": [0, 1, 2, 3],
        "parallel.sequence_parallel": [False, True],
        "train.micro_batch_size": [1, 4],
        "train.recompute": ["none", "selective", "full"]}


def _data(stack: str) -> dict:
    return {"model": "gpt3-13b", "parallel": {},
            "system": {"preset": "dgx-a100", "nodes": 2, "software": stack},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}


@pytest.mark.parametrize("stack", ["megatron-lm-2021", "megatron-core-2024", "deepspeed",
                                   "deepspeed-2021"])
def test_floor_is_below_memory_and_moves_nothing(stack, monkeypatch):
    seen = []
    floor = DecoderVectors.memory_floor

    def recorded(self, ctx, plans):
        got = floor(self, ctx, plans)
        seen.append((ctx, plans, got[0]))
        return got
    monkeypatch.setattr(DecoderVectors, "memory_floor", recorded)
    grid = evaluate_grid(_data(stack), None, [], AXES, Constraints())
    assert seen and len(grid.frame)
    over = 0
    for ctx, plans, low in seen:
        memory, capacity = DecoderVectors().memory(ctx, plans)
        assert np.all(low <= memory)             # the premise, on every plan asked
        over += int(np.count_nonzero(low > capacity))
    assert over > 0                               # the floor does reject plans here
    monkeypatch.delattr(DecoderVectors, "memory_floor")
    plain = evaluate_grid(_data(stack), None, [], AXES, Constraints())
    pd.testing.assert_frame_equal(grid.frame, plain.frame, check_exact=True)
    assert list(grid.rejected.items()) == list(plain.rejected.items())

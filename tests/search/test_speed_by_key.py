"""Issue 27's speed target, the eighth round: work a cold grid did that its figures never
needed. Each change is specified by the work it replaces giving the same numbers:

* a layer's and the head's op lists are found by their piece keys, not hashed by value
  (:data:`ddlsim.search.blocks._RECURRING`: only the embedding, batch-loading and gather
  pieces recur under other keys), so a rare duplicate is lowered twice, to the same seconds;
* one plan's gradient bucket is computed without numpy
  (:func:`ddlsim.workloads.decoder.dpsync.grad_bucket_bytes`, three calls a plan
  resolution), the float numpy gives;
* the decoder's resolved plan sets its fields in its ``__dict__`` at once
  (:func:`ddlsim.workloads.payloads._quick_init` on a dataclass without slots).
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from ddlsim.config import build_config
from ddlsim.search import blocks
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints
from ddlsim.workloads.decoder.dpsync import grad_bucket_bytes
from ddlsim.workloads.decoder.plan import DecoderPlan

GPT2 = {"model": "gpt2-124m", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 1024}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2, 4],
        "parallel.pipeline_model_parallel_size": [1, 2, 4],
        "parallel.sequence_parallel": [False, True], "parallel.zero_stage": [0, 1, 3],
        "train.micro_batch_size": [1, 2], "train.recompute": ["none", "selective", "full"]}


def test_the_recurring_pieces_are_pieces():
    assert blocks._RECURRING <= set(blocks._PIECES)


def test_pieces_found_by_key_give_the_frame_found_by_value(monkeypatch):
    by_key = evaluate_grid(GPT2, None, [], AXES, Constraints())
    monkeypatch.setattr(blocks, "_RECURRING", frozenset(blocks._PIECES))   # all by value
    by_value = evaluate_grid(GPT2, None, [], AXES, Constraints())
    assert len(by_key.frame) > 100
    assert by_key.frame.equals(by_value.frame)
    assert by_key.rejected == by_value.rejected


@pytest.mark.parametrize("overlap", [True, False])
def test_one_plans_bucket_is_numpys_float(overlap):
    cfg = build_config({**GPT2, "system": {"preset": "dgx-a100", "nodes": 2,
                                           "software": "megatron-core-2024"}},
                       ["parallel.tensor_model_parallel_size=2",
                        f"parallel.overlap_grad_reduce={str(overlap).lower()}"])
    for dp in (1, 2, 8, 40, 41, 1024):
        for gdt in (2, 4):
            for stage, chunk in ((0, 0), (1, 0), (0, 1)):
                one = grad_bucket_bytes(cfg, dp, gdt, stage, chunk)
                many = grad_bucket_bytes(cfg, np.array([dp]), gdt, stage, chunk)
                assert float(np.ravel(many)[0]) == one and isinstance(one, float)


def test_the_resolved_plan_is_made_as_its_dataclass_makes_it():
    fields = [f.name for f in dataclasses.fields(DecoderPlan)]
    ns = {"__annotations__": {f.name: f.type for f in dataclasses.fields(DecoderPlan)},
          "__module__": DecoderPlan.__module__}
    plain = dataclasses.dataclass(frozen=True, eq=False)(type("DecoderPlan", (), ns))
    assert inspect.signature(DecoderPlan) == inspect.signature(plain)
    values = {name: object() for name in fields}
    plan = DecoderPlan(**values)
    assert list(vars(plan)) == fields
    assert vars(plan) == vars(plain(**values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tp = 2

"""The probes of the config's own rules (:func:`ddlsim.search.planconfig.group_rules`) validate
each distinct ``parallel`` and ``train`` section once (issue 27's speed target): with the
caller's memo, :func:`~ddlsim.search.planconfig.plan_config` gives the config, or raises the
message, that it gives without one."""

from __future__ import annotations

import pytest

from ddlsim.config import TrainConfig
from ddlsim.configload import build_config
from ddlsim.errors import ConfigError
from ddlsim.search.planconfig import plan_config, plan_sections

DATA = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}
PLANS = [{"parallel.tensor_model_parallel_size": 2, "train.global_batch_size": 64},
         {"parallel.tensor_model_parallel_size": 4, "train.global_batch_size": 64},
         {"parallel.tensor_model_parallel_size": 3, "train.global_batch_size": 64},
         {"parallel.pipeline_model_parallel_size": 2, "train.micro_batch_size": 0},
         {"parallel.tensor_model_parallel_size": 2, "train.global_batch_size": 64}]


def _outcome(plan, memo=None):
    base = build_config(DATA)
    try:
        return plan_config(plan_sections(DATA, None, []), base, plan, memo).model_dump()
    except ConfigError as exc:
        return str(exc)


def test_a_memo_changes_no_config_and_no_message():
    memo: dict = {}
    with_memo = [_outcome(p, memo) for p in PLANS]
    assert with_memo == [_outcome(p) for p in PLANS]
    assert any(isinstance(o, str) for o in with_memo)        # a refused plan among them
    assert with_memo[0] == with_memo[-1]


def test_each_distinct_section_is_validated_once(monkeypatch):
    base, sections = build_config(DATA), plan_sections(DATA, None, [])
    calls = []
    validate = TrainConfig.model_validate.__func__

    def counted(cls, value, *args, **kwargs):
        calls.append(value)
        return validate(cls, value, *args, **kwargs)
    monkeypatch.setattr(TrainConfig, "model_validate", classmethod(counted))
    memo: dict = {}
    for plan in PLANS:
        try:
            plan_config(sections, base, plan, memo)
        except ConfigError:
            pass
    # two distinct train sections among the five plans (the fourth's micro-batch of 0)
    assert len(calls) == 2


def test_a_refused_section_is_refused_again_from_the_memo():
    memo: dict = {}
    plan = {"train.micro_batch_size": 0}
    for _ in range(2):
        with pytest.raises(ConfigError, match="micro_batch_size"):
            plan_config(plan_sections(DATA, None, []), build_config(DATA), plan, memo)

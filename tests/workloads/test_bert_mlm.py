"""The bert family's ``mlm_predictions_per_seq``: the MLM transform and decoder over the masked
tokens only (NVIDIA DeepLearningExamples' dense sequence output), derived by hand."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError


def _cfg(**model):
    return ddlsim.load_config({
        "model": {"preset": "bert-large", **model}, "parallel": {"data_parallel_size": 1},
        "train": {"micro_batch_size": 4, "global_batch_size": 4, "seq_length": 128,
                  "dtype": "fp16"},
        "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 1}})


def test_the_head_runs_over_the_masked_tokens_only():
    full, masked = _cfg().model, _cfg(mlm_predictions_per_seq=20).model
    h, v, b = 1024, 30522, 4
    # pooler + NSP: 2·b·(h² + 2h); MLM transform and decoder: 2·b·tokens·(h² + h·V)
    pooler_nsp = 2.0 * b * (h * h + 2 * h)
    assert full.head_flops(b, 128) == pooler_nsp + 2.0 * b * 128 * (h * h + h * v)
    assert masked.head_flops(b, 128) == pooler_nsp + 2.0 * b * 20 * (h * h + h * v)
    assert masked.mlm_tokens(128) == 20 and masked.mlm_tokens(16) == 16
    assert full.mlm_tokens(128) == 128
    # the layers are untouched: only the head's share of the step shrinks
    assert masked.layer_flops(b, 128) == full.layer_flops(b, 128)


def test_fewer_head_tokens_make_a_shorter_step():
    t_full = ddlsim.predict(_cfg()).iteration_time_s
    t_masked = ddlsim.predict(_cfg(mlm_predictions_per_seq=20)).iteration_time_s
    assert t_masked < t_full


def test_a_non_positive_count_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="mlm_predictions_per_seq"):
        _cfg(mlm_predictions_per_seq=0)


def test_the_model_line_names_the_masked_head():
    assert "MLM head over 20 masked tokens" in _cfg(mlm_predictions_per_seq=20).model.summary_line()
    assert "masked" not in _cfg().model.summary_line()

"""A model whose first layers are dense and the rest MoE (DeepSeek's ``first_k_dense_replace``)
under context parallelism: the attention core's FLOPs are asked of either kind of layer (they
are the same), which raised "26 of 27 layers are MoE layers" until 2026-11-30."""

from __future__ import annotations

import pytest

import ddlsim


@pytest.mark.parametrize("parallel", [
    {"tensor_model_parallel_size": 8, "sequence_parallel": True, "context_parallel_size": 2},
    {"tensor_model_parallel_size": 2, "sequence_parallel": True, "context_parallel_size": 2,
     "expert_model_parallel_size": 2}])
def test_a_dense_then_moe_model_predicts_under_context_parallelism(parallel):
    cfg = ddlsim.load_config({
        "model": "deepseek-v2-lite", "parallel": parallel,
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2025"}})
    shape = cfg.model.shape()
    assert 0 < shape.moe_layers < shape.layers          # both kinds of layer
    r = ddlsim.predict(cfg, check_fit=False)
    assert r.iteration_time_s > 0

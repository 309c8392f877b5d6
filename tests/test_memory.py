"""Memory per device: ZeRO model states (ZeRO paper Table 1) and Korthikanti activations."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.errors import PlanDoesNotFitError
from ddlsim.workloads.memory import model_state_bytes
from ddlsim.workloads.models.gpt import GPTShape


@pytest.mark.parametrize("stage, gigabytes", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_table1(stage, gigabytes):
    # Rajbhandari et al. 2020, Table 1: Ψ = 7.5 B, N_d = 64, K = 12
    total = sum(model_state_bytes(7.5e9, 64, stage, "fp16", "adam"))
    assert total / 1e9 == pytest.approx(gigabytes, rel=0.005)


def test_korthikanti_activation_formulas():
    s = GPTShape(L=1, h=12288, a=96, f=4 * 12288, V=1, s_max=2048)
    b, seq, t = 1, 2048, 8
    sbh = seq * b * s.h
    assert s.layer_activation_bytes(b, seq, t, False, "none") == pytest.approx(
        sbh * (10 + 24 / t + 5 * s.a * seq / (s.h * t)))
    assert s.layer_activation_bytes(b, seq, t, True, "none") == pytest.approx(
        sbh / t * (34 + 5 * s.a * seq / s.h))
    assert s.layer_activation_bytes(b, seq, t, True, "selective") == pytest.approx(sbh / t * 34)
    assert s.layer_activation_bytes(b, seq, t, False, "full") == pytest.approx(2 * sbh)


def test_1f1b_first_stage_holds_p_microbatches(base_dict):
    base_dict["train"]["global_batch_size"] = 64
    cfg = ddlsim.load_config(base_dict)
    from ddlsim.workloads.memory import inflight_chunks
    assert inflight_chunks(cfg, 0) == cfg.parallel.pp
    assert inflight_chunks(cfg, cfg.parallel.pp - 1) == 1
    # Megatron-Core has no GPipe (rule no_gpipe): a what-if of its stack
    g = ddlsim.load_config(base_dict, ["parallel.schedule=gpipe",
                                       "system.software={stack: megatron-core-2024, what_if: true}"])
    assert inflight_chunks(g, 0) == g.num_microbatches


def test_plan_that_does_not_fit_names_the_breakdown():
    cfg = {"model": "gpt3-175b", "parallel": {"tensor_model_parallel_size": 8},
           "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
           "system": {"preset": "dgx-a100", "nodes": 1}}
    with pytest.raises(PlanDoesNotFitError) as err:
        ddlsim.predict(cfg)
    msg = str(err.value)
    assert "does not fit in memory" in msg and "optimizer" in msg and "activations" in msg
    # 8 devices, all tensor-parallel: no valid plan has more pipeline stages (see
    # tests/test_memory_advice.py); the advice lists what is valid, with its memory
    assert "Changes valid for this plan" in msg and "recompute = 'full'" in msg
    assert "pipeline_model_parallel_size" not in msg
    assert err.value.memory.total > err.value.memory.capacity
    # the caller may still ask for the timing
    assert ddlsim.predict(copy.deepcopy(cfg), check_fit=False).iteration_time_s > 0

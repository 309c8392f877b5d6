"""The interleaved schedule's later-chunk parameter wait (``F<v-1>.pg``) exists per stage: a
stage whose later chunks' parameters fit in the update's first bucket has none, and the
step tables must not name it there (a GPT-2 plan on a CPU cluster raised "program steps name
unknown blocks: ['F2.pg']" in both engines)."""

import warnings

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.decoder import param_gather

CFG = {"model": "gpt2-124m", "system": {"preset": "cpu-10gbe", "nodes": 16},
       "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 1024,
                 "dtype": "fp32"},
       "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
                    "data_parallel_size": 4, "virtual_pipeline_model_parallel_size": 3,
                    "schedule": "interleaved", "zero_stage": 1, "sequence_parallel": True,
                    "overlap_grad_reduce": True}}


@pytest.fixture(scope="module")
def cfg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(CFG)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_stages_without_the_later_wait_predict(cfg, engine):
    r = ddlsim.predict(cfg, engine, check_fit=False)
    assert r.iteration_time_s > 0


def test_only_stages_with_later_chunks_wait(cfg):
    name = param_gather.waiting_block_name(2)
    classes = build_workload(cfg).classes
    has = [name in c.program.blocks for c in classes]
    named = [name in c.program.steps.names for c in classes]
    assert has == named
    assert any(has) and not all(has)     # the plan mixes both kinds of stage

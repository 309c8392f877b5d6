"""Shared fixtures: small run configs built from presets."""

from __future__ import annotations

import copy

import pytest

import ddlsim

BASE = {
    "model": "gpt3-1.3b",
    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
    "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
    "system": {"preset": "dgx-a100", "nodes": 1},
}


@pytest.fixture
def base_dict():
    return copy.deepcopy(BASE)


@pytest.fixture
def small_cfg():
    return ddlsim.load_config(copy.deepcopy(BASE))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/predictions.json from the current predictions")

"""``ddlsim search --dask``: the exact re-evaluations run as Dask tasks on a LocalCluster of 2
worker processes and give the serial frame, bit for bit."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

import ddlsim

needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="dask distributed is not installed (pip install "
                                       "'ddlsim[dask]')")
CONFIG = {"model": "gpt3-1.3b", "parallel": {},
          "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
          "system": {"preset": "dgx-a100", "nodes": 1}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2, 4],
        "parallel.pipeline_model_parallel_size": [1, 2], "train.recompute": ["none", "full"]}


@needs_dask
def test_local_cluster_of_two_processes_gives_the_serial_frame():
    serial = ddlsim.search(CONFIG, AXES, top=6)
    on_dask = ddlsim.search(CONFIG, AXES, top=6, dask="local", dask_workers=2)
    assert serial["exact_iteration_time_s"].notna().sum() == 6
    pd.testing.assert_frame_equal(serial, on_dask, check_exact=True)
    assert serial.attrs == on_dask.attrs


@needs_dask
def test_an_exact_tier_grid_runs_its_plans_on_dask_and_gives_the_serial_frame():
    """ResNet has no vectorised form: each plan of its grid is one ``predict``, here a Dask
    task on the same LocalCluster as the re-evaluations (a plan refused by its config is a
    rejection with the config's reason either way)."""
    config = {"model": "resnet50", "parallel": {"data_parallel_size": 8},
              "train": {"micro_batch_size": 64, "global_batch_size": 512, "seq_length": 1,
                        "dtype": "bf16", "optimizer": "sgd"},
              "system": {"preset": "dgx-a100", "nodes": 1}}
    axes = {"train.micro_batch_size": [32, 64, 48],
            "parallel.overlap_grad_reduce": [False, True]}
    serial = ddlsim.search(config, axes, top=3, constraints={"global_batch_size": 512})
    on_dask = ddlsim.search(config, axes, top=3, constraints={"global_batch_size": 512},
                            dask="local", dask_workers=2)
    assert serial.attrs["tier"] == "exact" and len(serial) == 4
    assert serial.attrs["rejected"] and serial.attrs["rejected"] == on_dask.attrs["rejected"]
    pd.testing.assert_frame_equal(serial, on_dask, check_exact=True)
    assert serial.attrs == on_dask.attrs

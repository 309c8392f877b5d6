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

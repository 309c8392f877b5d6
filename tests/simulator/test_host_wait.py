"""The device's wait for the host is its own part of the breakdown (``Breakdown.host_s``),
in both engines: neither pipeline bubble (there is no pipeline at PP 1) nor exposed
communication (the host stream moves no bytes)."""

from __future__ import annotations

import pytest

import ddlsim

#: DeepSeek-V2-Lite at TP 8 without expert parallelism: 64 local experts a rank, each with a
#: few hundred tokens, so Transformer Engine's per-expert host work leaves the host behind the
#: device (docs/moe.md "Grouped GEMM as Transformer Engine runs it").
HOST_BOUND = {"model": "deepseek-v2-lite",
              "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True},
              "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 2048},
              "system": {"preset": "dgx-h100", "nodes": 4, "software": "megatron-core-2025"}}


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_a_host_bound_step_books_its_idle_time_as_waiting_for_the_host(engine):
    r = ddlsim.predict(ddlsim.load_config(HOST_BOUND), engine=engine, check_fit=False)
    b = r.breakdown
    parts = (b.compute_s + b.optimizer_s + sum(b.exposed_comm_s.values()) + b.bubble_s
             + b.host_s)
    assert parts == pytest.approx(r.iteration_time_s, rel=1e-9)
    assert b.host_s > 0.5 * r.iteration_time_s     # most of the step waits for the host
    assert b.bubble_s < 1e-9 * r.iteration_time_s  # PP 1: no bubble
    assert "other" not in b.exposed_comm_s          # the host's tail is not communication
    assert r.to_dict()["breakdown"]["host_s"] == b.host_s


def test_the_report_names_the_wait_for_the_host():
    from ddlsim.report import _breakdown_table
    r = ddlsim.predict(ddlsim.load_config(HOST_BOUND), check_fit=False)
    labels = list(_breakdown_table([r]).columns[0].cells)
    assert "waiting for the host" in labels and "pipeline bubble / wait" not in labels

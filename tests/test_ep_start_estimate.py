"""benchmarks/ep_start_estimate.py: the measured start rule's first-order delays on a timeline
(synthetic spans; the script's own run predicts the validate_moe rows with the DES, minutes)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from benchscripts import load_script

from ddlsim.workloads.trace import Compute, Kernel

est = load_script("ep_start_estimate")


class _Dev(NS):
    pass


def _gemm(m: float, n: float) -> Kernel:
    return Kernel("gemm", (m, n, 4096.0), dtype="bf16")


def test_last_round_of_the_tiles():
    # 32 x 28 tiles of 256 x 128 on 132 SMs: 6.79 rounds, the last from 6/6.79 of the kernel
    assert est._last_round(_gemm(8192, 3584), 132) == pytest.approx(6 / (896 / 132))
    assert est._last_round(_gemm(1024, 1024), 132) == 0.0      # 32 tiles: SMs left free


def test_mid_gemm_waits_for_the_last_round_and_a_boundary_race_by_q(monkeypatch):
    monkeypatch.setattr("ddlsim.simulator.kernels.kernel_time", lambda k, dev: 1.0)
    dev = _Dev(sm_count=132)
    g = _gemm(8192, 3584)                               # last round at 6/6.79 of the kernel
    payloads = {"fwd.qkv": Compute("fwd.qkv", 0.0, kernels=(g,))}
    span = lambda stream, name, a, b: NS(stream=stream, name=name, start_s=a, end_s=b)  # noqa
    spans = [span("compute", "fwd.qkv", 0.0, 1.0), span("compute", "fwd.qkv", 1.0, 2.0),
             span("ep", "fwd.dispatch", 0.5, 0.6),    # mid-GEMM, in a full round
             span("ep", "bwd.combine", 1.0, 1.1),     # as the second GEMM starts: a race
             span("ep", "fwd.combine", 0.95, 1.0)]    # in the first GEMM's last round
    last = 6 / (896 / 132)
    total, mid, edge = est.delays(spans, payloads, dev, q=0.5)
    assert (mid, edge) == (1, 1)
    assert total == pytest.approx((last - 0.5) + 0.5 * last)

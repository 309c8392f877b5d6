"""A compute op with a given duration (``Compute.seconds``: a proxy's ``usleep``, a measured
kernel) takes exactly that long in both engines, whatever its FLOPs, and is validated."""

from __future__ import annotations

import numpy as np
import pytest
from scenarios import cluster, cost_model

from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from ddlsim.workloads.trace import (Block, Collective, Compute, GroupFamily, Op, Program,
                                    RankClass, Step, Workload)

P = 4


def _workload(seconds: float) -> Workload:
    group = GroupFamily("dp", "dp", np.arange(P).reshape(1, P))
    ops = (Op(Compute("sleep", 1e15, seconds=seconds)),
           Op(Collective("ar", "all_reduce", "dp", 1e6, algorithm="ring"), stream="dp",
              deps=(0,)))
    program = Program({"b": Block("b", "forward", ops)}, (Step("b"),))
    return Workload("sleepy", P, {"dp": group}, (RankClass("all", tuple(range(P)), program),))


@pytest.mark.parametrize("seconds", [0.0, 0.25, 1.5])
def test_given_seconds_is_the_duration_in_both_engines(seconds):
    system = cluster(1, P, "switch")
    wl = _workload(seconds)
    wl.validate()
    cost = cost_model(system, wl)
    assert cost.compute(Compute("sleep", 1e15, seconds=seconds)) == seconds
    ar = cost.collective(Collective("ar", "all_reduce", "dp", 1e6, algorithm="ring"))
    exact = simulate_analytical(wl, cost).timings[0]
    assert exact.end == pytest.approx(seconds + ar, rel=1e-12)
    assert exact.compute == pytest.approx(seconds, rel=1e-12, abs=1e-15)
    des = run_des(wl, cost_model(system, wl))[0].timings[0]
    assert des.end == pytest.approx(seconds + ar, rel=1e-6)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_given_seconds_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match="seconds must be finite and >= 0"):
        Compute("sleep", 1.0, seconds=bad)

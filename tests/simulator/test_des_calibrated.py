"""With a calibration profile both engines price a collective by the profile's curve.

The analytical engine takes the profile's time ``alpha + beta * S``; the DES runs the same
algorithm's flows stretched to that time (:mod:`ddlsim.simulator.des.calibrated`), so a
collective alone takes exactly the profile's time in both, and next to other traffic the
DES shares its links. The profiles here are test fixtures (round alpha and beta), not
measurements.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.schema import OPS as PROFILE_OPS
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.collectives import algorithms_for
from ddlsim.simulator.costs import CostModel
from ddlsim.simulator.des import run_des
from ddlsim.simulator.des.calibrated import alone_seconds, stretch_template
from ddlsim.simulator.des.templates import FlowTemplate, PhaseFlows
from scenarios import (cluster, concurrent_collectives, single_collective,
                       uneven_all_to_all)

ALPHA_S, BETA_S_PER_B = 30e-6, 1 / 3e9   # 30 us, 3 GB/s: slower than the 100 GB/s links
OPS = [(op, algo) for op in PROFILE_OPS for algo in algorithms_for(op, "mpi")]


def profile(op: str, p: int, nodes: int) -> CalibrationProfile:
    """One mpi entry for ``op`` on ``p`` ranks over ``nodes`` nodes."""
    return CalibrationProfile.from_dict({"version": 1, "comm": [{
        "backend": "mpi", "op": op, "scope": "intra" if nodes == 1 else "inter", "ranks": p,
        "nodes": nodes, "ranks_per_node": p // nodes,
        "segments": [{"min_bytes": 0, "alpha_s": ALPHA_S, "beta_s_per_B": BETA_S_PER_B}]}]})


def both(workload, system, prof: CalibrationProfile) -> tuple[float, float, dict]:
    """(analytical, DES) end of the one class, and the analytical algorithm labels."""
    cost = CostModel(system, workload, {}, profile=prof, backend="mpi")
    run = simulate_analytical(workload, cost)
    des, _ = run_des(workload, CostModel(system, workload, {}, profile=prof, backend="mpi"),
                     record_spans=False)
    return run.timings[0].end, des.timings[0].end, run.algorithms


@pytest.mark.parametrize("op,algo", OPS, ids=[f"{o}-{a}" for o, a in OPS])
@pytest.mark.parametrize("g", [1, 4])
@pytest.mark.parametrize("nbytes", [64e3, 256e6])
def test_a_calibrated_collective_alone_takes_the_profiles_time_in_both(op, algo, g, nbytes):
    p = 4
    wl = single_collective(op, algo, nbytes, p)
    analytical, des, labels = both(wl, cluster(p // g, g), profile(op, p, p // g))
    assert list(labels.values()) == ["mpi (calibrated)"]
    assert analytical == pytest.approx(ALPHA_S + BETA_S_PER_B * nbytes, rel=1e-12)
    assert des == pytest.approx(analytical, rel=1e-9)


def test_an_uneven_all_to_all_is_stretched_by_the_closed_form():
    # the DES alone is not uniform (unequal flows): the closed form's time sets the stretch,
    # exact where the engines agree (one switch, one rank per node)
    mib = 2.0 ** 20
    wl = uneven_all_to_all([8 * mib, 2 * mib, 2 * mib, 2 * mib], "direct")
    analytical, des, _ = both(wl, cluster(4, 1), profile("all_to_all", 4, 4))
    assert analytical == pytest.approx(ALPHA_S + BETA_S_PER_B * 4 * 8 * mib, rel=1e-12)
    assert des == pytest.approx(analytical, rel=0.01)


def test_concurrent_calibrated_collectives_share_their_links_in_the_des():
    # two all-reduces issued together on the same ranks: alone each takes t; the analytical
    # engine stretches concurrent collectives of one family by their number (2t), the DES
    # shares the links of the two stretched flow sets (2t as well: both move at half rate)
    nbytes = 64e6
    wl = concurrent_collectives([("all_reduce", "ring", nbytes, 0)] * 2, 4)
    analytical, des, _ = both(wl, cluster(1, 4), profile("all_reduce", 4, 1))
    t = ALPHA_S + BETA_S_PER_B * nbytes
    assert des == pytest.approx(analytical, rel=0.01)
    assert 2 * t * 0.99 <= des <= 2 * t * 1.01


def _template(latency_s: float) -> FlowTemplate:
    """One instance of one phase with no flows and ``latency_s`` per step."""
    phase = PhaseFlows(np.empty((0, 1), dtype=np.int64), np.empty(0), np.array([0, 0]),
                       np.array([latency_s]), 1.0, 1)
    return FlowTemplate("t", np.array([[0, 1]]), (phase,))


def test_a_template_that_takes_no_time_alone_becomes_a_delay_of_the_measured_time():
    capacity = np.array([np.inf])
    assert alone_seconds(_template(0.0), 1e6, capacity) == 0.0
    delay = stretch_template(_template(0.0), 2.5e-3, 0.0)
    assert delay.name == "t (calibrated)"
    assert alone_seconds(delay, 1e6, capacity) == pytest.approx(2.5e-3, rel=1e-15)


def test_a_stretch_scales_latency_and_bytes_by_one_factor():
    tpl = _template(4e-6)
    got = stretch_template(tpl, 12e-6, 4e-6)
    assert got.phases[0].latency_s[0] == pytest.approx(12e-6, rel=1e-15)
    assert got.phases[0].bytes_per_byte == pytest.approx(3.0, rel=1e-15)

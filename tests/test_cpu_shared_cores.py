"""A CPU rank with no spare core runs its collectives on its compute's core
(``device.spare_cores = 0``, :mod:`ddlsim.simulator.hostcollectives`): a collective the trace
issues beside compute adds to it, in both engines; a device with spare cores, or a GPU, keeps
the overlap."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.config import SystemConfig
from ddlsim.presets import get_preset
from ddlsim.reference.machine import local_system
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.costs import CostModel
from ddlsim.simulator.des import run_des
from ddlsim.simulator.hostcollectives import on_compute_cores
from ddlsim.workloads.trace import (Block, Collective, Compute, GroupFamily, Loop, Op, Program,
                                    RankClass, Step, Wait, Workload)

P = 2
GEMM_S = 0.010   # the compute beside the gather, seconds (given: Compute.seconds)
GATHER = Collective("ag", "all_gather", "dp", 8e6)


def _system(spare: int | None) -> SystemConfig:
    """Two ranks of one CPU node, 1 GB/s between them (a gather of 8 MB takes ms), with
    ``spare`` spare cores per rank (None: not stated)."""
    doc = local_system(P, 1e11, 1e10, (1e-5, 1e9), 1e9, "a test")
    if spare is not None:
        doc["device"]["spare_cores"] = spare
    return SystemConfig.model_validate(doc)


def _workload(looped: bool = False) -> Workload:
    """A gather issued on ``dp`` beside a GEMM on ``compute`` (a prefetched all-gather beside
    the layer before it), then a join; optionally inside a loop of two."""
    ops = (Op(GATHER, stream="dp"), Op(Compute("gemm", 1e12, seconds=GEMM_S)),
           Op(Wait("join", "dp")))
    if looped:
        ops = (Op(Loop("layers", ops, 2)),)
    group = GroupFamily("dp", "dp", np.arange(P).reshape(1, P))
    program = Program({"b": Block("b", "forward", ops)}, (Step("b"),))
    return Workload("gather-beside-gemm", P, {"dp": group},
                    (RankClass("all", tuple(range(P)), program),))


def _ends(system: SystemConfig, wl: Workload) -> tuple[float, float, float]:
    """(analytical end, DES end, the gather's seconds) of ``wl`` on ``system``."""
    cost = CostModel(system, wl)
    gather = cost.collective(GATHER)
    exact = simulate_analytical(wl, cost).timings[0].end
    des = run_des(wl, CostModel(system, wl))[0].timings[0].end
    return exact, des, gather


@pytest.mark.parametrize("looped", [False, True])
def test_no_spare_core_adds_the_gather_to_the_gemm_in_both_engines(looped):
    wl = _workload(looped)
    wl.validate()
    exact, des, gather = _ends(_system(0), wl)
    assert gather > 1e-3   # the gather is worth overlapping at all
    serial = (1 + looped) * (gather + GEMM_S)
    assert exact == pytest.approx(serial, rel=1e-9)
    assert des == pytest.approx(serial, rel=1e-6)


@pytest.mark.parametrize("spare", [None, 1])
def test_a_spare_core_keeps_the_overlap(spare):
    exact, des, gather = _ends(_system(spare), _workload())
    assert exact == pytest.approx(max(gather, GEMM_S), rel=1e-9)
    assert des == pytest.approx(max(gather, GEMM_S), rel=1e-6)


def test_the_gather_is_booked_as_exposed_communication():
    wl = _workload()
    cost = CostModel(_system(0), wl)
    t = simulate_analytical(wl, cost).timings[0]
    assert t.exposed["dp"] == pytest.approx(cost.collective(GATHER), rel=1e-9)
    assert t.compute == pytest.approx(GEMM_S, rel=1e-9)


def test_only_collectives_move_and_a_gpu_trace_is_left_alone():
    wl = _workload(looped=True)
    moved = on_compute_cores(wl, _system(0))
    body = moved.classes[0].program.blocks["b"].ops[0].payload.body
    assert [o.stream for o in body] == ["compute", "compute", "compute"]
    assert isinstance(body[2].payload, Wait) and body[2].payload.stream == "dp"
    for name in ("dgx-h100", "kvm-2core"):   # no spare_cores stated: the trace itself
        assert on_compute_cores(wl, SystemConfig.model_validate(get_preset("system", name))) \
            is wl
    assert on_compute_cores(wl, _system(1)) is wl


@pytest.mark.parametrize("ranks, cores, spare", [(2, 2, 0), (1, 2, 1), (2, 5, 1), (1, 1, 0)])
def test_the_loops_system_states_its_spare_cores(ranks, cores, spare):
    doc = local_system(ranks, 1e11, 1e10, (1e-5, 1e9), 1e9, "a test", cores=cores)
    assert doc["device"]["spare_cores"] == spare
    assert "spare_cores" not in local_system(ranks, 1e11, 1e10, (1e-5, 1e9), 1e9,
                                             "a test")["device"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "two"])
def test_spare_cores_must_be_a_count(bad):
    doc = local_system(P, 1e11, 1e10, (1e-5, 1e9), 1e9, "a test")
    doc["device"]["spare_cores"] = bad
    with pytest.raises(ValueError, match="spare_cores"):
        SystemConfig.model_validate(doc)


def test_the_torch_loops_fsdp_run_loses_its_overlap_on_two_ranks_of_two_cores():
    """The torch loop's FSDP2 run (ddlsim/reference/torch_loop.py) on the system its loop
    builds: with one core a rank, the first backward gather (beside the head's backward) and
    the last block's reduce-scatter (beside the embedding's) no longer hide; with a spare
    core they do; both engines alike."""
    import ddlsim
    from ddlsim.reference.loop import SMALL
    from ddlsim.reference.torch_loop import TORCH_STACK, torch_model, torch_run_config
    ends = {}
    for cores in (2, 4):
        system = local_system(P, 1e11, 1e10, (1e-5, 1e9), 1e9, "a test", cores=cores)
        system["software"] = TORCH_STACK
        cfg = ddlsim.load_config(torch_run_config(torch_model(SMALL), P, "torch-fsdp", system))
        ends[cores] = [ddlsim.predict(cfg, e).iteration_time_s for e in ("analytical", "des")]
    for serial, overlapped in zip(ends[2], ends[4]):
        assert serial > overlapped * 1.01
    assert ends[2][1] == pytest.approx(ends[2][0], rel=1e-6)

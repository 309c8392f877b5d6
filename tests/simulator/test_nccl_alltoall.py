"""NCCL's all-to-all as grouped sends (collectives/nccl/p2p.py): NVLink at the share NCCL
fills (NVIDIA/nccl-tests#212: "an effective NVLink bandwidth of 370GB/s" on H100)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.simulator.collectives import algorithms_for
from ddlsim.simulator.collectives.nccl.tuning import NVLINK_EFFICIENCY

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _lone(op: str, p: int, size: float, engine: str) -> tuple[float, str]:
    """(seconds, algorithm label) of one ``op`` on ``p`` GPUs of dgx-h100 under NCCL."""
    from ddlsim.config import SystemConfig, resolve_section
    from ddlsim.simulator.analytical.engine import simulate_analytical
    from ddlsim.simulator.costs import CostModel
    from ddlsim.workloads.trace import (Block, Collective, GroupFamily, Op, Program, RankClass,
                                        Step, Workload, WorkloadMeta)
    system = SystemConfig.model_validate(resolve_section("system", {"preset": "dgx-h100",
                                                                     "nodes": p // 8 or 1}))
    coll = Collective("x", op, "g", size)
    program = Program({"b": Block("b", "other", (Op(coll),))}, (Step("b"),))
    wl = Workload("a2a", p, {"g": GroupFamily("g", "ep", np.arange(p).reshape(1, p))},
                  (RankClass("all", tuple(range(p)), program),), WorkloadMeta(1, 1))
    cost = CostModel(system, wl)
    if engine == "des":
        from ddlsim.simulator.des import run_des
        return run_des(wl, cost, record_spans=False)[0].timings[0].end, cost.choice(coll).label
    return simulate_analytical(wl, cost).timings[0].end, cost.choice(coll).label


def test_nccl_runs_all_to_all_as_grouped_sends():
    assert algorithms_for("all_to_all", "nccl") == ["nccl_p2p"]


def test_eight_h100s_reach_the_effective_nvlink_bandwidth_not_the_line_rate():
    size = 8 * 2**30
    t, label = _lone("all_to_all", 8, size, "analytical")
    busbw = size / t * 7 / 8 / 1e9              # nccl-tests: algbw x (p - 1)/p
    assert label == "nccl_p2p"
    assert busbw == pytest.approx(450 * NVLINK_EFFICIENCY["hopper"], rel=1e-3)   # 370.8
    assert busbw == pytest.approx(370, rel=0.01)   # nccl-tests#212


def test_the_des_replays_the_same_time_alone():
    a, _ = _lone("all_to_all", 8, 2**28, "analytical")
    d, _ = _lone("all_to_all", 8, 2**28, "des")
    assert d == pytest.approx(a, rel=0.01)

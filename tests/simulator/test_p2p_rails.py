"""Point-to-point transfers between nodes go through the receiver's rail, as NCCL's send/recv.

NCCL times a send/recv between nodes on the NIC local to the GPU (``ncclTopoGetNetDev``
without a collective graph → ``ncclTopoGetLocalNet``; with PXN, the NIC of the GPU with
the receiver's local index), each GPU using ``⌈NICs / GPUs⌉`` of its local NICs. So one
sender on an 8-NIC node gets one NIC, not eight: both engines must say so, and agree.
"""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from ddlsim.topologies import from_system
from ddlsim.workloads.trace import (P2P, Block, Compute, GroupFamily, Op, Program, RankClass,
                                    Step, Workload, WorkloadMeta)
from scenarios import cost_model, send_recv_pair

NIC_BPS = 25e9  # one HDR 200 Gb/s NIC of the dgx-a100 preset


def _system(preset: str, dtype: str = "bf16"):
    cfg = ddlsim.load_config({
        "model": "gpt3-175b", "system": {"preset": preset, "nodes": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048,
                  "dtype": dtype}})
    return cfg.system


@pytest.mark.parametrize("preset, dtype, want", [
    ("dgx-a100", "bf16", [(i,) for i in range(8)]),          # a NIC per GPU
    ("dgx1-v100", "fp16", [(i // 2,) for i in range(8)]),    # 4 NICs, each shared by 2 GPUs
    ("dgx2-v100", "fp16", [(i // 2,) for i in range(16)]),   # 8 NICs for 16 GPUs
])
def test_rails_are_the_receivers_local_nics(preset, dtype, want):
    topo = from_system(_system(preset, dtype))
    g = topo.devices_per_node
    assert [topo.p2p_rails(d) for d in range(g, 2 * g)] == want   # node 1
    assert [topo.p2p_rails(d) for d in range(g)] == want           # node 0 alike
    table, count = topo.p2p_rail_table
    assert table[:g, 0].tolist() == [r[0] for r in want] and (count == 1).all()


def _one_sender(nbytes: float, p: int = 16) -> Workload:
    """Rank 0 (node 0) sends ``nbytes`` to rank 8 (node 1); every other rank computes."""
    pp = GroupFamily("pp", "pp", np.array([[0, 8]]))
    work = Op(Compute("work", 1e9))
    tx = Op(P2P("send.act", "send", "pp", +1, nbytes, "act"), stream="pp", deps=(0,))
    rx = Op(P2P("recv.act", "recv", "pp", -1, nbytes, "act"), stream="pp")
    after = Op(Compute("work", 1e9), deps=(0,))
    classes = []
    for name, ranks, ops in (("sender", (0,), (work, tx)), ("receiver", (8,), (rx, after)),
                             ("others", tuple(r for r in range(p) if r not in (0, 8)),
                              (work,))):
        classes.append(RankClass(name, ranks, Program({"b": Block("b", "forward", ops)},
                                                     (Step("b"),))))
    return Workload("one-sender", p, {"pp": pp}, tuple(classes),
                    WorkloadMeta(samples=1, tokens=1))


def _receiver_end(run, wl) -> float:
    return run.timings[[c.name for c in wl.classes].index("receiver")].end


def test_one_sender_gets_one_nic_in_both_engines():
    system = _system("dgx-a100")
    wl = _one_sender(1e9)
    cost = cost_model(system, wl)
    transfer = cost.p2p(wl.classes[0].program.blocks["b"].ops[1].payload, 0, 8)
    # one 25 GB/s NIC, not the node's eight (5 ms striped)
    assert transfer == pytest.approx(1e9 / NIC_BPS, rel=0.01)
    des, _ = run_des(wl, cost)
    ana = simulate_analytical(wl, cost)
    assert _receiver_end(des, wl) == pytest.approx(_receiver_end(ana, wl), rel=0.02)
    # the transfer itself: everything but the two compute ops
    compute = cost.compute(wl.classes[0].program.blocks["b"].ops[0].payload)
    assert _receiver_end(des, wl) - 2 * compute == pytest.approx(transfer, rel=0.02)


def test_every_gpu_sending_fills_every_nic_as_before():
    """All eight GPUs of node 0 send to their peers on node 1: each transfer has its own
    NIC, as many bytes per NIC as striping every transfer over all eight gave."""
    system = _system("dgx-a100")
    wl = send_recv_pair(1e9, p=16)
    cost = cost_model(system, wl)
    op = wl.classes[0].program.blocks["b"].ops[1].payload
    assert cost.p2p(op, 0, 8) == pytest.approx(1e9 / NIC_BPS, rel=0.01)
    des, _ = run_des(wl, cost)
    ana = simulate_analytical(wl, cost)
    for a, b in zip(des.timings, ana.timings):
        assert a.end == pytest.approx(b.end, rel=0.02)

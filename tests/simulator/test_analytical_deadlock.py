"""The analytical engine's deadlock message names the op that is really stuck — its name, kind,
group and peer, the rank class, the block and the step — also when that op sits in the middle
of a block whose earlier ops the engine fuses into one instruction (issue 9, item 8: the
message used to index the fused instructions, so it named an earlier op)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.errors import DeadlockError
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.trace import (Block, Collective, Compute, GroupFamily, Op, P2P, Program,
                                    RankClass, Step, Workload, WorkloadMeta)

META = WorkloadMeta(samples=1, tokens=1, model_flops=1.0)


def _deadlock(wl: Workload, small_cfg) -> str:
    with pytest.raises(DeadlockError) as err:
        simulate_analytical(wl, CostModel(small_cfg.system, wl, small_cfg.parallel.collective_algorithm))
    return str(err.value)


def _pair(sent_tag: str, recv_tag: str, steps_b=(Step("r"),)) -> Workload:
    """Class a computes and sends tag ``sent_tag``; class b computes twice (fused into one
    instruction), then receives ``recv_tag`` (op 2 of its block), then computes on it."""
    pp = GroupFamily("pp", "pp", np.array([[0, 1]]))
    send = Block("s", "forward", (Op(Compute("work", 1e9)),
                                  Op(P2P("send.act", "send", "pp", 1, 1e6, sent_tag), "pp", (0,))))
    recv = Block("r", "forward", (Op(Compute("first", 1e9)), Op(Compute("second", 1e9)),
                                  Op(P2P("recv.act", "recv", "pp", -1, 1e6, recv_tag), "pp"),
                                  Op(Compute("use", 1e9), deps=(2,))))
    return Workload("pair", 2, {"pp": pp}, (
        RankClass("a", (0,), Program({"s": send}, (Step("s"),))),
        RankClass("b", (1,), Program({"r": recv}, tuple(steps_b)))), META)


def test_matched_pair_finishes(small_cfg):
    wl = _pair("act", "act")
    t = simulate_analytical(wl, CostModel(small_cfg.system, wl,
                                          small_cfg.parallel.collective_algorithm)).timings
    assert t[1].end > t[0].end > 0


def test_recv_in_the_middle_of_a_block_is_named(small_cfg):
    msg = _deadlock(_pair("act", "grad"), small_cfg)
    assert "class b (ranks 1) waits at step 0 (block 'r', micro-batch 0)" in msg
    assert "on op 2 'recv.act' (recv from peer -1 of group 'pp', tag 'grad'" in msg
    assert "no send from class a with tag 'grad' for micro-batch 0" in msg
    # the fused instruction before it holds ops 0 and 1; neither is the stuck op
    assert "'first'" not in msg and "'second'" not in msg


def test_stuck_step_and_micro_batch_are_named(small_cfg):
    # a sends for micro-batch 0 only; b's second step (micro-batch 1) waits forever
    msg = _deadlock(_pair("act", "act", (Step("r", 0), Step("r", 1))), small_cfg)
    assert "waits at step 1 (block 'r', micro-batch 1) on op 2 'recv.act'" in msg
    assert "for micro-batch 1" in msg


def test_collective_in_the_middle_of_a_block_is_named(small_cfg):
    g = GroupFamily("g", "dp", np.array([[0, 1]]))
    talker = Block("b", "other", (Op(Compute("first", 1e9)), Op(Compute("second", 1e9)),
                                  Op(Collective("grad.sum", "all_reduce", "g", 1e6)),
                                  Op(Compute("after", 1e9))))
    mute = Block("b", "other", (Op(Compute("work", 1e9)),))
    wl = Workload("half", 2, {"g": g}, (
        RankClass("talker", (0,), Program({"b": talker}, (Step("b"),))),
        RankClass("mute", (1,), Program({"b": mute}, (Step("b"),)))), META)
    msg = _deadlock(wl, small_cfg)
    assert ("class talker (ranks 0) waits at step 0 (block 'b', micro-batch 0) on op 2 "
            "'grad.sum' (all_reduce on group 'g', stream 'compute')") in msg
    assert "it waits for class mute of its 'g' group, which has not reached this collective" in msg
    assert "'second'" not in msg

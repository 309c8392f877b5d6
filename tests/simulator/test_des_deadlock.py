"""A program that cannot finish is reported as a deadlock naming the ranks and ops, never a
hang: a send with no matching recv, a recv with no send, a cycle of waits, a collective that
a class of its group never reaches."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.errors import DeadlockError
from ddlsim.simulator.des import run_des
from scenarios import cluster, cost_model, send_recv_pair
from ddlsim.workloads.trace import (Block, Collective, Compute, GroupFamily, Op, Program,
                                    RankClass, Step, Workload, WorkloadMeta)

SYSTEM = cluster(2, 2, "switch")


def _run(wl):
    return run_des(wl, cost_model(SYSTEM, wl))


def test_matched_pair_runs():
    run, _ = _run(send_recv_pair(1e6, p=4))
    assert run.timings[1].end > run.timings[0].end > 0


def test_send_without_recv_is_a_deadlock_naming_ranks_and_op():
    with pytest.raises(DeadlockError) as err:
        _run(send_recv_pair(1e6, p=4, recv=False))
    msg = str(err.value)
    assert "send 'send.act'" in msg and "no matching recv" in msg
    assert "ranks 0, 1" in msg and "ranks 2, 3" in msg
    assert "tag 'act'" in msg and "micro-batch 0" in msg


def test_recv_without_send_is_a_deadlock():
    with pytest.raises(DeadlockError) as err:
        _run(send_recv_pair(1e6, p=4, send=False))
    msg = str(err.value)
    assert "recv 'recv.act'" in msg and "no matching send" in msg
    assert "class second (ranks 2, 3)" in msg and "op 'work'" in msg


def test_cycle_of_waits_is_a_deadlock_naming_both_sides():
    with pytest.raises(DeadlockError) as err:
        _run(send_recv_pair(1e6, p=4, recv_first=True))
    msg = str(err.value)
    assert "class first (ranks 0, 1)" in msg and "class second (ranks 2, 3)" in msg
    assert "recv 'recv.grad'" in msg and "recv 'recv.act'" in msg


def test_collective_a_class_never_reaches_is_a_deadlock():
    group = GroupFamily("g", "dp", np.array([[0, 1]]))
    coll = Program({"b": Block("b", "other", (Op(Collective("ar", "all_reduce", "g", 1e6)),))},
                   (Step("b"),))
    idle = Program({"b": Block("b", "other", (Op(Compute("work", 1e9)),))}, (Step("b"),))
    wl = Workload("half", 2, {"g": group},
                  (RankClass("talker", (0,), coll), RankClass("mute", (1,), idle)),
                  WorkloadMeta(samples=1, tokens=1))
    with pytest.raises(DeadlockError) as err:
        _run(wl)
    msg = str(err.value)
    assert "class talker (ranks 0)" in msg and "collective 'ar'" in msg
    assert "class mute (ranks 1)" in msg

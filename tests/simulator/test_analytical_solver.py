"""The analytical engine's max-plus solver: it times the scalar steps of every class at once
and gives exactly what the step-by-step scheduler gives (the one timing rule of
``ddlsim.simulator.timing``), by hand on small programs and to rounding on real pipelines."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import ddlsim
from ddlsim.errors import DeadlockError
from ddlsim.simulator.analytical import chains, engine, interpreter, maxplus, rounds
from ddlsim.simulator.analytical.instructions import COLL, COMPUTE, RECV, SEND, WAIT, Instr
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.trace import (Block, Compute, GroupFamily, Op, P2P, Program, RankClass,
                                    Step, Workload, WorkloadMeta)

META = WorkloadMeta(samples=1, tokens=1, model_flops=1.0)


def _feed(n: int, work_a: float, work_b: float) -> Workload:
    """Class a computes ``work_a`` s then sends micro-batch i; class b receives it, then
    computes ``work_b`` s; n micro-batches."""
    pp = GroupFamily("pp", "pp", np.array([[0, 1]]))
    s = Block("s", "forward", (Op(Compute("a", 1.0, seconds=work_a)),
                               Op(P2P("send", "send", "pp", 1, 1e6, "act"), "pp", (0,))))
    r = Block("r", "forward", (Op(P2P("recv", "recv", "pp", -1, 1e6, "act"), "pp"),
                               Op(Compute("b", 1.0, seconds=work_b), deps=(0,))))
    return Workload("feed", 2, {"pp": pp}, (
        RankClass("a", (0,), Program({"s": s}, tuple(Step("s", i) for i in range(n)))),
        RankClass("b", (1,), Program({"r": r}, tuple(Step("r", i) for i in range(n))))), META)


def _run(wl: Workload, cfg, solver: bool, monkeypatch):
    monkeypatch.setattr(engine, "SOLVER", solver)
    cost = CostModel(cfg.system, wl, cfg.parallel.collective_algorithm)
    return engine.simulate_analytical(wl, cost), cost


def test_a_feed_pipeline_by_hand(small_cfg, monkeypatch):
    """a sends at 1, 2, 3 s; b's first message arrives at 1 + t, so b computes [1 + t, 3 + t],
    [3 + t, 5 + t], [5 + t, 7 + t] (the later messages, at 2 + t and 3 + t, arrive while it
    is busy). b's idle second 1 + t before its first compute is t exposed pp (the transfer)
    and 1 s bubble."""
    calls = []
    original = interpreter.run_step

    def spy(ci, *rest):
        calls.append(ci)
        return original(ci, *rest)

    monkeypatch.setattr(rounds, "run_step", spy)
    monkeypatch.setattr(interpreter, "run_step", spy)
    wl = _feed(3, 1.0, 2.0)
    run, cost = _run(wl, small_cfg, True, monkeypatch)
    t = cost.p2p(wl.classes[0].program.blocks["s"].ops[1].payload, 0, 1)
    a, b = run.timings
    assert a.end == pytest.approx(3.0, rel=1e-12)
    assert b.end == pytest.approx(7.0 + t, rel=1e-12)
    assert b.compute == pytest.approx(6.0, rel=1e-12)
    assert b.exposed["pp"] == pytest.approx(t, rel=1e-12)
    assert b.bubble == pytest.approx(1.0, rel=1e-12)
    assert calls == []    # every step was solved, none run by the scheduler


@pytest.mark.parametrize("work", [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0)])
def test_the_solver_gives_the_schedulers_timing(work, small_cfg, monkeypatch):
    wl = _feed(5, *work)
    fast = _run(wl, small_cfg, True, monkeypatch)[0].timings
    slow = _run(wl, small_cfg, False, monkeypatch)[0].timings
    for f, s in zip(fast, slow):
        assert f.end == pytest.approx(s.end, rel=1e-12)
        assert (f.compute, f.bubble) == pytest.approx((s.compute, s.bubble), rel=1e-12, abs=1e-15)
        assert dict(f.exposed) == pytest.approx(dict(s.exposed), rel=1e-12, abs=1e-15)
        assert dict(f.comm_bytes) == pytest.approx(dict(s.comm_bytes), rel=1e-12)


def test_summary_of_a_block():
    """recv → x (1 s) → y (2 s, uses the message) → z (3 s) → send after y: A = 6 s on the
    compute stream, 1 s before the instruction waiting for the message, the send's dep ends
    3 s in, after that instruction."""
    block = (Instr(RECV, 1, (), 0.0, "pp", peer=(0, "act")),
             Instr(COMPUTE, 0, (), 1.0, "compute", flops=5.0),
             Instr(COMPUTE, 0, (0, 1), 2.0, "compute", flops=5.0),
             Instr(COMPUTE, 0, (), 3.0, "optimizer"),
             Instr(SEND, 1, (2,), 0.5, "pp", nbytes=8.0, peer=(2, "act")))
    s = maxplus.summarise(block)
    assert (s.A, s.F, s.waits, s.E, s.after) == (6.0, 1.0, True, 3.0, True)
    assert (s.compute, s.optimizer, s.flops, s.nbytes) == (3.0, 3.0, 10.0, (("pp", 8.0),))
    assert not s.side


@pytest.mark.parametrize("block", [
    (Instr(WAIT, 0, (), 0.0, "", target=1),),                                  # waits on a stream
    (Instr(COLL, 1, (), 1.0, "dp"), Instr(COMPUTE, 0, (0,), 1.0, "compute")),  # reads stream 1
    (Instr(COLL, 0, (), 1.0, "dp", group=("dp", frozenset({0, 1}))),),         # across classes
    (Instr(RECV, 0, (), 0.0, "pp", peer=(0, "x")), Instr(RECV, 0, (), 0.0, "pp", peer=(0, "y"))),
], ids=["wait", "other-stream-dep", "rendezvous", "two-recvs"])
def test_blocks_that_are_not_scalar(block):
    assert maxplus.summarise(block) is None


def test_side_streams_are_replayed(small_cfg):
    """A bucket all-reduce on its own stream after the compute does not make a step
    unsolvable: it is marked ``side`` (the scheduler replays it)."""
    s = maxplus.summarise((Instr(COMPUTE, 0, (), 1.0, "compute"), Instr(COLL, 2, (0,), 3.0, "dp")))
    assert s.side and s.A == 1.0 and s.exposed == ()


def test_a_cycle_is_left_to_the_scheduler(small_cfg, monkeypatch):
    """a waits for b's message before sending its own, and b for a's: the sweeps never settle
    (every node has a positive length), the solver gives up and the scheduler names the
    deadlock."""
    pp = GroupFamily("pp", "pp", np.array([[0, 1]]))
    blk = Block("x", "forward", (Op(P2P("recv", "recv", "pp", 1, 1e6, "m"), "pp"),
                                 Op(Compute("c", 1.0, seconds=1.0), deps=(0,)),
                                 Op(P2P("send", "send", "pp", 1, 1e6, "m"), "pp", (1,))))
    wl = Workload("cycle", 2, {"pp": pp}, (
        RankClass("a", (0,), Program({"x": blk}, (Step("x"),))),
        RankClass("b", (1,), Program({"x": blk}, (Step("x"),)))), META)
    monkeypatch.setattr(chains, "MAX_SWEEPS", 16)
    with pytest.raises(DeadlockError, match="no send from class"):
        _run(wl, small_cfg, True, monkeypatch)


def _same_to_rounding(fast: dict, slow: dict) -> None:
    """Two results' timing, breakdown and bytes equal to rounding."""
    assert fast["iteration_time_s"] == pytest.approx(slow["iteration_time_s"], rel=1e-12)
    assert fast["per_class_time_s"] == pytest.approx(slow["per_class_time_s"], rel=1e-12)
    for part in ("compute_s", "bubble_s", "optimizer_s"):
        assert fast["breakdown"][part] == pytest.approx(slow["breakdown"][part], rel=1e-10,
                                                        abs=1e-15)
    assert fast["breakdown"]["exposed_comm_s"] == pytest.approx(
        slow["breakdown"]["exposed_comm_s"], rel=1e-10, abs=1e-15)
    assert fast["comm_bytes"] == pytest.approx(slow["comm_bytes"], rel=1e-12)


@pytest.mark.parametrize("sched, v, pp, mbs, gbs", [
    ("1f1b", None, 4, 1, 64), ("gpipe", None, 2, 2, 64), ("interleaved", 2, 4, 1, 64),
    ("1f1b", None, 1, 1, 64), ("1f1b", None, 8, 1, 256), ("interleaved", 2, 8, 1, 256),
    ("gpipe", None, 8, 1, 256)])
def test_solver_matches_the_scheduler_on_pipelines(sched, v, pp, mbs, gbs, monkeypatch):
    """The same timing and breakdown to rounding: the solver adds a step's durations as one
    sum and a class's steps by a cumulative sum, the scheduler one op at a time."""
    d = {"model": "gpt3-2.7b", "parallel": {"tensor_model_parallel_size": 2,
                                            "pipeline_model_parallel_size": pp, "schedule": sched,
                                            "virtual_pipeline_model_parallel_size": v},
         "train": {"micro_batch_size": mbs, "global_batch_size": gbs, "seq_length": 2048},
         "system": {"preset": "dgx-a100", "nodes": 2 * max(1, pp // 4),
                    # Megatron-Core has no GPipe (rule no_gpipe): a what-if of its stack
                    "software": {"stack": "megatron-core-2024", "what_if": sched == "gpipe"}}}
    got = {}
    for solver in (True, False):
        monkeypatch.setattr(engine, "SOLVER", solver)
        got[solver] = ddlsim.predict(copy.deepcopy(d), check_fit=False).to_dict()
    fast, slow = got[True], got[False]
    _same_to_rounding(fast, slow)


def test_the_solver_times_almost_every_step_of_a_deep_pipeline(monkeypatch):
    """1F1B over 8 stages and 128 micro-batches: 8 × (2·128 + 1) = 2,056 steps, of which the
    scheduler runs at most those the solver cannot (a step waiting on another stream or
    meeting other classes at a collective, and every step after it)."""
    calls, solved = [], []
    original, solve = interpreter.run_step, maxplus.solve

    def spy(*args):
        calls.append(args[0])
        return original(*args)

    monkeypatch.setattr(interpreter, "run_step", spy)
    monkeypatch.setattr(maxplus, "solve",
                        lambda nd, *a: solved.append(solve(nd, *a)) or solved[-1])
    d = {"model": "gpt3-2.7b", "parallel": {"tensor_model_parallel_size": 2,
                                            "pipeline_model_parallel_size": 8},
         "train": {"micro_batch_size": 1, "global_batch_size": 256, "seq_length": 2048},
         "system": {"preset": "dgx-a100", "nodes": 2}}
    ddlsim.predict(d, check_fit=False)
    assert solved[0] is not None
    assert len(calls) < 0.05 * 8 * (2 * 128 + 1)


# ---------------------------------------------------------------- closed streams
def test_a_block_that_drains_its_own_stream_is_scalar():
    """Compute 1 s, then a 3 s all-reduce on stream 2 beside 2 s of compute, joined by a
    wait: the compute stream ends at 1 + max(2, 3) = 4 s, the wait's 1 s gap is exposed
    ``tp`` (as the scheduler books it). A stream left running is not closed."""
    block = (Instr(COMPUTE, 0, (), 1.0, "compute"),
             Instr(COLL, 2, (0,), 3.0, "tp", nbytes=8.0),
             Instr(COMPUTE, 0, (), 2.0, "compute"),
             Instr(WAIT, 0, (), 0.0, "", target=2))
    assert maxplus.summarise(block) is None                 # without knowing it is closed
    s = maxplus.summarise(block, frozenset({2}))
    assert (s.A, s.compute, dict(s.exposed), dict(s.nbytes), s.side) == \
        (4.0, 3.0, {"tp": 1.0}, {"tp": 8.0}, False)
    from types import SimpleNamespace as Prog
    assert maxplus.closed_streams([Prog(blocks=(block,), shapes=(0,))]) == frozenset({2})
    # block[:3] leaves the stream running: not closed anywhere
    assert maxplus.closed_streams([Prog(blocks=(block, block[:3]), shapes=(0, 1))]) \
        == frozenset()


@pytest.mark.parametrize("sp", [False, True])
def test_async_tp_backward_solver_and_repeated_loop_match_the_scheduler(sp, monkeypatch):
    """The async TP backward puts each layer's collectives on the ``tp`` stream: the solver
    (closed streams) and the lowering that writes a self-contained layer loop once with its
    ops repeated give the scheduler's timing over every layer written out, to rounding."""
    from ddlsim.workloads.trace import Block as TraceBlock
    d = {"model": "gpt3-2.7b", "parallel": {"tensor_model_parallel_size": 2,
                                            "pipeline_model_parallel_size": 4,
                                            "sequence_parallel": sp},
         "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048},
         "system": {"preset": "dgx-a100", "nodes": 2}}
    fast = ddlsim.predict(copy.deepcopy(d), check_fit=False).to_dict()
    monkeypatch.setattr(engine, "SOLVER", False)
    monkeypatch.setattr(TraceBlock, "lean", property(lambda self: self.flat))
    slow = ddlsim.predict(copy.deepcopy(d), check_fit=False).to_dict()
    _same_to_rounding(fast, slow)
    assert fast["breakdown"]["exposed_comm_s"]["tp"] > 0   # the forward's blocking ones


# ---------------------------------------------------------------- windows after a step
def _param_gather_plan(sched: str, v: int | None, pp: int, recompute: str) -> dict:
    """The distributed optimizer with the overlapped parameter gather (Megatron-Core's
    default stack): each stage's first forward waits for the gather on the ``dp`` stream,
    which later steps read too, so the first step of every class is not scalar."""
    return {"model": "gpt3-2.7b",
            "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": pp,
                         "schedule": sched, "virtual_pipeline_model_parallel_size": v,
                         "sequence_parallel": True, "zero_stage": 1,
                         "overlap_grad_reduce": True, "overlap_param_gather": True},
            "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 2048,
                      "recompute": recompute},
            "system": {"preset": "dgx-a100", "nodes": 4}}


@pytest.mark.parametrize("sched, v, pp, recompute", [
    ("interleaved", 2, 4, "selective"), ("interleaved", 4, 8, "none"), ("1f1b", None, 8, "full")])
def test_runs_after_a_step_that_is_not_scalar_are_solved(sched, v, pp, recompute, monkeypatch):
    """The first step of every stage waits on another stream: the scheduler runs it, parks
    each class at the run of scalar steps after it, and the solver times those runs from
    where the scheduler left each class. The timing and breakdown are the scheduler's to
    rounding, and the scheduler runs a few per cent of the steps (it ran them all before
    the solver took windows)."""
    calls = []
    original = interpreter.run_step

    def spy(*args):
        calls.append(args[0])
        return original(*args)

    d = _param_gather_plan(sched, v, pp, recompute)
    got = {}
    for solver in (True, False):
        monkeypatch.setattr(engine, "SOLVER", solver)
        monkeypatch.setattr(interpreter, "run_step", spy)
        calls.clear()
        got[solver] = ddlsim.predict(copy.deepcopy(d), check_fit=False).to_dict()
        if solver:
            solved_calls = len(calls)
        else:
            steps = len(calls)
    _same_to_rounding(got[True], got[False])
    assert solved_calls < 0.1 * steps


def test_a_closed_stream_waiting_for_the_message_and_the_compute_stream_anchors_the_step():
    """The overlapped TP backward's start: a wait on the ``tp`` stream (closed) for the
    compute stream, after the received gradient; its all-gather, and the compute stream's
    first use of the message, then follow. Both start at max(f, a + t): the step is scalar
    with F = 0. A compute op between the two anchors would run before the message beside a
    stream that waits for it: not scalar."""
    recv = Instr(RECV, 1, (), 0.0, "pp", peer=(1, "grad"))
    join = Instr(WAIT, 2, (0,), 0.0, "", target=0)
    gather = Instr(COLL, 2, (0,), 0.5, "tp", nbytes=8.0)
    use = Instr(COMPUTE, 0, (0,), 2.0, "compute", flops=1.0)
    drain = Instr(WAIT, 0, (0,), 0.0, "", target=2)
    send = Instr(SEND, 1, (3, 4), 0.25, "pp", nbytes=4.0, peer=(0, "grad"))
    s = maxplus.summarise((recv, join, gather, use, drain, send), frozenset({2}))
    assert (s.A, s.F, s.waits, s.after, s.E) == (2.0, 0.0, True, True, 2.0)
    assert s.tails == ((2, 1.5),)            # the tp stream free 1.5 s before the step ends
    early = Instr(COMPUTE, 0, (), 1.0, "compute")
    assert maxplus.summarise((recv, join, gather, early, use, drain, send),
                             frozenset({2})) is None

"""The trace's loop construct (``Loop``, docs/trace.md): per-layer overlap without writing
every layer's ops.

The case is ZeRO-3's prefetch: each of L layers all-gathers its parameters on the ``dp``
stream and computes after its own all-gather. The all-gather stream runs ahead of the
compute stream, so with all-gather time a and compute time c (each from the cost model's
closed forms) the block takes ``a + L·c`` when c ≥ a (every all-gather but the first is
hidden) and ``L·a + c`` when c < a (compute waits for each all-gather).
"""

from __future__ import annotations

import numpy as np
import pytest
from scenarios import cluster, cost_model

from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from ddlsim.workloads.trace import (Block, Collective, Compute, GroupFamily, Loop, Op, Program,
                                    RankClass, Step, Wait, Workload)

P, L, NBYTES = 4, 6, 64e6
GATHER = Collective("ag", "all_gather", "dp", NBYTES, algorithm="ring")


def _layer_ops(flops: float) -> tuple[Op, ...]:
    return (Op(GATHER, stream="dp"), Op(Compute("layer", flops), deps=(0,)))


def _workload(ops: tuple[Op, ...]) -> Workload:
    group = GroupFamily("dp", "dp", np.arange(P).reshape(1, P))
    program = Program({"b": Block("b", "forward", ops + (Op(Wait("join", "dp")),))},
                      (Step("b"),))
    return Workload("zero3", P, {"dp": group}, (RankClass("all", tuple(range(P)), program),))


def _looped(flops: float) -> Workload:
    return _workload((Op(Loop("layers", _layer_ops(flops), L)),))


def _unrolled(flops: float) -> Workload:
    """The same layers written out: layer i's ops at 2i, 2i+1."""
    return _workload(tuple(Op(op.payload, op.stream, tuple(2 * i + d for d in op.deps))
                           for i in range(L) for op in _layer_ops(flops)))


@pytest.mark.parametrize("flops", [2e12, 2e10])  # compute-bound, all-gather-bound
def test_loop_overlaps_as_the_unrolled_ops_in_both_engines(flops):
    system = cluster(1, P, "switch")
    wl = _looped(flops)
    wl.validate()
    cost = cost_model(system, wl)
    a = cost.collective(GATHER)
    c = cost.compute(Compute("layer", flops))
    expected = a + L * c if c >= a else L * a + c
    looped = simulate_analytical(wl, cost).timings[0]
    assert looped.end == pytest.approx(expected, rel=1e-12)
    unrolled = simulate_analytical(_unrolled(flops), cost_model(system, _unrolled(flops)))
    assert unrolled.timings[0].end == pytest.approx(looped.end, rel=1e-12)
    des = run_des(wl, cost_model(system, wl))[0].timings[0]
    assert des.end == pytest.approx(expected, rel=1e-6)
    assert des.compute == pytest.approx(L * c, rel=1e-9)
    assert des.exposed["dp"] == pytest.approx(looped.exposed["dp"], rel=1e-6)


def test_flat_block_wires_dependencies_through_the_loop():
    body = (Op(Compute("x", 1.0), stream="s"), Op(Compute("y", 1.0), deps=(0,)))
    block = Block("b", "forward", (Op(Compute("first", 1.0)),
                                   Op(Loop("l", body, 2), deps=(0,)),
                                   Op(Compute("after", 1.0), stream="t", deps=(1,))))
    flat = block.flat.ops
    assert [op.payload.name for op in flat] == ["first", "x", "y", "x", "y", "after"]
    assert [op.deps for op in flat] == [(), (0,), (1, 0), (), (3,), (3, 4)]
    assert block.flat is block.flat  # unrolled once
    plain = Block("p", "forward", body)
    assert plain.flat is plain


def test_loop_is_checked():
    with pytest.raises(ValueError, match="count >= 1"):
        Loop("l", (Op(Compute("x", 1.0)),), 0)
    bad = Op(Loop("l", (Op(Compute("x", 1.0), deps=(1,)), Op(Compute("y", 1.0))), 2))
    with pytest.raises(ValueError, match="'x' in loop 'l' of block 'b' depends on a later op"):
        _workload((bad,)).validate()

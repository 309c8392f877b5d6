"""The search tier's faster paths give the values of the rules they stand for, bit for bit
(issue 27's speed target; task HR).

* :func:`ddlsim.simulator.analytical.arrays.stream_ends` keeps a time a float until a
  collective's seconds per plan (an array) reach it, instead of an array operation per
  instruction: the timing rule ``start = max(ready, stream free); end = start + dur`` on
  arrays (:mod:`ddlsim.simulator.timing`), element by element, is the specification.
* :func:`ddlsim.search.netcost._stage_hops` sorts the distinct (hop s − 1, hop s) pairs
  itself instead of :func:`numpy.unique` with ``axis=0``: the same rows in the same order.
* The analytical engine's lowering (:class:`ddlsim.simulator.analytical.instructions.
  _Lowering`, which the exact tier's predictions and the search's pieces share) finds the
  classes of every class's collective groups with one gather per family, and each peer
  from the per-offset table of every rank's peer it builds for the transfers: the classes
  each rank's own group gives.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.search.netcost import _stage_hops
from ddlsim.simulator.analytical import arrays
from ddlsim.simulator.analytical.arrays import stream_ends
from ddlsim.simulator.analytical.instructions import COLL, COMPUTE, WAIT, Instr


def _rule_on_arrays(instrs, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The timing rule with every time an array over the ``n`` plans (the specification)."""
    zero = np.zeros(n)
    free: dict[int, np.ndarray] = {}
    ends: list[np.ndarray] = []
    for ins in instrs:
        ready = zero
        for d in ins.deps:
            ready = np.maximum(ready, ends[d])
        if ins.code == WAIT:
            ready = np.maximum(ready, free.get(ins.target, zero))
        end = np.maximum(ready, free.get(ins.stream, zero)) + ins.dur
        free[ins.stream] = end
        ends.append(end)
    last = zero
    for f in free.values():
        last = np.maximum(last, f)
    return free.get(0, zero), last


def _block(rng: np.random.Generator, n: int, arrays_too: bool) -> list[Instr]:
    """A random block: compute ops on stream 0, collectives on streams 1-2 (their seconds a
    float, or an array over the plans when ``arrays_too``), waits for a stream, random deps."""
    out: list[Instr] = []
    for i in range(int(rng.integers(1, 14))):
        deps = tuple(sorted(set(rng.integers(0, i, int(rng.integers(0, 3))).tolist()))) if i else ()
        kind = rng.integers(0, 3)
        if kind == 0:
            out.append(Instr(COMPUTE, 0, deps, float(rng.random()) * 1e-3, "compute"))
        elif kind == 1:
            dur = rng.random(n) * 1e-3 if arrays_too and rng.random() < 0.7 else \
                np.float64(rng.random() * 1e-3)
            out.append(Instr(COLL, int(rng.integers(1, 3)), deps, dur, "dp"))
        else:
            out.append(Instr(WAIT, int(rng.integers(0, 3)), deps, 0.0, "",
                             target=int(rng.integers(0, 3))))
    return out


@pytest.mark.parametrize("arrays_too", [False, True])
def test_stream_ends_is_the_timing_rule_on_arrays_bit_for_bit(arrays_too):
    rng = np.random.default_rng(27)
    for _ in range(300):
        n = int(rng.integers(1, 6))
        block = _block(rng, n, arrays_too)
        got, want = stream_ends(block, n), _rule_on_arrays(block, n)
        for g, w in zip(got, want):
            assert isinstance(g, np.ndarray) and g.shape == (n,)
            assert np.array_equal(g, w)


def test_stream_ends_does_no_array_operation_where_every_plan_has_the_same_times(monkeypatch):
    calls = []
    maximum = np.maximum

    def counted(*args, **kwargs):
        calls.append(args)
        return maximum(*args, **kwargs)

    block = [Instr(COMPUTE, 0, (), 1e-3, "compute"), Instr(COLL, 1, (0,), 2e-3, "tp"),
             Instr(COMPUTE, 0, (0,), 3e-3, "compute"), Instr(WAIT, 0, (2,), 0.0, "", target=1),
             Instr(COMPUTE, 0, (3,), 1e-3, "compute")]
    monkeypatch.setattr(arrays.np, "maximum", counted)
    compute, last = stream_ends(block, 4)
    assert not calls
    assert np.array_equal(compute, np.full(4, 5e-3)) and np.array_equal(last, compute)


def _unique_rows(parts: np.ndarray) -> np.ndarray:
    """What ``_stage_hops`` computed before: the first and last stages' rows, then
    ``np.unique`` of the (hop s − 1, hop s) pairs along axis 0."""
    none = np.array([-np.inf, 0.0])
    if not len(parts):
        return np.stack([[none, none], [none, none]])
    middle = np.unique(np.stack([parts[:-1], parts[1:]], axis=1), axis=0)
    return np.concatenate([np.stack([[none, parts[0]], [parts[-1], none]]), middle])


def test_stage_hops_rows_and_their_order_are_numpys_unique_rows():
    rng = np.random.default_rng(13)
    for trial in range(500):
        hops = int(rng.integers(0, 40))
        kinds = rng.random((3, 2)) * rng.choice([1e-10, 1e-6, 1.0])   # inside / across nodes
        parts = kinds[rng.integers(0, 3, hops)] if trial % 5 else rng.random((hops, 2))
        got, want = _stage_hops(parts), _unique_rows(parts)
        assert got.shape == want.shape and np.array_equal(got, want)


# ------------------------------------------------------------------ the engine's lowering
def _pipeline_workload():
    """GPT-2 on two DGX A100 nodes, TP2 PP4 DP2, interleaved (4 stage classes; tied
    embedding, pipeline hops inside and across nodes)."""
    from ddlsim.api import build_workload
    from ddlsim.config import build_config
    from ddlsim.simulator.costs import CostModel

    cfg = build_config({
        "model": "gpt2-124m", "system": {"preset": "dgx-a100", "nodes": 2},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
                     "data_parallel_size": 2, "schedule": "interleaved",
                     "virtual_pipeline_model_parallel_size": 3},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024}})
    wl = build_workload(cfg)
    return wl, CostModel(cfg.system, wl, cfg.parallel.collective_algorithm)


def test_lowering_finds_partners_and_peers_as_each_rank_s_own_group_gives_them():
    from ddlsim.simulator.analytical.instructions import _Lowering
    from ddlsim.workloads.trace import P2P

    wl, cost = _pipeline_workload()
    lw = _Lowering(wl, cost)
    class_of = wl.class_of()
    for name, fam in wl.groups.items():
        for cls in wl.classes:
            rep = int(cls.ranks[0])
            if rep not in fam.members:   # (asked only of the families a class's blocks use)
                continue
            row = fam.group_of(rep)
            classes = frozenset(class_of[row].tolist())
            assert lw.partners(name, rep) == (classes if len(classes) > 1 else None)
            i = row.tolist().index(rep)
            for offset in (-1, 1):
                p = P2P("x", "send", name, offset, 1.0, "x")
                assert lw.peer(rep, p) == class_of[row[(i + offset) % len(row)]]


def test_lowering_finds_every_class_s_partners_in_a_family_at_once():
    from ddlsim.simulator.analytical.instructions import _Lowering

    wl, cost = _pipeline_workload()
    lw = _Lowering(wl, cost)
    lw.partners("tp", int(wl.classes[0].ranks[0]))
    assert set(lw._sets["tp"]) == {int(c.ranks[0]) for c in wl.classes}

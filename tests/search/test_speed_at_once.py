"""Work a search grid did per plan or twice per signature, done once (issue 27's speed target;
task H3, 2026-11-30): FSDP1's gradient passes of the ZeRO-3 plans timed in one array call
(they were timed pass by pass, per distinct plan, in a Python loop over the plans); a
signature's plan resolution reading its model's shape from the builder instead of building
it again (:func:`~ddlsim.workloads.decoder.layerkernels.activation_kinds`); the stage pieces
of one structure timed by the timing rule together, over all their plans
(:func:`~ddlsim.simulator.analytical.arrays.stream_ends_together`), where each piece took
an array operation per instruction. The figures are the same floats: each checked against
the rule it stands for, element by element."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.config import build_config
from ddlsim.search import blocks, decoder_zero3, zero3_edges
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints
from ddlsim.simulator.analytical.arrays import stream_ends, stream_ends_together, structure
from ddlsim.simulator.analytical.instructions import COLL, COMPUTE, WAIT, Instr
from ddlsim.workloads.decoder.fsdp1_passes import grad_passes
from ddlsim.workloads.decoder.layerkernels import activation_kinds
from ddlsim.workloads.decoder.plan import resolve_plan

#: the default stack's ZeRO-3 (FSDP1) as a what-if: Megatron-Core of 2024 has none (no_zero3)
BASE = {"model": "gpt3-1.3b", "parallel": {},
        "system": {"preset": "dgx-a100", "nodes": 4,
                   "software": {"stack": "megatron-core-2024", "what_if": True}},
        "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 2048}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2, 8],
        "parallel.data_parallel_size": [4, 16, 32],
        "parallel.zero_stage": [0, 3], "train.micro_batch_size": [1, 2, 4]}


def _one_by_one(ctx, plans, on, params):
    """The reference: each ZeRO-3 plan's passes (:func:`grad_passes` of its parameters, DP
    and micro-batches), each pass timed alone as a float (:func:`zero3_edges.memory_pass_s`)."""
    n = len(plans)
    out = np.zeros((3, n))
    params = np.broadcast_to(np.asarray(params, dtype=float), (n,))
    dp = plans["dp"]
    m = plans["gbs"] // np.maximum(plans["mbs"] * np.maximum(dp, 1), 1)
    for i in np.flatnonzero(on):
        g = grad_passes(float(params[i]), int(dp[i]), int(dp[i]), ctx.dt, ctx.gdt, int(m[i]))
        out[:, i] = [zero3_edges.memory_pass_s(ctx, float(x)) for x in g]
    return out


@pytest.fixture
def fsdp1_calls(monkeypatch) -> list:
    """Each call of FSDP1's passes in the grids of the test: (its arrays, the reference's,
    the device-time calls it made)."""
    calls: list = []
    real, stream_times = zero3_edges.fsdp1_grad_seconds, zero3_edges.stream_times
    made: list[int] = []

    def counted(*args, **kwargs):
        made.append(1)
        return stream_times(*args, **kwargs)

    def recorded(ctx, plans, on, params):
        made.clear()
        got, device_calls = real(ctx, plans, on, params), len(made)
        calls.append((np.array(got), _one_by_one(ctx, plans, on, params), device_calls))
        return got
    monkeypatch.setattr(zero3_edges, "stream_times", counted)
    monkeypatch.setattr(zero3_edges, "fsdp1_grad_seconds", recorded)
    monkeypatch.setattr(decoder_zero3, "fsdp1_grad_seconds", recorded)
    return calls


def test_fsdp1_passes_are_timed_at_once_as_one_by_one(fsdp1_calls):
    grid = evaluate_grid(BASE, None, [], AXES, Constraints(must_fit=False))
    assert (grid.frame["parallel.zero_stage"] == 3).any()
    assert fsdp1_calls, "the grid's ZeRO-3 plans time FSDP1's passes"
    for got, reference, device_calls in fsdp1_calls:
        assert np.array_equal(got, reference)    # the same floats, plan by plan
        assert (got > 0).any()
        assert device_calls == 1   # one call for every distinct plan's three passes


def test_plan_resolution_builds_no_model_shape(monkeypatch):
    cfg = build_config(BASE, ["parallel.tensor_model_parallel_size=2",
                              "parallel.data_parallel_size=16"])
    shape = cfg.model.shape()
    kinds = activation_kinds(cfg)
    built: list[int] = []
    model_type, real = type(cfg.model), type(cfg.model).shape

    def counted(self, *args, **kwargs):
        built.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(model_type, "shape", counted)
    plan = resolve_plan(cfg, shape)
    assert built == []   # the shape given is the one read
    assert dict(plan.activation_kinds) == kinds == activation_kinds(cfg, shape=shape)
    assert activation_kinds(cfg, "full", shape) == activation_kinds(cfg, "full")


def _durations(rng: np.random.Generator, block: list[Instr], n: int) -> list:
    """Durations for ``block``'s instructions on ``n`` plans: floats (sometimes a value the
    other blocks have too, or a zero of either sign, or NaN) and arrays for collectives."""
    out = []
    for ins in block:
        pick = rng.random()
        if ins.code == COLL and pick < 0.6:
            out.append(rng.random(n) * 1e-3)
        elif pick < 0.2:
            out.append(1e-3)                           # the same float in every block
        elif pick < 0.25:
            out.append(float(rng.choice([0.0, -0.0, np.nan])))
        else:
            out.append(float(rng.random()) * 1e-3)
    return out


def _structure_block(rng: np.random.Generator) -> list[Instr]:
    out: list[Instr] = []
    for i in range(int(rng.integers(1, 12))):
        deps = tuple(sorted(set(rng.integers(0, i, int(rng.integers(0, 3))).tolist()))) if i else ()
        code = (COMPUTE, COLL, WAIT)[int(rng.integers(0, 3))]
        stream = 0 if code == COMPUTE else int(rng.integers(0, 3))
        out.append(Instr(code, stream, deps, 0.0, "x", target=int(rng.integers(0, 3))
                         if code == WAIT else -1))
    return out


def test_blocks_of_one_structure_timed_together_as_each_apart():
    rng = np.random.default_rng(3)
    for _ in range(300):
        block = _structure_block(rng)
        sizes = [int(x) for x in rng.integers(1, 5, int(rng.integers(1, 5)))]
        durations = [_durations(rng, block, n) for n in sizes]
        together = stream_ends_together(block, durations, sizes)
        assert len(together) == len(sizes)
        for got, dur, n in zip(together, durations, sizes):
            apart = stream_ends([ins._replace(dur=d) for ins, d in zip(block, dur)], n)[0]
            assert got.shape == (n,)
            # bit for bit, NaN where NaN, and zeros of the same sign
            assert np.array_equal(got.view(np.int64), apart.view(np.int64))


def test_stage_pieces_are_timed_once_per_structure(monkeypatch):
    """A grid's distinct pieces (each once, over every plan that has it) are timed by the
    rule once per structure: fewer calls than pieces."""
    calls: list[tuple] = []
    together = blocks.stream_ends_together

    def counted(instrs, durations, sizes):
        calls.append((structure(instrs), len(durations)))
        return together(instrs, durations, sizes)
    monkeypatch.setattr(blocks, "stream_ends_together", counted)
    evaluate_grid(BASE, None, [], AXES, Constraints(must_fit=False))
    assert len({s for s, _ in calls}) == len(calls) > 1   # one call per structure
    assert sum(n for _, n in calls) > len(calls)          # several pieces share a call


def _grads_by_masks(free, pre, post, steps):
    """FSDP1's post-backward stream as :class:`~ddlsim.search.zero3.Grads` states it, with a
    mask per pass (the specification of its shortcuts): ``steps`` of (unit end, reduce-scatter
    seconds)."""
    out = []
    for end, rs in steps:
        has = pre > 0
        done = np.maximum(free, end) + pre
        free = np.where(has, done, free)
        start = np.where(has, done, end)
        rs_end = start + rs
        free = np.where(post > 0, rs_end + post, free)
        out += [start, free]
    return out


@pytest.mark.parametrize("kind", ["all", "none", "mixed"])
def test_fsdp1_stream_with_every_plan_or_none_passing_as_with_masks(kind, monkeypatch):
    from ddlsim.search import zero3

    rng = np.random.default_rng(5)
    n = 7
    pick = {"all": np.ones(n), "none": np.zeros(n), "mixed": rng.integers(0, 2, n)}[kind]
    pre, post = pick * rng.random(n), pick * rng.random(n)
    free = rng.random(n)
    steps = [(rng.random(n) * 3, rng.random(n)) for _ in range(6)]
    want = _grads_by_masks(free, pre, post, steps)
    where = np.where
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return where(*args, **kwargs)
    monkeypatch.setattr(zero3.np, "where", counted)
    g = zero3.Grads(free, pre, post)
    got = []
    for end, rs in steps:
        start = g.before(end)
        g.after(start + rs)
        got += [start, g.free]
    monkeypatch.setattr(zero3.np, "where", where)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    # a pass every plan has, or none has, is no selection between two arrays
    assert (calls == []) if kind != "mixed" else calls

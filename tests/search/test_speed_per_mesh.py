"""Work a search grid did per plan, done per distinct input (issue 27's speed target; task
H1, 2026-11-30, fifth round): a stage piece's collectives asked once per distinct (mesh,
size) of its plans (a plan's collective time is its mesh's at that size) and put back on
every plan; a rule's rejected plans laid on the grid with numpy's inner loop over many flags
(:func:`~ddlsim.search.rejections._and_on_grid`), where a mask broadcasting over a last axis
of 2 values ran it two flags at a time. The figures are the same floats and the same flags:
each checked against what it stands for, element by element."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ddlsim.search import piececolls
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.rejections import Rejections, _and_on_grid
from ddlsim.search.spec import Constraints

BASE = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 4},
        "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 2048}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2, 8],
        "parallel.pipeline_model_parallel_size": [1, 2, 4],
        "parallel.data_parallel_size": [1, 2, 4, 16],
        "train.micro_batch_size": [1, 2], "train.recompute": ["none", "full"],
        "parallel.sequence_parallel": [False, True]}


@pytest.fixture
def asked(monkeypatch) -> list:
    """Every call of :func:`piececolls.piece_collectives` in the grid of the test: (its
    result, the plans' meshes, each distinct piece's plans, and the (op, family, bytes,
    plan) the coll_at it was given was asked for)."""
    calls: list = []
    real = piececolls.piece_collectives

    def recorded(distinct, shared, coll_at, mesh_of):
        seen: list = []

        def at(op, family, nbytes, index):
            t = coll_at(op, family, nbytes, index)
            seen.append((op, family, np.array(nbytes), np.array(index), t))
            return t
        got = real(distinct, shared, at, mesh_of)
        calls.append((dict(got), coll_at, mesh_of, shared, seen))   # before the contention ops
        return got
    monkeypatch.setattr(piececolls, "piece_collectives", recorded)
    return calls


def test_a_collective_is_asked_once_per_mesh_and_size_and_is_each_plans_own(asked):
    grid = evaluate_grid(BASE, None, [], AXES, Constraints(must_fit=False))
    assert len(grid.frame) > 50 and asked
    for seconds, coll_at, mesh_of, shared, seen in asked:
        for op, family, nbytes, index, _ in seen:   # no (mesh, size) asked twice in a call
            pairs = set(zip(mesh_of[index].tolist(), nbytes.tolist()))
            assert len(pairs) == len(index), (op, family)
        assert sum(len(s[3]) for s in seen) < sum(len(shared[k]) for k, *_ in seconds)
        for (k, op, family, b), t in seconds.items():   # each plan's, as asked for it alone
            plans = shared[k]
            alone = coll_at(op, family, np.full(len(plans), float(b)), plans)
            assert t.tobytes() == alone.tobytes(), (k, op, family, b)


SHAPE = (4, 3, 5, 2)


@pytest.mark.parametrize("dims", list(itertools.product([0, 1], repeat=len(SHAPE))))
def test_a_rules_flags_on_the_grid_are_numpys(dims):
    rng = np.random.default_rng(sum(d << i for i, d in enumerate(dims)))
    flags = rng.random(SHAPE) < 0.6
    mask = rng.random(tuple(n if d else 1 for n, d in zip(SHAPE, dims))) < 0.4
    out = np.empty(SHAPE, dtype=bool)
    assert (_and_on_grid(mask, flags, out) == (mask & flags)).all()
    for lower in (mask[0], mask.reshape(mask.shape[1:]) if mask.shape[0] == 1 else None):
        if lower is not None:   # fewer dimensions than the grid: numpy's broadcasting
            assert (_and_on_grid(lower, flags, out) == (lower & flags)).all()


def test_rejections_count_the_same_plans():
    rng = np.random.default_rng(7)
    shape = (4, 7, 3, 2)
    masks = [rng.random(s) < 0.3 for s in ((4, 1, 1, 2), (1, 7, 3, 1), (1, 1, 1, 2), shape,
                                            (1, 1, 1, 1))]
    got, free, want = Rejections(shape), np.ones(shape, dtype=bool), {}
    for i, mask in enumerate(masks):   # the first rule that rejects a plan names it
        got.reject(f"rule {i}", mask)
        hit = mask & free
        if hit.any():
            want[f"rule {i}"] = int(np.count_nonzero(hit))
        free &= ~hit
    assert got.counts() == dict(sorted(want.items(), key=lambda x: -x[1]))
    assert (got.free.reshape(shape) == free).all()

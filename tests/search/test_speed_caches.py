"""Caches that make a search grid cheaper without changing what it computes (issue 27's speed
target; task HS2): the cyclic garbage collector paused for the length of a grid and restored
as the caller had it; a resolved software stack's hash computed once and never carried to
another process (a string's hash differs between processes)."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from ddlsim.search import evaluate
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints
from ddlsim.software import resolve_software

BASE = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2]}


@pytest.fixture
def collector_seen(monkeypatch) -> list[bool]:
    """Whether the collector was enabled while the grid's plans were timed."""
    seen = []
    timed = evaluate.evaluate_plans

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return timed(*args, **kwargs)
    monkeypatch.setattr(evaluate, "evaluate_plans", watched)
    return seen


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_for_a_grid_and_restored(collector_seen, enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        grid = evaluate_grid(BASE, None, [], AXES, Constraints(must_fit=False))
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert len(grid.frame) > 0 and collector_seen and not any(collector_seen)
    assert after is enabled


def test_the_collector_comes_back_after_an_error():
    was = gc.isenabled()
    gc.enable()
    try:
        with pytest.raises(Exception):
            evaluate_grid({**BASE, "model": "no-such-model"}, None, [], AXES, Constraints())
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_stacks_hash_is_computed_once():
    sw = resolve_software("megatron-core-2024")
    h = hash(sw)
    sw.kernels["__probe__"] = 1      # never done by ddlsim: only shows the hash is kept
    try:
        assert hash(sw) == h
    finally:
        del sw.kernels["__probe__"]
    assert hash(resolve_software("megatron-core-2024")) == h


def test_a_pickled_stack_hashes_afresh_in_another_process():
    """A stack pickled by a process with another string-hash seed is found in a dict of this
    process's stacks (its remembered hash is not pickled)."""
    code = ("import pickle, sys; from ddlsim.software import resolve_software; "
            "sw = resolve_software('megatron-core-2024'); hash(sw); "
            "sys.stdout.buffer.write(pickle.dumps(sw))")
    seed = "54321" if os.environ.get("PYTHONHASHSEED") == "12345" else "12345"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    data = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          check=True).stdout
    theirs = pickle.loads(data)
    ours = resolve_software("megatron-core-2024")
    assert theirs == ours and hash(theirs) == hash(ours)
    assert {ours: 1}[theirs] == 1


def _tree_routes():
    from ddlsim.config import build_config
    from ddlsim.simulator.netmodel import topology_of
    cfg = build_config({**BASE, "system": {"preset": "dgx-a100", "nodes": 8}}, [])
    trees = topology_of(cfg.system)._trees
    assert trees is not None
    return trees


def test_tree_routes_are_remembered_past_other_calls_and_forgotten_cold(monkeypatch):
    """A pipeline family's ring step is routed for its fair shares and again for its
    point-to-point rails with other families' routes in between: routed once. The search's
    ``cache_clear`` (a cold grid) forgets them."""
    from ddlsim.search.netcost import cache_clear
    trees = _tree_routes()
    routed = []
    work = type(trees)._routes
    monkeypatch.setattr(type(trees), "_routes",
                        lambda self, *a: routed.append(1) or work(self, *a))
    cache_clear()
    src, dst, rail = np.array([0, 1, 7]), np.array([5, 1, 2]), np.array([0, 1, 1])
    first = trees.routes(src, dst, rail)
    trees.routes(src, dst, 1 - rail)          # another family's routes in between
    again = trees.routes(src.copy(), dst.copy(), rail.copy())
    assert len(routed) == 2
    assert all(a is b and not a.flags.writeable for a, b in zip(first, again))
    cache_clear()
    fresh = trees.routes(src, dst, rail)
    assert len(routed) == 3 and fresh[0] is not first[0]
    assert all(np.array_equal(a, b) for a, b in zip(first, fresh))

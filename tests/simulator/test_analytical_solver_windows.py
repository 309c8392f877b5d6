"""The max-plus solver re-solves only the window of steps whose messages changed, over
growing prefixes of the classes (:func:`ddlsim.simulator.analytical.maxplus.solve`). A
deadlock-free program has one fixed point, each node's value a fixed sequence of float
operations on its predecessors' values, so any order of sweeps that settles gives the same
bits: compared here with the plainest one, every class fully re-solved every sweep."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.api import build_workload
from ddlsim.config import build_config
from ddlsim.simulator.analytical import chains, maxplus
from ddlsim.simulator.analytical.instructions import lower
from ddlsim.simulator.costs import CostModel


def _full_sweeps(nd: maxplus.Nodes) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Seidel sweeps, alternately up and down, re-solving every class in full with
    the recurrence of the module docstring, until nothing changes."""
    N, C = len(nd.cls), len(nd.off) - 1
    ends, post = np.zeros(N), np.full(N + 1, -np.inf)
    src = np.where(nd.src >= 0, nd.src, N)
    early = nd.waits & ~nd.after
    for sweep in range(chains.MAX_SWEEPS):
        changed = False
        for c in (range(C) if sweep % 2 == 0 else range(C - 1, -1, -1)):
            a, b = int(nd.off[c]), int(nd.lim[c])
            if b == a:
                continue
            P = np.cumsum(nd.A[a:b])
            lag = nd.t[a:b] + np.where(nd.waits[a:b], nd.A[a:b] - nd.F[a:b], -np.inf) - P
            x = post[src[a:b]] + lag
            x[0] = max(x[0], 0.0)
            x = np.maximum.accumulate(x) + P
            new = x - (nd.A[a:b] - nd.E[a:b])
            late = np.flatnonzero(early[a:b])
            new[late] = np.where(late > 0, x[late - 1], 0.0) + nd.E[a:b][late]
            ends[a:b] = x
            if not np.array_equal(new, post[a:b]):
                post[a:b], changed = new, True
        if not changed:
            return ends, post[:N]
    raise AssertionError("the full sweeps did not settle")


@pytest.mark.parametrize("sched, v, pp, gbs, prefixes", [
    ("interleaved", 4, 8, 96, chains.PREFIXES),              # the default
    ("interleaved", 2, 8, 64, (4, 8, 16, 32, 64, 128, 256)),  # many prefixes
    ("1f1b", None, 4, 64, (1, 3, 9, 27, 81)),
    ("gpipe", None, 4, 32, ())])                              # no prefix: windows only
def test_windowed_prefix_solve_equals_full_sweeps(sched, v, pp, gbs, prefixes, monkeypatch):
    cfg = build_config({
        "model": "gpt3-2.7b",
        # Megatron-Core has no GPipe (rule no_gpipe): a what-if of its stack
        "system": {"preset": "dgx-a100", "nodes": 2,
                   "software": {"stack": "megatron-core-2024", "what_if": sched == "gpipe"}},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": pp,
                     "data_parallel_size": 8 // pp, "schedule": sched,
                     "virtual_pipeline_model_parallel_size": v},
        "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 2048}})
    wl = build_workload(cfg)
    programs, _, _ = lower(wl, CostModel(cfg.system, wl, cfg.parallel.collective_algorithm))
    nd = maxplus.nodes(programs)
    nd = maxplus.window(nd, nd.off[:-1].copy())   # every class from its first step
    monkeypatch.setattr(chains, "PREFIXES", prefixes)
    ends, post = maxplus.solve(nd)
    want_ends, want_post = _full_sweeps(nd)
    live = np.arange(len(nd.cls)) < nd.lim[nd.cls]
    assert np.array_equal(ends[live], want_ends[live])
    assert np.array_equal(post[:-1][live], want_post[live])


def test_window_map_covers_the_readers_of_changed_steps_read_out_of_order():
    """Reader steps 1, 2, 4 read sender steps 5, 2, 7 (steps 0 and 3 read another class).
    When sender steps 3..6 change, only reader step 1 (step 5) read one of them: the window
    from ``M`` (running max 5, 5, 7) and ``m`` (suffix min 2, 2, 7) is steps 1..2, which
    holds it; sender step 7 alone gives reader step 4 alone."""
    a, other = 100, 10**6
    sc = np.array([other, a + 5, a + 2, other, a + 7])
    mine = np.flatnonzero((sc >= a) & (sc < other))
    ri, M, m = chains.window_map(mine, sc[mine] - a)
    assert ri.tolist() == [1, 2, 4] and M.tolist() == [5, 5, 7] and m.tolist() == [2, 2, 7]

    def window(g0, g1):
        return ri[np.searchsorted(M, g0)], ri[np.searchsorted(m, g1, side="right") - 1]
    assert window(3, 6) == (1, 2)
    assert window(7, 7) == (4, 4)

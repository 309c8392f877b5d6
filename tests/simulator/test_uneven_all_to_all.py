"""Uneven all-to-all (``Collective.split_bytes``, docs/trace.md): one hot receiver.

Every one of p ranks sends ``s`` bytes to each member except the hot member h, which gets
``k·s`` from each (a receive-side hot spot: the routing of an MoE layer sending k× the tokens
to one expert). Hand-derived times on the scenario clusters (α and bandwidth from
``scenarios.cluster``: NVSwitch 100 GB/s per device with α = 2 µs inside a node; one NIC of
100 Gb/s per node with α = 5 µs + 0.5 µs switch across nodes):

* pairwise: p−1 steps; every step holds one message to h, so each lasts ``α + k·s/bw`` and
  ``T = (p−1)(α + k·s/bw)``;
* direct: all messages at once; h's incoming link carries ``(p−1)·k·s``, more than any
  sender's ``(p−2)·s + k·s`` (k ≥ 1), so ``T = α + (p−1)·k·s/bw``.

Both are ``max_j Σ_i B[i, j] / bw`` plus latencies. The network is contention-free in the
analytical model's sense (one rank per node on a non-blocking switch, or one NVSwitch node),
so the DES, which moves one flow per (sender, receiver) pair, must agree within 1 %.
"""

from __future__ import annotations

import numpy as np
import pytest
from scenarios import cluster, cost_model, single_collective, uneven_all_to_all

from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from ddlsim.workloads.trace import (Block, Collective, GroupFamily, Op, Program, RankClass,
                                    Step, Workload)

P, S, HOT = 8, 64e6, 3
#: (nodes, ranks per node, α in s, bandwidth in B/s) of the two settings
SETTINGS = {"one node": (1, 8, 2e-6, 100e9), "one rank per node": (8, 1, 5.5e-6, 100e9 / 8)}


def _split(k: float) -> list[float]:
    split = [S] * P
    split[HOT] = k * S
    return split


def _expected(algorithm: str, k: float, alpha: float, bw: float) -> float:
    if algorithm == "pairwise":
        return (P - 1) * (alpha + k * S / bw)
    return alpha + (P - 1) * k * S / bw


def _both(setting: str, algorithm: str | None, k: float) -> tuple[float, float, dict]:
    nodes, g, _, _ = SETTINGS[setting]
    system = cluster(nodes, g, "switch")
    wl = uneven_all_to_all(_split(k), algorithm)
    a = simulate_analytical(wl, cost_model(system, wl))
    d, _ = run_des(wl, cost_model(system, wl), record_spans=False)
    assert d.algorithms == a.algorithms
    return a.timings[0].end, d.timings[0].end, a.algorithms


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("algorithm", ["pairwise", "direct"])
def test_hot_receiver_slows_both_engines_by_the_expected_factor(setting, algorithm):
    _, _, alpha, bw = SETTINGS[setting]
    k = 4.0
    even_a, even_d, _ = _both(setting, algorithm, 1.0)
    hot_a, hot_d, _ = _both(setting, algorithm, k)
    assert hot_a == pytest.approx(_expected(algorithm, k, alpha, bw), rel=1e-9)
    assert even_a == pytest.approx(_expected(algorithm, 1.0, alpha, bw), rel=1e-9)
    factor = _expected(algorithm, k, alpha, bw) / _expected(algorithm, 1.0, alpha, bw)
    assert factor > 3.9  # bandwidth-bound: close to k
    assert hot_a / even_a == pytest.approx(factor, rel=1e-9)
    assert hot_d / even_d == pytest.approx(factor, rel=1e-2)
    assert hot_d == pytest.approx(hot_a, rel=1e-2)   # contention-free: the engines agree


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_auto_picks_the_cheaper_uneven_form_and_reports_it(setting):
    _, _, alpha, bw = SETTINGS[setting]
    hot_a, hot_d, algorithms = _both(setting, None, 4.0)
    best = min(("direct", "pairwise"), key=lambda a: _expected(a, 4.0, alpha, bw))
    assert list(algorithms.values()) == [best]
    assert hot_a == pytest.approx(_expected(best, 4.0, alpha, bw), rel=1e-9)
    assert hot_d == pytest.approx(hot_a, rel=1e-2)


@pytest.mark.parametrize("algorithm", ["pairwise", "direct"])
def test_equal_split_is_the_even_all_to_all(algorithm):
    system = cluster(2, 4, "switch")
    even = single_collective("all_to_all", algorithm, P * S, P)
    split = uneven_all_to_all([S] * P, algorithm)
    for engine in ("analytical", "des"):
        t = []
        for wl in (even, split):
            cost = cost_model(system, wl)
            run = simulate_analytical(wl, cost) if engine == "analytical" else run_des(wl, cost)[0]
            t.append(run.timings[0].end)
        assert t[1] == pytest.approx(t[0], rel=1e-9), engine


@pytest.mark.parametrize("kwargs, match", [
    ({"op": "all_reduce", "bytes": 2.0, "split_bytes": (1.0, 1.0)}, "all_to_all only"),
    ({"op": "all_to_all", "bytes": 3.0, "split_bytes": (1.0, 1.0)}, "must equal sum"),
    ({"op": "all_to_all", "bytes": 0.0, "split_bytes": (1.0, -1.0)}, ">= 0"),
])
def test_split_bytes_is_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Collective("x", group="g", **kwargs)


def test_split_bytes_must_name_every_member():
    op = Op(Collective("x", "all_to_all", "g", 2 * S, split_bytes=(S, S)))
    program = Program({"b": Block("b", "other", (op,))}, (Step("b"),))
    group = GroupFamily("g", "ep", np.arange(P).reshape(1, P))
    wl = Workload("short", P, {"g": group}, (RankClass("all", tuple(range(P)), program),))
    with pytest.raises(ValueError, match="split_bytes has 2 entries but group 'g' has 8"):
        wl.validate()


def test_direct_across_two_nodes_is_bound_by_the_nic_of_the_hot_node():
    """2 nodes × 4 ranks, h on node 0: node 1's 4 ranks send (3 + k)·s each into node 0, so
    node 0's NIC takes 4·(3 + k)·s (28·s for k = 4, 16·s even) at 12.5 GB/s; no device link
    carries more than 7·k·s at 100 GB/s. α = 5.5 µs (NIC + switch)."""
    system = cluster(2, 4, "switch")
    times = {}
    for k in (1.0, 4.0):
        wl = uneven_all_to_all(_split(k), "direct")
        a = simulate_analytical(wl, cost_model(system, wl)).timings[0].end
        d = run_des(wl, cost_model(system, wl), record_spans=False)[0].timings[0].end
        assert a == pytest.approx(5.5e-6 + 4 * (3 + k) * S / 12.5e9, rel=1e-9)
        assert d == pytest.approx(a, rel=1e-2)
        times[k] = a
    assert times[4.0] / times[1.0] == pytest.approx(28 / 16, rel=1e-3)

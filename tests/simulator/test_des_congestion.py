"""With contention the DES differs from the closed forms the way physics says it must.

* The seed wiki's case (GPT-2 124M, 9 ranks on 5 nodes with 10 Gb/s NICs): reducing to rank 0
  cannot be faster than the bytes entering node 0's NIC over its bandwidth, and both
  ``sliced_reduce_broadcast`` and ``reduce_scatter`` beat ``reduce_broadcast``.
* An all-to-all whose traffic all leaves through a leaf switch's uplink slows down by the
  fat tree's oversubscription ratio.
* Collectives that run at once over the same links share them fairly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from ddlsim.simulator.des.maxmin import max_min_rates
from scenarios import (cluster, concurrent_collectives, cost_model,
                                            single_collective)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STRATEGIES = ("reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter")


@pytest.fixture(scope="module")
def wiki():
    return {s: ddlsim.predict(EXAMPLES / f"wiki-gpt2-9ranks-{s}.yaml", "des") for s in STRATEGIES}


def _link(result, name: str) -> dict:
    return next(ln for ln in result.links if ln["link"] == name)


def test_wiki_reduce_to_rank0_bounded_by_node0_nic(wiki):
    r = wiki["reduce_broadcast"]
    nic_in = _link(r, "switch0->node0/nic0")
    bound = nic_in["bytes"] / nic_in["bandwidth_Bps"]
    assert nic_in["bytes"] > 0
    reduce = [s for s in r.spans if s.rank == 0 and s.name == "grad.reduce"]
    assert len(reduce) == 1
    assert reduce[0].end_s - reduce[0].start_s >= bound * (1 - 1e-9)
    assert r.breakdown.exposed_comm_s["dp"] >= bound


def test_wiki_sliced_and_reduce_scatter_beat_reduce_broadcast(wiki):
    t = {s: r.iteration_time_s for s, r in wiki.items()}
    assert t["sliced_reduce_broadcast"] < t["reduce_broadcast"]
    assert t["reduce_scatter"] < t["reduce_broadcast"]


def test_wiki_busiest_links_are_nic_links_and_not_overfull(wiki):
    for r in wiki.values():
        top = r.links[0]
        assert top["bandwidth_Bps"] == pytest.approx(10e9 / 8)
        assert "nic" in top["link"]
        assert all(0 < ln["utilisation"] <= 1 + 1e-9 for ln in r.links)
        assert all(ln["busy_s"] >= ln["bytes"] / ln["bandwidth_Bps"] * (1 - 1e-9)
                   for ln in r.links)
        util = [ln["utilisation"] for ln in r.links]
        assert util == sorted(util, reverse=True)


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_oversubscribed_fat_tree_slows_all_to_all_by_the_ratio(ratio):
    """One node per leaf: every byte of the all-to-all leaves through the leaf's uplink,
    which carries 1/ratio of the NIC bandwidth."""
    n = 512e6

    def a2a(r: float) -> float:
        system = cluster(4, 1, "fat_tree", oversubscription=r, nodes_per_leaf=1)
        wl = single_collective("all_to_all", "direct", n, 4)
        run, _ = run_des(wl, cost_model(system, wl))
        return run.timings[0].end

    base, slow = a2a(1.0), a2a(ratio)
    latency = 5e-6
    assert (slow - latency) / (base - latency) == pytest.approx(ratio, rel=1e-3)


def test_concurrent_collectives_share_links_fairly():
    """Two ring all-reduces over the same 4 ranks at once: every ring link carries both, so
    each step moves twice the bytes at the same bandwidth (golden from the closed form)."""
    system = cluster(4, 1, "switch")
    n, p = 64e6, 4
    wl = concurrent_collectives([("all_reduce", "ring", n, 0)] * 2, p)
    run, _ = run_des(wl, cost_model(system, wl))
    alpha, bw = 5e-6 + 0.5e-6, 100e9 / 8
    expected = 2 * (p - 1) * (alpha + 2 * (n / p) / bw)
    assert run.timings[0].end == pytest.approx(expected, rel=1e-9)
    # the analytical engine stretches each by the number sharing (latency too): a bit more
    analytical = simulate_analytical(wl, cost_model(system, wl)).timings[0].end
    assert expected <= analytical == pytest.approx(expected, rel=0.01)


def test_sliced_reduces_spread_over_nics_beat_one_root():
    """Nine reduces of n/9 rooted at different ranks finish before one reduce of n to one
    root: the root's NIC is no longer the only way in."""
    system = cluster(9, 1, "switch")
    n = 90e6
    one = single_collective("reduce", "direct", n, 9)
    sliced = concurrent_collectives([("reduce", "direct", n / 9, i) for i in range(9)], 9)
    t_one = run_des(one, cost_model(system, one))[0].timings[0].end
    t_sliced = run_des(sliced, cost_model(system, sliced))[0].timings[0].end
    assert t_sliced < t_one / 4


def test_max_min_rates_golden():
    """Bertsekas & Gallager's example shape: link 0 (cap 1) carries flows a, b; link 1
    (cap 3) carries b, c; c also crosses link 2 (cap 10). Max-min: a = b = 0.5, c = 2.5."""
    import numpy as np
    pad = 3
    edges = np.array([[0, pad], [0, 1], [1, 2]])
    cap = np.array([1.0, 3.0, 10.0, np.inf])
    rates = max_min_rates(edges, np.ones(3), cap)
    assert rates == pytest.approx([0.5, 0.5, 2.5])
    # multiplicity: a row standing for 3 identical flows takes 3 shares
    rates = max_min_rates(np.array([[0], [0]]), np.array([3.0, 1.0]), np.array([4.0, np.inf]))
    assert rates == pytest.approx([1.0, 1.0])

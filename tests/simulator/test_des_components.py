"""Which flows the DES re-solves after a change: those a change can reach through saturated links.

After flows start or end, the network re-solves only the flows linked to the changed links
through links that are saturated (or that the re-solve fills), and keeps every other rate.
That must give the max-min fair rates of all the flows. Checked on the component finder
itself (its breadth-first and scipy forms against networkx, with and without a set of links
that link), after every re-solve of random flow sets on a bare network, after every re-solve
of whole runs, and on whole runs against re-solving every flow of the touched domains, over
an oversubscribed fat tree, a torus, a rail-optimised DGX fabric and concurrent collectives.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddlsim
from ddlsim.simulator.des import components, run_des
from ddlsim.simulator.des.components import LinkedFlows
from ddlsim.simulator.des.maxmin import max_min_rates
from ddlsim.simulator.des.network import FlowNetwork
from scenarios import cluster, concurrent_collectives, cost_model

PAD = 20


def _both(edges, seeds, through=None):
    finder = LinkedFlows(PAD)
    return finder._grow(edges, seeds, through), finder._components(edges, seeds, through)


def test_hand_example():
    # flows: A on links 1,2; B on 2,3; C on 4; D on nothing but the pad
    edges = np.array([[1, 2], [2, 3], [4, PAD], [PAD, PAD]])
    for got in _both(edges, [np.array([3])]):          # 3 → B → link 2 → A
        assert got.tolist() == [True, True, False, False]
    for got in _both(edges, [np.array([[4, PAD]])]):   # only C crosses 4
        assert got.tolist() == [False, False, True, False]
    for got in _both(edges, [np.array([5, PAD])]):     # nobody crosses 5; the pad links nothing
        assert got.tolist() == [False] * 4


def _reference(edges, seeds, through=None):
    """networkx: flows in a component (flows + links) holding a seed link; only seed links
    and links in ``through`` (all, when None) join flows."""
    seed_ids = {int(e) for s in seeds for e in np.ravel(s) if e != PAD}
    g = nx.Graph()
    g.add_nodes_from(("f", i) for i in range(len(edges)))
    for i, row in enumerate(edges):
        g.add_edges_from((("f", i), ("l", int(e))) for e in row
                         if e != PAD and (through is None or through[e] or e in seed_ids))
    seed = {("l", e) for e in seed_ids if ("l", e) in g}
    out = np.zeros(len(edges), dtype=bool)
    for comp in nx.connected_components(g):
        if comp & seed:
            for kind, i in comp:
                if kind == "f":
                    out[i] = True
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, PAD), min_size=3, max_size=3), min_size=1, max_size=30),
       st.lists(st.integers(0, PAD), max_size=4))
def test_both_forms_find_the_networkx_components(rows, seed):
    edges = np.array(rows, dtype=np.int64)
    seeds = [np.array(seed, dtype=np.int64)]
    want = _reference(edges, seeds)
    for got in _both(edges, seeds):
        assert got.tolist() == want.tolist()
    finder = LinkedFlows(PAD)
    finder(edges, seeds)
    assert not finder._mark.any() and (finder._node == -1).all()  # scratch left clean


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, PAD), min_size=3, max_size=3), min_size=1, max_size=30),
       st.lists(st.integers(0, PAD), max_size=4),
       st.lists(st.booleans(), min_size=PAD + 1, max_size=PAD + 1))
def test_both_forms_link_only_through_the_given_links(rows, seed, through):
    edges = np.array(rows, dtype=np.int64)
    seeds = [np.array(seed, dtype=np.int64)]
    through = np.array(through)
    want = _reference(edges, seeds, through)
    for got in _both(edges, seeds, through):
        assert got.tolist() == want.tolist()


def _check_every_resolve(monkeypatch):
    """After every re-solve, the table's rates must be the max-min rates of all live flows."""
    solve = FlowNetwork._resolve
    seen = []

    def checked(self):
        solve(self)
        s = self._slots
        live = s.live()
        want = max_min_rates(s.edges[live], s.mult[live], self.capacity_Bps)
        np.testing.assert_allclose(s.rate[live], want, rtol=1e-9)
        seen.append(len(live))

    monkeypatch.setattr(FlowNetwork, "_resolve", checked)
    return seen


class _Owner:
    """Counts the flows that ended."""

    def __init__(self):
        self.ended = 0

    def flows_done(self, local):
        self.ended += len(local)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0),                           # start time, s
                          st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True),
                          st.floats(1e8, 5e9),                            # bytes
                          st.integers(1, 3)),                             # identical flows
                min_size=1, max_size=40),
       st.lists(st.sampled_from([1e9, 2e9, 4e9]), min_size=12, max_size=12))
def test_partial_resolves_give_max_min_rates_of_all_flows(flows, caps):
    """Random flows over 12 links of mixed capacities, starting at random times: after
    every re-solve, the rates kept and the rates re-solved are those of solving all flows."""
    import simpy

    env = simpy.Environment()
    net = FlowNetwork(env, np.array(caps))
    net.join([np.arange(12)])
    owner = _Owner()

    def start(at, route, nbytes, mult):
        yield env.timeout(at)
        net.submit(owner, np.array([route]), np.array([nbytes]), np.array([float(mult)]))

    for at, route, nbytes, mult in flows:
        env.process(start(at, route, nbytes, mult))
    with pytest.MonkeyPatch.context() as m:
        seen = _check_every_resolve(m)
        env.run()
    assert seen and net.bytes_delivered == pytest.approx(net.bytes_sent, rel=1e-9)
    assert owner.ended == len(flows)  # every flow delivered its bytes and ended


def _config(system: dict, **parallel) -> ddlsim.RunConfig:
    return ddlsim.load_config({
        "model": {"name": "tiny", "num_hidden_layers": 8, "hidden_size": 256,
                  "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 128},
        "parallel": parallel, "system": system})


def _fabric(fabric: str, **kw) -> dict:
    return cluster(8, 2, fabric, **kw).model_dump(mode="json", exclude_none=True)


CASES = {
    "fat-tree-2:1": (_fabric("fat_tree", oversubscription=2.0, nodes_per_leaf=2),
                     dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)),
    "torus": (_fabric("ring"), dict(pipeline_model_parallel_size=2)),
    "rail-dgx": ({"preset": "dgx-a100", "nodes": 2},
                 dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)),
}


def _case(name: str):
    """The workload of ``CASES[name]`` and its cost model."""
    system, parallel = CASES[name]
    cfg = _config(system, **parallel)
    wl = ddlsim.build_workload(cfg)
    return wl, cost_model(cfg.system, wl, **cfg.parallel.model_dump())


@pytest.mark.parametrize("name", list(CASES))
def test_every_resolve_of_a_run_gives_max_min_rates(name, monkeypatch):
    wl, cost = _case(name)
    seen = _check_every_resolve(monkeypatch)
    run_des(wl, cost, shortcuts=False)
    assert max(seen) > 1  # flows did share the network


def _run(wl, cost, monkeypatch, full: bool, bfs_below: int | None = None):
    with monkeypatch.context() as m:
        if full:  # re-solve every flow of the touched domains after every change
            m.setattr(FlowNetwork, "_isolated", lambda self, added, removed: False)
            m.setattr(FlowNetwork, "_affected", lambda self, pool, seeds: (pool, None))
        if bfs_below is not None:
            m.setattr(components, "BFS_BELOW", bfs_below)
        run, _ = run_des(wl, cost, shortcuts=False)
    return run


def _same(a, b, rel):
    assert a.events > 0 and len(a.timings) == len(b.timings)
    for x, y in zip(a.timings, b.timings):
        assert x.end == pytest.approx(y.end, rel=rel)
    assert a.network.bytes_delivered == pytest.approx(b.network.bytes_delivered, rel=rel)


@pytest.mark.parametrize("name", list(CASES))
def test_restricted_resolves_equal_full_resolves(name, monkeypatch):
    wl, cost = _case(name)
    fast = _run(wl, cost, monkeypatch, full=False)
    _same(fast, _run(wl, cost, monkeypatch, full=True), 1e-9)
    # the two component finders pick the same flows, so the runs are identical
    for bfs_below in (0, 10**9):
        other = _run(wl, cost, monkeypatch, full=False, bfs_below=bfs_below)
        assert [t.end for t in other.timings] == [t.end for t in fast.timings]


def test_mixed_contention_equals_full_resolves(monkeypatch):
    """Four collectives at once, each over four groups of four ranks, on a 2:1 fat tree:
    every family meets the others on the leaf uplinks."""
    system = cluster(8, 2, "fat_tree", oversubscription=2.0, nodes_per_leaf=2)
    wl = concurrent_collectives([("all_reduce", "ring", 4e7, 0), ("all_gather", "ring", 2e7, 0),
                                 ("reduce_scatter", "ring", 3e7, 0), ("broadcast", None, 1e7, 1)],
                                16, group_rows=4, compute_flops=1e9)
    cost = cost_model(system, wl)
    fast = _run(wl, cost, monkeypatch, full=False)
    full = _run(wl, cost, monkeypatch, full=True)
    _same(fast, full, 1e-9)
    assert full.network.rate_updates >= fast.network.rate_updates


def test_join_names_each_domain_by_its_smallest_link():
    import simpy
    net = FlowNetwork(simpy.Environment(), np.full(10, 1e9))
    net.join([np.array([5, 3]), np.array([7, 8]), np.array([4])])
    # {3, 5} and {7, 8} merged; 4 alone (a one-link route joins nothing); the pad (10) alone
    assert net.root.tolist() == [0, 1, 2, 3, 4, 3, 6, 7, 7, 9, 10]
    net.join([np.array([2, 5]), np.array([8, 9, 1])])
    # 2 joins {3, 5}; 1 and 9 join {7, 8}: roots 2 and 1
    assert net.root.tolist() == [0, 1, 2, 2, 4, 2, 6, 1, 1, 1, 10]
    net.join([np.array([3, 8])])   # both domains into one, named 1
    assert net.root.tolist() == [0, 1, 1, 1, 4, 1, 6, 1, 1, 1, 10]


class _Held:
    """A stand-in for a reserving run: counts its materialisations and gives its links back."""

    def __init__(self, net, links):
        self.net, self.links, self.materialised = net, links, 0

    def materialise(self):
        self.materialised += 1
        self.net.release(self.links)


class _Silent:
    def flows_done(self, local):
        pass


def test_a_run_holds_its_links_not_its_domain():
    """Flows on other links of a joined domain leave a run's links idle and its reservation
    standing (they cannot change its max-min rates); a flow over one of its links
    materialises it first. Links 0-2 are one domain (routes 0→2 and 1→2 join them)."""
    import simpy
    env = simpy.Environment()
    net = FlowNetwork(env, np.full(4, 1e9))
    net.join([np.array([0, 2]), np.array([1, 2])])
    assert net.root[:3].tolist() == [0, 0, 0]
    net.submit(_Silent(), np.array([[1, 2]]), np.array([1e6]), np.array([1]))
    assert net.idle(np.array([0])) and not net.idle(np.array([1])) and not net.idle(np.array([2]))
    run = _Held(net, np.array([0]))
    net.reserve(run.links, run)
    assert not net.idle(np.array([0]))
    net.submit(_Silent(), np.array([[1, 2]]), np.array([1e6]), np.array([1]))  # beside it
    assert run.materialised == 0
    net.submit(_Silent(), np.array([[0, 2]]), np.array([1e6]), np.array([1]))  # over it
    assert run.materialised == 1
    env.run()
    assert net.idle(np.array([0, 1, 2, 3]))   # every flow ended, nothing held

"""Summaries, bisection bandwidth and drawings."""

from __future__ import annotations

import json

import pytest

from ddlsim.errors import ConfigError
from ddlsim.topologies import bisection_bandwidth, build_topology, draw, summary
from ddlsim.topologies import report

from topo_helpers import make_spec

NIC_Bps = 12.5e9   # 100 Gb/s


def test_wiki_cluster_summary_counts():
    info = summary(build_topology("cpu-10gbe"))
    assert (info["nodes"], info["devices_per_node"], info["devices"]) == (5, 2, 10)
    assert info["vertices"] == {"device": 10, "host": 5, "nic": 5, "leaf switch": 1}
    assert info["links"]["nic"]["count"] == 5
    assert info["links"]["nic"]["bandwidth_Bps"] == [1.25e9]
    assert info["links"]["nic"]["latency_s"] == [pytest.approx(12.5e-6)]   # half of 25 us
    assert info["links"]["shm"]["count"] == 10
    # nodes 0, 1 against nodes 2..4 through one switch: two 10 Gb/s NICs on the small side
    assert info["bisection_bandwidth_Bps"] == 2 * 1.25e9
    json.dumps(info)


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_fat_tree_oversubscription_divides_bisection(ratio):
    """16 nodes, 4 per leaf: the first half is two leaves with 4 NIC ports each; their uplinks
    carry 4 · B_nic / r, so the bisection is 8 · B_nic / r."""
    topo = build_topology(make_spec(nodes=16, devices_per_node=2,
                                    network={"nodes_per_leaf": 4, "oversubscription": ratio}))
    value, method = bisection_bandwidth(topo)
    assert value == pytest.approx(8 * NIC_Bps / ratio)
    assert "whole graph" in method


def test_r2_halves_the_bisection_of_a_dgx_superpod_sized_tree():
    full = build_topology({"preset": "dgx-a100", "nodes": 64})
    half = build_topology({"preset": "dgx-a100", "nodes": 64, "network": {"oversubscription": 2}})
    assert bisection_bandwidth(full)[0] == pytest.approx(32 * 8 * 25e9)
    assert bisection_bandwidth(half)[0] == pytest.approx(bisection_bandwidth(full)[0] / 2)


def test_torus_bisection_cuts_two_rings_of_links():
    """4 × 4 torus cut between rows 0–1 and rows 2–3: 4 columns × 2 (the wrap) links."""
    topo = build_topology(make_spec(nodes=16, devices_per_node=1,
                                    network={"topology": "torus", "torus_dims": [4, 4]}))
    assert bisection_bandwidth(topo)[0] == pytest.approx(8 * NIC_Bps)


def test_contracted_cut_agrees_with_the_whole_graph(monkeypatch):
    spec = make_spec(nodes=12, devices_per_node=4, nics_per_node=2,
                     network={"nodes_per_leaf": 2, "oversubscription": 1.5})
    whole, method = bisection_bandwidth(build_topology(spec))
    monkeypatch.setattr(report, "FULL_CUT_VERTICES", 0)
    contracted, method2 = bisection_bandwidth(build_topology(spec))
    assert "whole graph" in method and "contracted" in method2
    assert contracted == pytest.approx(whole)


def test_single_node_bisection_is_intra_node():
    value, method = bisection_bandwidth(build_topology("dgx-a100"))
    assert value == pytest.approx(4 * 300e9)   # 4 GPUs' NVSwitch links on the small side
    assert "rest of the node" in method
    one = build_topology(make_spec(nodes=1, devices_per_node=1))
    assert bisection_bandwidth(one) == (None, "one device: no bisection")


def test_draw_writes_a_png(tmp_path):
    out = draw(build_topology(make_spec(nodes=4, network={"nodes_per_leaf": 2})),
               tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_refuses_big_topologies(tmp_path):
    topo = build_topology({"preset": "dgx-a100", "nodes": 32})
    with pytest.raises(ConfigError, match=r"has \d+ vertices \(256 devices\); draw\(\) draws at "
                                          r"most 300"):
        draw(topo, tmp_path / "big.png")
    assert not (tmp_path / "big.png").exists()

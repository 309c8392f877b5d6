"""NCCL's tuning model per release (simulator/collectives/nccl/versions.py): each number below is
derived by hand from src/graph/tuning.cc at the tag named beside it, for 2 nodes × 8 GPUs on
NVSwitch (Hopper at 450 GB/s a GPU, 8 NICs of 50 GB/s a node: 400 GB/s; or Ampere at 300 GB/s,
200 GB/s a node), Intel CPUs."""

from __future__ import annotations

import math

import pytest

from ddlsim.config import CollectivesSpec, SystemConfig, resolve_section
from ddlsim.errors import ConfigError
from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.collectives.nccl import NcclEnv, algbw_GBps, latency_us, nccl_time
from ddlsim.simulator.collectives.nccl.choice import nccl_choice
from ddlsim.simulator.collectives.nccl.system import env_for_system
from ddlsim.simulator.collectives.nccl.versions import DEFAULT_VERSION, NCCL_VERSIONS, version_names


def hopper(version: str, nodes: int = 2, ppn: int = 8) -> GroupNet:
    env = NcclEnv("hopper", nics_per_node=8, version=version)
    return GroupNet(nodes * ppn, ppn, 3.4e-6, 450e9, 16.8e-6, 400e9, nodes=nodes, nccl=env)


def ampere(version: str, nodes: int = 2, ppn: int = 8) -> GroupNet:
    env = NcclEnv("ampere", nics_per_node=8, version=version)
    return GroupNet(nodes * ppn, ppn, 3.4e-6, 300e9, 16.8e-6, 200e9, nodes=nodes, nccl=env)


def test_the_default_release_is_the_configs_and_every_release_is_registered():
    assert CollectivesSpec().nccl_version == DEFAULT_VERSION == "2.30.7"
    assert NcclEnv("hopper").version == DEFAULT_VERSION
    assert version_names() == ("2.21.5", "2.26.2", "2.30.7")
    assert all(NCCL_VERSIONS[v].tag == f"v{v}-1" for v in version_names())


@pytest.mark.parametrize("version, expected", [
    ("2.30.7", 25.0 + 2 * 20.9),  # v2.30.7-1 lines 161, 173, 428: NVLink 25, NET 20.9
    ("2.26.2", 25.0 + 2 * 14.0),  # v2.26.2-1 lines 133, 141, 340: NET 14
    ("2.21.5", 25.0 + 2 * 14.0),  # v2.21.5-1 lines 69, 77, 262
])
def test_nvls_tree_latency_per_release(version, expected):
    """intraLat + 2·log2(nodes)·interLat: NVIDIA/nccl#1244's 2-node NVLS tree (46.5 µs measured
    on 2.21.5) is 53.0 µs by its own release's tables, 66.8 by 2.30.7's."""
    assert latency_us("all_reduce", "nvls_tree", "Simple", 8, hopper(version), hopper(
        version).nccl) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("version, expected", [
    # base 8.4 + 2·((8 − 1)·NVLink tree Simple 4.0 + 1·NET 14): v2.30.7-1 lines 151, 159, 171
    ("2.30.7", 8.4 + 2 * (7 * 4.0 + 14.0)),
    # base 0 + 2·((8 − 1)·28 + 1·28): v2.21.5-1 lines 57, 67, 75, 251–252
    ("2.21.5", 0.0 + 2 * (7 * 28.0 + 28.0)),
])
def test_tree_simple_latency_per_release(version, expected):
    net = ampere(version)
    assert latency_us("all_reduce", "tree", "Simple", 8, net, net.nccl) == pytest.approx(expected)


@pytest.mark.parametrize("version, inter_steps", [("2.30.7", 2), ("2.26.2", 2), ("2.21.5", 4)])
def test_ring_network_steps_per_release(version, inter_steps):
    """Ring LL all-reduce: 6.6 + (30 − nInterSteps)·max(0.6, netOverhead 1.0) + nInterSteps·2.7,
    nInterSteps = 2·(nodes − 1) from 2.23 (v2.26.2-1 line 323), 2·nodes before (v2.21.5-1
    line 161)."""
    net = ampere(version)
    expected = 6.6 + (30 - inter_steps) * 1.0 + inter_steps * 2.7
    assert latency_us("all_reduce", "ring", "LL", 8, net, net.nccl) == pytest.approx(expected)


def test_one_gpu_a_node_takes_the_trees_network_hop_from_2_23():
    """ppn = 1: interLat is NET tree LL 5.0 from 2.23 (v2.26.2-1 line 301), NET ring LL 2.7 in
    2.21.5 (line 227). 2 ranks: nsteps 2; 2.30.7 nInterSteps 2, 2.21.5 4."""
    new, old = ampere("2.30.7", ppn=1), ampere("2.21.5", ppn=1)
    assert latency_us("all_reduce", "ring", "LL", 8, new, new.nccl) == pytest.approx(
        6.6 + 0 * 1.0 + 2 * 5.0)
    assert latency_us("all_reduce", "ring", "LL", 8, old, old.nccl) == pytest.approx(
        6.6 + (2 - 4) * 1.0 + 4 * 2.7)


def test_nvls_bandwidth_before_and_after_nvls_efficiency():
    """One node of 8 H100: NCCL's channels 450 × 20.6/25 = 370.8 GB/s. 2.30.7 (lines 311–315,
    379): 370.8 × 0.85 × 7/8 × 2, × 8/14; 2.26.2 (lines 251, 293): 370.8 × 5/6."""
    link = 450 * 20.6 / 25
    one_node = {v: GroupNet(8, 8, 3.4e-6, 450e9, nccl=NcclEnv("hopper", version=v))
                for v in ("2.30.7", "2.26.2")}
    got = {v: algbw_GBps("all_reduce", "nvls", "Simple", 2**30, n, n.nccl)
           for v, n in one_node.items()}
    assert got["2.30.7"] == pytest.approx(link * 0.85 * 7 / 8 * 2 * 8 / 14)
    assert got["2.26.2"] == pytest.approx(link * 5 / 6)


def test_nvls_tree_bandwidth_before_per_channel_caps():
    """2 nodes: 2.30.7 min(intra, 2 × 400, 8 × perChMaxNVLSTreeBws 57.7) × 16/30 (lines 209,
    320–322); 2.21.5 min(370.8, 400) × 5/6 (lines 176, 216)."""
    new, old = hopper("2.30.7"), hopper("2.21.5")
    intra = 450 * 20.6 / 25 * 0.85 * 7 / 8 * 2
    assert algbw_GBps("all_reduce", "nvls_tree", "Simple", 2**30, new, new.nccl) == \
        pytest.approx(min(intra, 800, 8 * 57.7) * 16 / 30)
    assert algbw_GBps("all_reduce", "nvls_tree", "Simple", 2**30, old, old.nccl) == \
        pytest.approx(min(450 * 20.6 / 25, 400) * 5 / 6)


def test_the_ring_ll_time_taken_keeps_its_measured_steps_in_every_release():
    """hops.py replaces NCCL's ring LL steps by measured ones: the time taken is
    base + (nsteps − crossings)·max(step, floor) + crossings·network step whichever release's
    estimate it replaces (base 6.6 in all three)."""
    times = {v: nccl_time("all_reduce", "ring", "LL", 8, ampere(v), ampere(v).nccl)
             for v in version_names()}
    assert max(times.values()) == pytest.approx(min(times.values()), rel=1e-12)


def test_the_release_changes_ncclS_choice():
    """2 MiB on 2 Hopper nodes: NCCL 2.30.7 estimates the NVLS tree at 66.8 µs of latency and
    8 × 57.7 × 16/30 GB/s, so the tree/LL128 wins; 2.26.2 at 53.0 µs and 370.8 × 5/6 GB/s,
    so the NVLS tree wins (the estimates compared are each release's own)."""
    new, old = hopper("2.30.7"), hopper("2.26.2")
    assert nccl_choice("all_reduce", 2**21, new, new.nccl) == ("tree", "LL128")
    assert nccl_choice("all_reduce", 2**21, old, old.nccl) == ("nvls_tree", "Simple")


def test_an_untabulated_release_is_refused_with_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"nccl_version = '2\.99\.1'.*allowed: 2\.21\.5, "
                                          r"2\.26\.2, 2\.30\.7"):
        NcclEnv("hopper", version="2.99.1")
    with pytest.raises(ValueError, match=r"nccl_version"):
        CollectivesSpec(nccl_version="2.16.5")


def test_a_release_without_rows_for_the_gpu_is_refused():
    with pytest.raises(ConfigError, match=r"'2\.21\.5' has no tuning rows for gpu_arch "
                                          r"'blackwell'"):
        NcclEnv("blackwell", version="2.21.5")


def test_the_system_setting_reaches_ncclS_model():
    spec = {"preset": "dgx-h100", "nodes": 2, "collectives": {"nccl_version": "2.21.5"}}
    env = env_for_system(SystemConfig.model_validate(resolve_section("system", spec)))
    assert env.version == "2.21.5"
    assert not math.isinf(nccl_time("all_reduce", "nvls_tree", "Simple", 8, hopper("2.21.5"),
                                     env))


def test_nvls_all_gather_bandwidth_conversion_per_release():
    """One node of 8 H100, all-gather: 2.21.5 converts every algorithm's bus bandwidth but
    CollNet-direct's (line 213: NVLS × 5/6); 2.26.2 only the ring's (line 290: NVLS keeps
    the graph's 370.8 GB/s)."""
    link = 450 * 20.6 / 25
    got = {v: algbw_GBps("all_gather", "nvls", "Simple", 2**30, n, n.nccl)
           for v, n in ((v, GroupNet(8, 8, 3.4e-6, 450e9, nccl=NcclEnv("hopper", version=v)))
                        for v in ("2.21.5", "2.26.2"))}
    assert got["2.21.5"] == pytest.approx(link * 5 / 6)
    assert got["2.26.2"] == pytest.approx(link)

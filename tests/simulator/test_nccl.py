"""NCCL's collectives as its tuning model times them (NCCL 2.30.7, src/graph/tuning.cc).

Every number below is derived by hand from tuning.cc's formulas and constants (cited in
simulator/collectives/nccl/tuning.py), for one machine: 2 nodes × 8 Ampere GPUs, NVSwitch at
300 GB/s per GPU, 8 NICs of 25 GB/s per node (200 GB/s a node), Intel CPUs, protocol Simple.
"""

from __future__ import annotations

import math

import pytest

from ddlsim.simulator.collectives import GroupNet, algorithms_for, best_algorithm
from ddlsim.simulator.collectives.nccl import NcclEnv, best_protocol, latency_us, nccl_time
from ddlsim.simulator.collectives.nccl.model import estimate_time
from ddlsim.simulator.collectives.nccl.hops import NET_LL_HOP_US

ENV = NcclEnv("ampere", nics_per_node=8, protocol="Simple")
NET = GroupNet(16, 8, 3.4e-6, 300e9, 16.8e-6, 200e9, nodes=2, nccl=ENV)

# link busBw: min(300 GB/s × SM80_NVLINK_BW/25 = 240, 200) = 200 GB/s; channels
# 200 / speedArrayInter[0] (48) = 4.1667
CHANNELS = 200 / 48
# ring Simple: busBw 200; algBw = 200 × nRanks/nsteps = 200 × 16/30
RING_ALGBW = 200 * 16 / 30
# ring latency: base 8.4 + (30 − 2 inter steps) × max(NVLink ring Simple 3.4, net overhead
# 1.0 × 3) + 2 × NET ring Simple 14.0 = 131.6 µs; × 1.4 (the ring plateau of
# ncclTopoGetAlgoTime, Ampere) once bytes / (channels × ranks) >= 64
RING_LAT = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4
# tree all-reduce: busBw = min(200 × 0.92, channels × perChMaxTreeBw[Ampere][2 nodes] 23.6),
# algBw = busBw × 1/2, × treeCorrectionFactor[Simple][log2(bytes/64)]
TREE_ALGBW = min(200 * 0.92, CHANNELS * 23.6) * 0.5
# tree latency: base 8.4 + 2 × ((8 − 1) × NVLink tree Simple 4.0 + log2(2) × NET tree Simple 14)
TREE_LAT = 8.4 + 2 * (7 * 4.0 + 1 * 14.0)
# the tree's pipeline fill (collectives/nccl/tree.py): 2·((8 − 1) + log2 2) = 16 hops, so
# 15 more moves of one Simple chunk (4 MiB buffer / 8 steps = 512 KiB; a 4 MiB message is
# 1 MiB per channel, more than a chunk) on each of round(4.17) = 4 channels, at the
# uncorrected algBw: 15 × 512 KiB × 4 / TREE_ALGBW
TREE_FILL_US = 15 * 512 * 2**10 * 4 / (1e3 * TREE_ALGBW)


def test_ring_and_tree_times_follow_the_tuning_model():
    n = 4 * 2**20  # log2(4 MiB / 64) = 16: correction 0.7
    assert latency_us("all_reduce", "ring", "Simple", n, NET, ENV) == pytest.approx(RING_LAT)
    assert latency_us("all_reduce", "tree", "Simple", n, NET, ENV) == pytest.approx(TREE_LAT)
    ring = (RING_LAT + n / (1e3 * RING_ALGBW)) * 1e-6
    tree = (TREE_LAT + TREE_FILL_US + n / (1e3 * TREE_ALGBW * 0.7)) * 1e-6
    assert nccl_time("all_reduce", "ring", "Simple", n, NET, ENV) == pytest.approx(ring)
    assert nccl_time("all_reduce", "tree", "Simple", n, NET, ENV) == pytest.approx(tree)


def test_ring_tree_crossover():
    """Within 4–8 MiB (tree correction 0.7) tree and ring cross where
    TREE_LAT + n/(1e3·0.7·TREE_ALGBW) = RING_LAT + n/(1e3·RING_ALGBW): n* ≈ 4.67 MB."""
    crossover = (RING_LAT - TREE_LAT) / (1 / (1e3 * 0.7 * TREE_ALGBW) - 1 / (1e3 * RING_ALGBW))
    assert 4 * 2**20 < crossover < 8 * 2**20
    below, above = crossover * 0.98, crossover * 1.02
    assert best_algorithm("all_reduce", below, NET, "nccl")[0] == "nccl_tree"
    assert best_algorithm("all_reduce", above, NET, "nccl")[0] == "nccl_ring"
    # at 1 MiB (correction 0.5) the tree wins by its latency; at 64 MiB (0.8) the ring
    assert best_algorithm("all_reduce", 2**20, NET, "nccl")[0] == "nccl_tree"
    assert best_algorithm("all_reduce", 64 * 2**20, NET, "nccl")[0] == "nccl_ring"


def test_protocols_ll_ll128_simple():
    """Ring LL: busBw × 1/2 capped at llMaxBw (Intel, 2 nodes: 39 GB/s); LL128: × 0.92 capped
    at channels × 20 GB/s (Ampere); their latencies: base 6.6 / 14.0 plus steps at the LL /
    LL128 hardware latencies. NCCL runs 64 KiB of ring LL on 16 ranks on one of its
    round(4.17) = 4 channels (a channel needs 512 threads × 8 B × 16 ranks = 64 KiB:
    enqueue.cc topoGetAlgoInfo), at a quarter of the bandwidth; LL128 keeps all 4 (5 KiB a
    channel). The LL time taken counts each NVLink step at the A100's measured 1.877 µs and
    the 4 network steps of the ring's longest path (30 hops, crossing every 8) at the measured
    network step (simulator/collectives/nccl/hops.py), NCCL's estimate 28 steps at its 0.6 µs (no
    less than its 1 µs floor) and 2 at its 2.7 µs."""
    env = NcclEnv("ampere", nics_per_node=8)
    net = GroupNet(16, 8, 3.4e-6, 300e9, 16.8e-6, 200e9, nodes=2, nccl=env)
    n = 2**16
    ll_bw = min(39.0, 100.0) * 16 / 30
    ll_lat = 6.6 + 26 * max(1.877, 1.0) + 4 * NET_LL_HOP_US
    ll = (ll_lat + n / (1e3 * ll_bw * (1 / 4))) * 1e-6
    assert nccl_time("all_reduce", "ring", "LL", n, net, env) == pytest.approx(ll)
    guess = (6.6 + 28 * max(0.6, 1.0) + 2 * 2.7 + n / (1e3 * ll_bw)) * 1e-6
    assert estimate_time("all_reduce", "ring", "LL", n, net, env) == pytest.approx(guess)
    ll128_lat = 14.0 + 28 * max(1.9, 1.0) + 2 * 4.0
    ll128 = (ll128_lat + n / (1e3 * min(200 * 0.92, CHANNELS * 20.0) * 16 / 30)) * 1e-6
    assert nccl_time("all_reduce", "ring", "LL128", n, net, env) == pytest.approx(ll128)
    assert best_protocol("all_reduce", "ring", 1024, net, env)[0] == "LL"
    assert best_protocol("all_reduce", "ring", 2**30, net, env)[0] == "Simple"


def test_nvls_and_collnet_need_their_hardware():
    one_node = GroupNet(8, 8, 3.4e-6, 450e9, nccl=NcclEnv("hopper"))
    assert math.isfinite(nccl_time("all_reduce", "nvls", "Simple", 2**26, one_node,
                                   one_node.nccl))
    ampere = GroupNet(8, 8, 3.4e-6, 300e9, nccl=NcclEnv("ampere"))
    assert nccl_time("all_reduce", "nvls", "Simple", 2**26, ampere, ampere.nccl) == math.inf
    assert nccl_time("all_reduce", "collnet", "Simple", 2**26, NET, ENV) == math.inf
    sharp = NcclEnv("ampere", sharp=True, nics_per_node=8, protocol="Simple")
    net = GroupNet(16, 8, 3.4e-6, 300e9, 16.8e-6, 200e9, nodes=2, nccl=sharp)
    # CollNet-direct: GPU/NIC ratio 8/8 = 1, busBw 200 unchanged, algBw × 1/2; latency
    # 0 + 2 × (min(1, 7) × NVLink CollNet 3.7 + 7 × 0.4) + NET CollNet 31
    t = (2 * (3.7 + 7 * 0.4) + 31.0 + 2**26 / (1e3 * 100.0)) * 1e-6
    assert nccl_time("all_reduce", "collnet", "Simple", 2**26, net, sharp) == pytest.approx(t)


def test_auto_under_nccl_picks_only_nccl_algorithms():
    """Issue 11: `auto` must not pick recursive doubling or Rabenseifner under NCCL."""
    for n in (1e3, 1e5, 8 * 2**20, 2**30):
        name, _ = best_algorithm("all_reduce", n, NET, "nccl")
        assert name in algorithms_for("all_reduce", "nccl")
    # the same net under MPI still has its own set
    assert "rabenseifner" in algorithms_for("all_reduce", "mpi")
    assert "rabenseifner" not in algorithms_for("all_reduce", "nccl")

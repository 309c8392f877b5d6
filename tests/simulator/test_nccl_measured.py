"""NCCL as nccl-tests measures it (simulator/collectives/nccl/measured.py): the chunk sizes NCCL
picks (src/enqueue.cc ``calcCollChunking``, NCCL 2.26.2, thresholds derived by hand below), the
NVLS plateau and pipeline fill, and NCCL's choice by its own estimate, not by the time taken."""

from __future__ import annotations

import math

import pytest

from ddlsim.simulator.collectives import GroupNet, best_algorithm
from ddlsim.simulator.collectives.nccl import NcclEnv, nccl_time
from ddlsim.simulator.collectives.nccl.measured import FILL_CHUNKS, nvls_chunk_bytes
from ddlsim.simulator.collectives.nccl.choice import nccl_choice
from ddlsim.simulator.collectives.nccl.model import ALGORITHMS, estimate_time
from ddlsim.simulator.collectives.nccl.tuning import PROTOCOLS

KIB, MIB, GIB = 2**10, 2**20, 2**30
HOPPER = NcclEnv("hopper", nics_per_node=8)
#: 8 x H100 on NVSwitch: 450 GB/s NVLink per GPU and direction (H100 datasheet)
ONE_NODE = GroupNet(8, 8, 1e-6, 450e9, nccl=HOPPER)
#: 2 such nodes, 8 x 50 GB/s NICs each
TWO_NODES = GroupNet(16, 8, 1e-6, 450e9, 5e-6, 400e9, nodes=2, nccl=HOPPER)


@pytest.mark.parametrize("n,chunk", [
    # NVLS, 16 channels x 8 heads = 128 ops: 128 KiB from 64·128·128 KiB = 1 GiB,
    # 64 KiB from 8·128·64 KiB = 64 MiB, 32 KiB from 2·128·32 KiB = 8 MiB, else 16 KiB
    (GIB, 128 * KIB), (GIB - 1, 64 * KIB), (64 * MIB, 64 * KIB), (64 * MIB - 1, 32 * KIB),
    (8 * MIB, 32 * KIB), (8 * MIB - 1, 16 * KIB), (1, 16 * KIB)])
def test_nvls_chunk_follows_nccls_thresholds(n, chunk):
    assert nvls_chunk_bytes("nvls", n, 128, 1) == chunk


@pytest.mark.parametrize("nodes,n,chunk", [
    # NVLS-tree, 128 ops: 128 KiB from 4·128·128 KiB = 64 MiB, 64 KiB from 1·128·64 KiB =
    # 8 MiB, else 32 KiB; from 4 nodes the chunk is at most 64 KiB
    (2, 64 * MIB, 128 * KIB), (2, 64 * MIB - 1, 64 * KIB), (2, 8 * MIB, 64 * KIB),
    (2, 8 * MIB - 1, 32 * KIB), (4, 16 * GIB, 64 * KIB), (4, 8 * MIB - 1, 32 * KIB)])
def test_nvls_tree_chunk_follows_nccls_thresholds(nodes, n, chunk):
    assert nvls_chunk_bytes("nvls_tree", n, 128, nodes) == chunk


def test_nvls_plateau_and_fill_by_hand():
    """8 x H100, 8 GiB: algBw 275/450 x 450 = 275 GB/s (NCCL estimates more), latency 25 µs
    (NCCL's NVLink NVLS hw latency), fill FILL_CHUNKS x 128 ops x 128 KiB / 275 GB/s."""
    n = 8 * GIB
    fill_us = FILL_CHUNKS["nvls"] * 128 * 128 * KIB / (1e3 * 275.0)
    want = (25.0 + fill_us + n / (1e3 * 275.0)) * 1e-6
    assert nccl_time("all_reduce", "nvls", "Simple", n, ONE_NODE, HOPPER) == pytest.approx(want)
    assert estimate_time("all_reduce", "nvls", "Simple", n, ONE_NODE, HOPPER) < want
    # busbw = n / t x 2(p-1)/p: just under nccl-tests#212's ~480 GB/s
    assert 470 < n / want * 2 * 7 / 8 / 1e9 < 481


@pytest.mark.parametrize("n", [8, 64 * KIB, MIB])
def test_nvls_fill_of_a_message_under_one_round_is_its_bytes(n):
    """Under concurrentOps x chunk (128 ops x 16 KiB, NCCL's smallest NVLS chunk, = 2 MiB on
    8 H100) each op holds n / 128 bytes, not a chunk: the fill is FILL_CHUNKS x n / algBw, so
    a few bytes take NCCL's 25 µs NVLS latency and nothing more."""
    fill_us = FILL_CHUNKS["nvls"] * n / (1e3 * 275.0)
    want = (25.0 + fill_us + n / (1e3 * 275.0)) * 1e-6
    assert nccl_time("all_reduce", "nvls", "Simple", n, ONE_NODE, HOPPER) == pytest.approx(want)


def test_nvls_fill_makes_mid_sizes_slower_than_the_plateau():
    """The fill is a latency that grows with NCCL's chunk: bus bandwidth rises with size."""
    busbw = [n / nccl_time("all_reduce", "nvls", "Simple", n, ONE_NODE, HOPPER) / 1e9
             for n in (16 * MIB, 128 * MIB, GIB, 8 * GIB)]
    assert busbw == sorted(busbw) and busbw[0] < 0.7 * busbw[-1]


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_ring_takes_nccls_estimate(op):
    """Where NCCL keeps all its channels (below, :mod:`.channels` drops some); the LL protocol
    also takes the ring's network steps as measured (:mod:`.hops`), the same at every size."""
    from ddlsim.simulator.collectives.nccl.hops import ring_ll_extra_us
    for proto in PROTOCOLS:
        extra = 0.0 if proto != "LL" else 1e-6 * ring_ll_extra_us(
            op, TWO_NODES.p, TWO_NODES.nodes, "hopper", "nvlink", HOPPER.cpu)
        for n in (4 * MIB, 1 * GIB):
            assert nccl_time(op, "ring", proto, n, TWO_NODES, HOPPER) == pytest.approx(
                estimate_time(op, "ring", proto, n, TWO_NODES, HOPPER) + extra, rel=1e-12)
        assert (extra > 0) == (proto == "LL")


def test_nccl_chooses_by_its_estimate_not_by_the_time_taken():
    """2 x 8 H100 at 4 MiB: NCCL's estimate picks NVLS-tree, which then takes longer than
    the ring LL128 would (its pipeline fill is not in the estimate): ddlsim picks what NCCL
    picks."""
    n = 4 * MIB
    algo, proto = nccl_choice("all_reduce", n, TWO_NODES, HOPPER)
    estimates = {(a, p): estimate_time("all_reduce", a, p, n, TWO_NODES, HOPPER)
                 for a in ALGORITHMS["all_reduce"] for p in PROTOCOLS}
    assert estimates[(algo, proto)] == min(estimates.values())
    name, t = best_algorithm("all_reduce", n, TWO_NODES, "nccl")
    assert name == f"nccl_{algo}" == "nccl_nvls_tree"
    assert t > nccl_time("all_reduce", "ring", "LL128", n, TWO_NODES, HOPPER)
    assert estimates[("ring", "LL128")] > estimates[(algo, proto)]


def test_no_choice_without_an_nccl_machine():
    net = GroupNet(8, 8, 1e-6, 450e9)
    assert math.isinf(best_algorithm("all_reduce", MIB, net, "nccl")[1])


@pytest.mark.parametrize("gpus", [2, 3])
def test_nvls_needs_more_than_two_gpus_on_a_node(gpus):
    """src/transport/nvls.cc ncclNvlsInit (NCCL 2.18.1 to 2.26.2): no NVLS with ``gpuCount
    <= 2``; with 3 GPUs it runs."""
    net = GroupNet(gpus, gpus, 1e-6, 450e9, nccl=HOPPER)
    t = nccl_time("all_reduce", "nvls", "Simple", GIB, net, HOPPER)
    assert math.isinf(t) == (gpus == 2)
    two_nodes = GroupNet(2 * gpus, gpus, 1e-6, 450e9, 5e-6, 400e9, nodes=2, nccl=HOPPER)
    t = nccl_time("all_reduce", "nvls_tree", "Simple", GIB, two_nodes, HOPPER)
    assert math.isinf(t) == (gpus == 2)

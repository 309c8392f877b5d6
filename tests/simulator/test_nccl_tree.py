"""The tree all-reduce's pipeline fill (simulator/collectives/nccl/tree.py): NCCL's LL128 tree chunk
(src/enqueue.cc ``calcCollChunking``, NCCL 2.26.2, thresholds derived by hand below), the fill
by hand on 8 nodes of 8 H100s, its cap for messages under one chunk per channel, and no fill for
LL."""

from __future__ import annotations

import pytest

from ddlsim.simulator.collectives import GroupNet
from ddlsim.simulator.collectives.nccl import NcclEnv, nccl_time
from ddlsim.simulator.collectives.nccl.model import estimate_time
from ddlsim.simulator.collectives.nccl.tree import tree_chunk_bytes, tree_depth

KIB, MIB = 2**10, 2**20
HOPPER = NcclEnv("hopper", nics_per_node=8)
#: 8 nodes of 8 H100s: 450 GB/s NVLink per GPU and direction, 8 x 50 GB/s NICs a node
EIGHT_NODES = GroupNet(64, 8, 1e-6, 450e9, 5e-6, 400e9, nodes=8, nccl=HOPPER)
# NCCL's link busBw min(450 x 20.6/25, 400) = 370.8 GB/s, channels 370.8 / 48 = 7.725 (8);
# tree LL128 busBw min(370.8 x 120/128, 7.725 x perChMaxTreeLL128Bw[Hopper][>= 3 nodes] 29.0)
# = 224.025, algBw (before the size correction) half of it
ALGBW = min(370.8 * 120 / 128, 370.8 / 48 * 29.0) / 2
# 2·((8 − 1) + log2 8) = 20 hops up the chain and tree and back down
DEPTH = 20


def test_depth_counts_nccls_tree_hops():
    assert tree_depth(64, 8) == DEPTH
    assert tree_depth(16, 2) == 16 and tree_depth(8, 1) == 14


@pytest.mark.parametrize("n,chunk", [
    # 8 nodes x 8 GPUs, 8 channels: nstepsLL128 = 1 + log2(8) + 0.1·8 = 4.8; the first rule
    # halves 576,000 B (614,400 B step, 15/16 data) while n // (8·c) < 4.8·64/8 = 38.4, i.e.
    # n < 39·8·c, down to 72,000; the second while n // (8·c) < 9.6 (n < 10·8·c) above 32 KiB
    (39 * 8 * 576000, 576000), (39 * 8 * 576000 - 1, 288000),
    (39 * 8 * 144000, 144000), (39 * 8 * 144000 - 1, 72000),
    (10 * 8 * 72000, 72000), (10 * 8 * 72000 - 1, 36000),
    (4 * MIB, 36000), (10 * 8 * 36000 - 1, 18000), (MIB, 18000), (1, 18000)])
def test_ll128_tree_chunk_follows_nccls_thresholds(n, chunk):
    assert tree_chunk_bytes("LL128", n, 8, 64, 8) == chunk


def test_simple_tree_chunk_is_one_buffer_step():
    assert tree_chunk_bytes("Simple", 1, 8, 64, 8) == 4 * MIB // 8 == \
        tree_chunk_bytes("Simple", 8 * 2**30, 8, 64, 8)


def test_ll128_fill_by_hand():
    """4 MiB on 8 x 8 H100 (nccl-tests#309's 8-node size): 19 more moves of a 36,000 B chunk
    on 8 channels at the uncorrected algBw, over NCCL's estimate."""
    n = 4 * MIB
    fill_s = (DEPTH - 1) * 36000 * 8 / (ALGBW * 1e9)
    assert nccl_time("all_reduce", "tree", "LL128", n, EIGHT_NODES, HOPPER) == pytest.approx(
        estimate_time("all_reduce", "tree", "LL128", n, EIGHT_NODES, HOPPER) + fill_s)


def test_fill_of_a_message_under_one_chunk_per_channel_is_capped():
    """80,000 B is 10,000 B a channel, less than a chunk: the fill moves that share 19 times
    (and NCCL keeps its 8 channels: 640 threads × 8 B = 5,120 B a channel is enough)."""
    n = 80000.0
    fill_s = (DEPTH - 1) * n / (ALGBW * 1e9)
    assert nccl_time("all_reduce", "tree", "LL128", n, EIGHT_NODES, HOPPER) == pytest.approx(
        estimate_time("all_reduce", "tree", "LL128", n, EIGHT_NODES, HOPPER) + fill_s)


def test_ll_forwards_each_word_and_pays_no_fill():
    for n in (64 * KIB, 4 * MIB):
        assert nccl_time("all_reduce", "tree", "LL", n, EIGHT_NODES, HOPPER) == \
            estimate_time("all_reduce", "tree", "LL", n, EIGHT_NODES, HOPPER)


def test_fill_grows_with_depth():
    """The same per-node group on more nodes: more hops, a longer fill at the same size."""
    two = GroupNet(16, 8, 1e-6, 450e9, 5e-6, 400e9, nodes=2, nccl=HOPPER)
    extra = [nccl_time("all_reduce", "tree", "Simple", 64 * MIB, net, HOPPER)
             - estimate_time("all_reduce", "tree", "Simple", 64 * MIB, net, HOPPER)
             for net in (two, EIGHT_NODES)]
    assert 0 < extra[0] < extra[1]


@pytest.mark.parametrize("n,used", [
    # ring LL on 64 ranks: a channel needs 512 threads × 8 B × 64 ranks = 256 KiB
    (8 * 256 * KIB, 8), (8 * 256 * KIB - 1, 7), (3 * 256 * KIB, 3), (256 * KIB - 1, 1), (8, 1)])
def test_small_ring_ll_runs_on_fewer_channels(n, used):
    """NCCL drops channels below 256 KiB a channel (enqueue.cc topoGetAlgoInfo): the
    bandwidth term grows by 8 / channels used; the estimate NCCL chose by does not. (The time
    taken also counts the ring's network steps as measured, a latency the same at every size:
    simulator/collectives/nccl/hops.py.)"""
    bw = estimate_time("all_reduce", "ring", "LL", n, EIGHT_NODES, HOPPER)
    lat = estimate_time("all_reduce", "ring", "LL", 0.0, EIGHT_NODES, HOPPER)
    took = nccl_time("all_reduce", "ring", "LL", n, EIGHT_NODES, HOPPER)
    took_lat = nccl_time("all_reduce", "ring", "LL", 0.0, EIGHT_NODES, HOPPER)
    assert took - took_lat == pytest.approx((bw - lat) * 8 / used)

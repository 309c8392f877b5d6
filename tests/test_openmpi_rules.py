"""``system.collectives.backend: openmpi``: Open MPI's fixed ``coll/tuned`` decisions.

Source: open-mpi/ompi ``ompi/mca/coll/tuned/coll_tuned_decision_fixed.c`` at commit
8efebee745e15516a7f5f1f295df86c78014c76c; the line numbers below are that file's. Open MPI's
algorithm ids are those listed at the top of each function; the ddlsim algorithm each maps
onto is docs/collectives-openmpi.md's table.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import ddlsim
from ddlsim.api import _placement, build_workload
from ddlsim.errors import ConfigError
from ddlsim.simulator.collectives import algorithms_for, collective_time
from ddlsim.simulator.collectives.openmpi import NAMES, TABLES, openmpi_algorithm, openmpi_id
from ddlsim.simulator.costs import CostModel

KIB, MIB = 1024, 1024 * 1024
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_tables_are_well_formed_and_every_pick_is_a_registered_algorithm():
    """Rows and columns strictly increase and end at infinity (every size has a decision);
    every id a table can return maps onto an algorithm ddlsim registers for that op."""
    for key, table in TABLES.items():
        op = key.split("/")[0]
        bounds = [p for p, _ in table]
        assert bounds == sorted(set(bounds)) and bounds[-1] == math.inf, key
        for _, cols in table:
            sizes = [s for s, _ in cols]
            assert sizes == sorted(set(sizes)) and sizes[-1] == math.inf, key
            for _, alg in cols:
                assert NAMES[op][alg] in algorithms_for(op), (key, alg)


@pytest.mark.parametrize("op,nbytes,p,g,want", [
    # allreduce_intra_dec_fixed, p < 4 row (l.122-136): <8 B ring (4), <4096 recursive
    # doubling (3), <8192 ring, <16384 RD, <65536 ring, <262144 segmented ring (5) = ring
    # here, else Rabenseifner (6)
    ("all_reduce", 7, 2, 2, "ring"), ("all_reduce", 8, 2, 2, "recursive_doubling"),
    ("all_reduce", 4096, 2, 2, "ring"), ("all_reduce", 200 * KIB, 2, 2, "ring"),
    ("all_reduce", 256 * KIB, 2, 2, "rabenseifner"),
    # p < 16 row (l.146-151): RD below 8192 B, Rabenseifner from it
    ("all_reduce", 8191, 8, 8, "recursive_doubling"), ("all_reduce", 8192, 8, 8, "rabenseifner"),
    # p < 512 row (l.180-185): below 4096 B "nonoverlapping" (2: reduce then bcast) = tree
    ("all_reduce", 4095, 256, 8, "tree"), ("all_reduce", 4096, 256, 8, "rabenseifner"),
    # disjoint table (l.319-336), one rank per node: p == 2 RD; p < 4 allgather_reduce (7);
    # p < 8: 7 below 1 MiB, then RD; p < 16: 7 < 256 KiB, Rabenseifner < 1 MiB, RD above
    ("all_reduce", 1e9, 2, 1, "recursive_doubling"),
    ("all_reduce", 1e9, 3, 1, "allgather_reduce"),
    ("all_reduce", MIB - 1, 4, 1, "allgather_reduce"),
    ("all_reduce", MIB, 4, 1, "recursive_doubling"),
    ("all_reduce", 512 * KIB, 12, 1, "rabenseifner"),
    ("all_reduce", 64 * MIB, 12, 1, "recursive_doubling"),
    # not disjoint (two ranks share a node): the general p < 8 row (l.138-145), Rabenseifner
    ("all_reduce", MIB, 4, 2, "rabenseifner"),
    # allgather_intra_dec_fixed (l.1386-1397): p == 2 two_proc (6) = RD; p < 32 always RD
    # (3), whatever the size; p < 128 (l.1398-): per-rank block < 512 B RD, else neighbour
    # exchange (5) or ring (4), both the ring here
    ("all_gather", 1e9, 8, 8, "recursive_doubling"), ("all_gather", 1e9, 2, 2,
                                                      "recursive_doubling"),
    ("all_gather", 64 * 511, 64, 8, "recursive_doubling"), ("all_gather", 64 * 512, 64, 8,
                                                             "ring"),
    # reduce_scatter_intra_dec_fixed, p < 32 row (l.1139-): recursive halving (2) below
    # 256 KiB of the whole vector, ring (3) from it
    ("reduce_scatter", 256 * KIB - 1, 16, 8, "recursive_halving"),
    ("reduce_scatter", 256 * KIB, 16, 8, "ring"),
    # bcast_intra_dec_fixed, p < 32 row (l.780-786): k-nomial (7) below 4 KiB = binomial
    # here, binomial (6) below 1 MiB, scatter + allgather (8) above
    ("broadcast", 4095, 16, 8, "binomial"), ("broadcast", MIB, 16, 8, "scatter_allgather"),
    # bcast disjoint (l.880-): p < 4 always linear (1) = direct
    ("broadcast", 1e9, 3, 1, "direct"),
    # alltoall_intra_dec_fixed, p < 128 row (l.508-): per-peer block < 1 KiB modified Bruck
    # (3) = direct here, >= 256 KiB pairwise (2)
    ("all_to_all", 64 * 1023, 64, 8, "direct"), ("all_to_all", 64 * 256 * KIB, 64, 8,
                                                  "pairwise"),
    # reduce_intra_dec_fixed, commutative, 32 <= p < 256 (l.1035-): binomial (5)
    ("reduce", 1e9, 64, 8, "binomial"),
    # barrier (l.673-): every Open MPI barrier is the dissemination barrier here
    ("barrier", 0, 64, 8, "dissemination"),
])
def test_openmpi_decisions_follow_the_fixed_rules(op, nbytes, p, g, want):
    assert openmpi_algorithm(op, nbytes, p, g) == want


def test_the_segmented_ring_is_algorithm_5_and_maps_to_the_ring():
    """At p = 2, 64 KiB ≤ n < 256 KiB (l.133-134) Open MPI picks id 5, segmented ring."""
    assert openmpi_id("all_reduce", 100 * KIB, 2, 2) == 5
    assert openmpi_id("all_to_all", 1, 2, 2) == 2 and openmpi_id("nonsense", 1, 2, 2) is None


def test_allgather_reduce_is_a_recursive_doubling_all_gather_of_p_vectors():
    """⌈log2 p⌉ exchanges; the k-th moves p·n/2^(k+1) bytes (all p vectors end on every
    rank): for p = 4 inside a node, 2α + (2n + n)/B = 2α + 3n/B."""
    from ddlsim.simulator.collectives import GroupNet
    n, alpha, bw = 1e6, 2e-6, 100e9
    net = GroupNet(4, 4, alpha, bw)
    assert collective_time("all_reduce", "allgather_reduce", n, net) == pytest.approx(
        2 * alpha + 3 * n / bw, rel=1e-12)


DISJOINT_DP = {"model": "gpt3-1.3b",
               "parallel": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 1,
                            "overlap_grad_reduce": False},
               "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
               "system": {"preset": "dgx-a100", "nodes": 4}}


def _with_backend(backend: str) -> dict:
    return {**DISJOINT_DP, "system": {**DISJOINT_DP["system"],
                                      "collectives": {"backend": backend}}}


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_openmpi_and_mpich_predictions_differ_where_their_rules_do(engine):
    """TP = 8 on 4 DGX A100 nodes: the data-parallel group holds one rank per node (Open
    MPI's "disjoint" communicator, 4 ranks) and reduces ~24.7 MiB of gradients. MPICH's
    rule (count ≥ pof2) picks Rabenseifner; Open MPI's disjoint table (p < 8, ≥ 1 MiB,
    l.323-328) picks recursive doubling: 2 exchanges of the whole vector over the NIC share
    instead of 2·(n/2 + n/4). Both engines run the library's choice."""
    got = {be: ddlsim.predict(_with_backend(be), engine) for be in ("mpich", "openmpi")}
    key = next(k for k in got["mpich"].algorithms if k.startswith("dp.all_reduce"))
    assert got["mpich"].algorithms[key] == "rabenseifner"
    assert got["openmpi"].algorithms[key] == "recursive_doubling"
    assert got["openmpi"].iteration_time_s > got["mpich"].iteration_time_s


def test_openmpi_dp_all_reduce_time_is_the_recursive_doubling_closed_form():
    """The same case by hand: on the DP net (p = 4, g = 1, α = alpha_inter, B = the group's
    NIC share), recursive doubling takes 2(α + n/B), Rabenseifner 4α + 1.5·n/B."""
    from ddlsim.workloads.trace import Collective
    times = {}
    for be in ("mpich", "openmpi"):
        cfg = ddlsim.load_config(_with_backend(be))
        wl = build_workload(cfg)
        cost = CostModel(cfg.system, wl, {}, devices=_placement(cfg, wl))
        net = cost.nets["dp"]
        n = 25e6
        times[be] = cost.collective(Collective("g", "all_reduce", "dp", n))
    assert (net.p, net.g) == (4, 1)
    B = min(net.bw_intra_Bps, net.bw_node_Bps)
    assert times["openmpi"] == pytest.approx(2 * (net.alpha_inter_s + n / B), rel=1e-12)
    assert times["mpich"] == pytest.approx(4 * net.alpha_inter_s + 1.5 * n / B, rel=1e-12)


def test_refusals_read_the_same_under_openmpi():
    """An NCCL algorithm configured on CPU nodes (the wiki's 9-rank case) is refused with the
    message ``mpi`` gives: the backend changes only what ``auto`` picks."""
    messages = {}
    for be in ("mpi", "openmpi"):
        cfg = ddlsim.load_config(EXAMPLES / "wiki-gpt2-9ranks-ddp.yaml", [
            f"system.collectives.backend={be}",
            "parallel.collective_algorithm={all_reduce: nccl_ring}"])
        with pytest.raises(ConfigError) as err:
            ddlsim.predict(cfg)
        messages[be] = str(err.value)
    assert "needs the GPU generation" in messages["mpi"]
    assert messages["openmpi"] == messages["mpi"]


def test_openmpi_is_an_allowed_backend_and_a_typo_is_refused():
    assert ddlsim.load_config(_with_backend("openmpi")).system.collectives.backend == "openmpi"
    with pytest.raises(ConfigError, match="openmpi"):
        ddlsim.load_config(_with_backend("open-mpi"))

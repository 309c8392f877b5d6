"""examples/proxies/cosmoflow.yaml issues, per rank and iteration, the MPI calls of the seed's
proxy spcl/DNN-cpp-proxies proxies/cosmoflow.cpp, run on 16 ranks.

Every expected number is derived here by hand from cosmoflow.cpp (lines cited) and from the
CosmoFlow layer shapes, never copied from a run. MPI_FLOAT buffers: 4 bytes per element.

The proxy's set-up (:129-154): model_shards = 4 consecutive ranks form model_parallel_comm
(split by rank / 4); dense_allreduce_comm holds the ranks with the same rank % 4; so on 16
ranks there are 4 spatial groups of 4 and 4 data-parallel groups of 4. A rank's halo
neighbours are mp_group_rank ^ 1 and mp_group_rank ^ 2 (:75-78), i.e. global rank r ^ 1 and
r ^ 2 (the groups start at multiples of 4).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.api import build_workload
from ddlsim.cli import app
from ddlsim.commprofile import comm_profile
from ddlsim.workloads.proxytime import TIMER_SLACK_S
from ddlsim.workloads.trace import P2P, Collective, Compute

EXAMPLE = "examples/proxies/cosmoflow.yaml"
F = 4                                                      # sizeof(float)
FWD_HALO = [2097152, 1048576, 524288, 262144]              # cosmoflow.cpp:33
BWD_HALO = [131072, 262144, 524288, 1048576]               # cosmoflow.cpp:36
ALLGATHER = [65536, 256, 128]                              # cosmoflow.cpp:40
REDUCE_SCATTER = [128, 256, 65536]                         # cosmoflow.cpp:44
ALLREDUCE = [1050737, 3539456, 884992, 221312, 55360, 3488]  # cosmoflow.cpp:48
SHARDS, WORLD = 4, 16                                      # cosmoflow.cpp:129, mpirun -np 16
FWD_US = [6567, 13135, 6567, 3283, 1641, 5, 3, 1]          # cosmoflow.cpp:25
BWD_US = [2, 6, 10, 3283, 6567, 13135, 26270, 13135]       # cosmoflow.cpp:26


@pytest.fixture(scope="module")
def cfg():
    return ddlsim.load_config(EXAMPLE)


@pytest.fixture(scope="module")
def workload(cfg):
    return build_workload(cfg)


@pytest.fixture(scope="module")
def profile(workload):
    return comm_profile(workload, "rank")


def _rows(frame, **where):
    for k, v in where.items():
        frame = frame[frame[k] == v]
    return frame


def test_the_layer_shapes_give_the_proxys_halo_sizes(cfg):
    """Forward halo of conv i (i = 1..4, cosmoflow.cpp:72-79): one plane (3³ kernel, radius 1)
    of the previous conv's output before pooling, 128/2^(i-1) per side and 32·2^(i-1)
    channels, split 2×2 over x and y, for 8 samples. A face perpendicular to x is
    (side/2 in y) × (side in z) × channels × 8: conv1: 64·128·32·8 = 2,097,152; each next
    layer halves the sides and doubles the channels, so the face halves: 1,048,576, 524,288,
    262,144 (:33). Backward halo of conv i (i = 4..1, :104-111): a plane of conv i's output
    gradient, 128/2^i per side and 32·2^i channels: conv4: 4·8·512·8 = 131,072, then doubling
    back up to conv1: 1,048,576 (:36)."""
    def face(side, channels):                          # x-face of a 2×2×1 split
        return 1 * (side // 2) * side * channels * 8
    assert [face(128 >> (i - 1), 32 << (i - 1)) for i in range(1, 5)] == FWD_HALO
    assert [face(128 >> i, 32 << i) for i in (4, 3, 2, 1)] == BWD_HALO


def test_halo_bytes_per_direction(profile):
    """Each rank sends (and receives) per direction (x: peer r^1, y: peer r^2) one message
    per forward halo and one per backward halo: 8 calls of 4·(Σ fwd + Σ bwd) =
    4·(3,932,160 + 1,966,080) = 23,592,960 bytes."""
    per_direction = F * (sum(FWD_HALO) + sum(BWD_HALO))
    assert per_direction == 23_592_960
    for rank in range(WORLD):
        for group, partner in (("sx", rank ^ 1), ("sy", rank ^ 2)):
            send = _rows(profile, rank=rank, op="isend", group=group)
            recv = _rows(profile, rank=rank, op="irecv", group=group)
            assert len(send) == len(recv) == 1
            assert send.iloc[0][["peer", "calls", "send_bytes", "recv_bytes"]].tolist() == \
                [partner, 8, per_direction, 0]
            assert recv.iloc[0][["peer", "calls", "send_bytes", "recv_bytes"]].tolist() == \
                [partner, 8, 0, per_direction]


def test_each_halo_message_in_order(workload):
    """Message by message, rank 0 sends x then y (the order of :75-76), with the sizes of
    :33 forward and :36 backward."""
    program = workload.classes[0].program
    fwd = [op.payload.bytes / F for op in program.blocks["F"].ops
           if isinstance(op.payload, P2P) and op.payload.kind == "send"]
    bwd = [op.payload.bytes / F for op in program.blocks["B_sync"].ops
           if isinstance(op.payload, P2P) and op.payload.kind == "send"]
    assert fwd == [s for s in FWD_HALO for _ in "xy"]
    assert bwd == [s for s in BWD_HALO for _ in "xy"]


def test_allgather_and_reduce_scatter_buffers(profile, workload):
    """MPI_Allgather (:83) sends count c = 65536, 256, 128 floats and receives 4·c on the
    4-rank group; MPI_Reduce_scatter_block (:102) sends 4·c and receives c = 128, 256, 65536.
    Per iteration: allgather send 4·65,920 = 263,680 B, receive 1,054,720 B; reduce-scatter
    the mirror. The members are the 4 consecutive ranks of model_parallel_comm (:149)."""
    ag = _rows(profile, op="allgather")
    rs = _rows(profile, op="reduce_scatter")
    assert len(ag) == len(rs) == WORLD
    assert set(ag.calls) == set(rs.calls) == {3}
    assert set(ag.send_bytes) == set(rs.recv_bytes) == {F * sum(ALLGATHER)} == {263_680}
    assert set(ag.recv_bytes) == set(rs.send_bytes) == {SHARDS * F * sum(ALLGATHER)}
    assert set(ag.group_size) == set(rs.group_size) == {SHARDS}
    members = workload.groups["sp"].members
    assert [list(row) for row in members] == [[4 * g + i for i in range(4)] for g in range(4)]


def test_the_layer_shapes_give_the_dense_buffers(cfg):
    """Dense layer j gathers its input (32768 flattened features = 4³·512, then 128, then 64)
    for 8 samples, a quarter from each shard: 32768·8/4 = 65,536, 128·8/4 = 256,
    64·8/4 = 128 (:40); the backward scatters the input gradient back the same way, last
    layer first (:44)."""
    from ddlsim.workloads.cosmoflow.shapes import dense_layers
    ins = [d.n_in for d in dense_layers(cfg.model)]
    assert ins == [32768, 128, 64]
    assert [n * 8 // SHARDS for n in ins] == ALLGATHER
    assert [n * 8 // SHARDS for n in reversed(ins)] == REDUCE_SCATTER


def test_allreduce_split_between_the_dense_group_and_all_ranks(profile, workload):
    """MPI_Iallreduce of the dense gradients, a quarter of 4,202,948 = 1,050,737 floats, on
    dense_allreduce_comm (:115: the 4 ranks with the same rank % 4), and of conv4..conv0's
    gradients, 3,539,456 + 884,992 + 221,312 + 55,360 + 3,488 = 4,704,608 floats in 5 calls,
    on MPI_COMM_WORLD (:118). Bytes: 4,202,948 on the dense group, 18,818,432 on all ranks."""
    dense = _rows(profile, op="iallreduce", group="dp")
    world = _rows(profile, op="iallreduce", group="world")
    assert len(dense) == len(world) == WORLD
    assert dense[["group_size", "calls", "send_bytes"]].drop_duplicates().values.tolist() == \
        [[SHARDS, 1, F * ALLREDUCE[0]]]
    assert world[["group_size", "calls", "send_bytes"]].drop_duplicates().values.tolist() == \
        [[WORLD, 5, F * sum(ALLREDUCE[1:])]]
    assert F * ALLREDUCE[0] == 4_202_948 and F * sum(ALLREDUCE[1:]) == 18_818_432
    assert [sorted(row) for row in workload.groups["dp"].members] == \
        [[c, c + 4, c + 8, c + 12] for c in range(4)]


def test_parameters_as_the_proxy_counts_them(cfg, workload):
    """total_params (:239-245) = 4 · allreduce_sizes[0] + Σ allreduce_sizes[1:] = 8,907,556."""
    assert SHARDS * ALLREDUCE[0] + sum(ALLREDUCE[1:]) == 8_907_556
    assert workload.meta.parameter_count == 8_907_556


def test_call_order_streams_and_blocking(workload):
    """Order of the MPI calls of one iteration (:71-122): forward: 4 halo exchanges (isend x,
    isend y, irecv x, irecv y), 3 allgathers; backward: 3 reduce-scatters, the dense
    iallreduce, then per conv4..conv1 a halo exchange and the layer's iallreduce, and conv0's
    iallreduce. Allgather and reduce-scatter block (compute stream); the all-reduces run on
    their own streams until the final Waitall."""
    program = workload.classes[0].program
    seq = []
    for block in ("F", "B_sync"):
        for op in program.blocks[block].ops:
            p = op.payload
            if isinstance(p, P2P):
                seq.append(f"{p.kind}.{p.group}")
            elif isinstance(p, Collective):
                seq.append(f"{p.op}.{p.group}")
                assert op.stream == ("compute" if p.group == "sp" else
                                     {"dp": "grad.dense", "world": "grad.conv"}[p.group])
    halo = ["send.sx", "send.sy", "recv.sx", "recv.sy"]
    expected = (halo * 4 + ["all_gather.sp"] * 3 + ["reduce_scatter.sp"] * 3
                + ["all_reduce.dp"] + (halo + ["all_reduce.world"]) * 4 + ["all_reduce.world"])
    assert seq == expected


def test_compute_is_the_proxys_usleep(cfg, workload):
    """compute: proxy takes each layer's time from the usleep constants: Σ fwd (:25) +
    Σ bwd (:26) = 31,202 + 62,408 = 93,610 µs per iteration, plus Linux's 50 µs timer slack
    for each of the 16 usleep calls (one per layer and pass)."""
    total = sum(op.payload.seconds for c in workload.classes[:1]
                for b in c.program.blocks.values() for op in b.ops
                if isinstance(op.payload, Compute))
    assert sum(FWD_US) + sum(BWD_US) == 93_610
    sleeps = 93_610e-6 + 16 * TIMER_SLACK_S
    assert total == pytest.approx(sleeps, rel=1e-12)
    r = ddlsim.predict(cfg, "analytical")
    assert r.breakdown.compute_s == pytest.approx(sleeps, rel=1e-9)


def test_cli_comm_csv_has_a_row_per_rank_and_call_kind():
    """8 rows per rank: send/recv × x/y, allgather, reduce_scatter, 2 allreduces."""
    out = CliRunner().invoke(app, ["comm", EXAMPLE, "--format", "csv"])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].startswith("rank,op,group,group_size")
    assert len(lines) == 1 + 8 * WORLD

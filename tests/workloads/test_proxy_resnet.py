"""examples/proxies/resnet50*.yaml, resnet152.yaml, resnet152_scal.yaml against their sources.

Per rank and iteration, the MPI calls of spcl/DNN-cpp-proxies, derived by hand from the source
(file:line in each test) and compared with ``ddlsim.commprofile`` (``ddlsim comm``).
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.commprofile import comm_profile
from ddlsim.workloads.proxytime import TIMER_SLACK_S
from ddlsim.workloads.trace import Collective, Compute

R50_MSGS = [3104745, 4461568, 4462592, 4986880, 4468736, 4074560]      # resnet50.cpp:30-37
R152_MSGS = [6511592, 6567936, 5905920, 6113280, 6176256, 6112768, 6176256, 6112768,
             5321216, 5194816]                                           # resnet152.cpp:23
FLOAT = 4                                                                # MPI_FLOAT


def _profile(path: str):
    cfg = ddlsim.load_config(path)
    return cfg, ddlsim.build_workload(cfg), comm_profile(ddlsim.build_workload(cfg), per="rank")


def test_resnet50_allreduce_per_rank():
    """run_allreduce (resnet50.cpp:214-220): 6 MPI_Allreduce on MPI_COMM_WORLD of msgSize[i]
    floats; sum = TOTALSIZE = 25,559,081 (line 18)."""
    cfg, wl, prof = _profile("examples/proxies/resnet50.yaml")
    n = cfg.world_size
    assert n == 32 and sum(R50_MSGS) == 25_559_081
    assert len(prof) == n                          # one row per rank: allreduce on all ranks
    assert set(prof.op) == {"allreduce"} and set(prof.group_size) == {n}
    assert (prof.calls == 6).all()
    assert (prof.send_bytes == FLOAT * 25_559_081).all()
    assert (prof.recv_bytes == FLOAT * 25_559_081).all()
    # the calls themselves, in issue order, blocking (on the compute stream), no sleep
    ops = [op for op in wl.classes[0].program.blocks["B.sync"].ops]
    colls = [op for op in ops if isinstance(op.payload, Collective)]
    assert [op.payload.bytes for op in colls] == [FLOAT * m for m in R50_MSGS]
    assert {op.stream for op in colls} == {"compute"}
    assert all(op.payload.seconds == 0 for op in ops if isinstance(op.payload, Compute))
    assert wl.groups["dp"].members.tolist() == [list(range(n))]


def test_resnet50_ring_per_rank():
    """run_ring (resnet50.cpp:223-237): per message MPI_Irecv from rank-1 (non-blocking:
    `irecv`), a blocking MPI_Send to rank+1 (`send`)."""
    cfg, _, prof = _profile("examples/proxies/resnet50_ring.yaml")
    n = cfg.world_size
    for r in (0, 7, 31):
        rows = prof[prof["rank"] == r].set_index("op")
        assert rows.loc["send", "peer"] == (r + 1) % n
        assert rows.loc["irecv", "peer"] == (r - 1) % n
        assert rows.loc["send", "calls"] == rows.loc["irecv", "calls"] == 6
        assert rows.loc["send", "send_bytes"] == FLOAT * 25_559_081
        assert rows.loc["irecv", "recv_bytes"] == FLOAT * 25_559_081


@pytest.mark.parametrize("path,ranks,fwd_s,bwd_s", [
    ("examples/proxies/resnet152.yaml", 64, 119e-3, 23.8e-3),       # resnet152.cpp:29-30
    # resnet152_scal.cpp:29-31 at index 2 of {256, 512, 1024, 2048} (lines 86-90)
    ("examples/proxies/resnet152_scal.yaml", 1024, 36e-3, 7.2e-3),
])
def test_resnet152_iallreduce_per_rank(path, ranks, fwd_s, bwd_s):
    """run_data_parallel (resnet152.cpp:32-55): usleep(forward); 10 × (usleep(bwd_rt_per_B),
    MPI_Iallreduce on MPI_COMM_WORLD of allreduce_sizes[i] floats); MPI_Waitall."""
    cfg, wl, _ = _profile(path)
    prof = comm_profile(wl, per="class")
    assert cfg.world_size == ranks
    row = prof.iloc[0]
    assert len(prof) == 1 and row.op == "iallreduce" and row.group_size == ranks
    assert row.calls == 10 * ranks
    assert row.send_bytes == ranks * FLOAT * sum(R152_MSGS) == ranks * FLOAT * 60_192_808
    ops = wl.classes[0].program.blocks["B.sync"].ops
    sleeps = [op.payload.seconds for op in ops if isinstance(op.payload, Compute)]
    assert sleeps == [pytest.approx(bwd_s + TIMER_SLACK_S)] * 10  # usleep + the timer slack
    # each all-reduce is non-blocking (dp stream) and issued right after its bucket's sleep
    for i, op in enumerate(ops):
        if isinstance(op.payload, Collective):
            assert op.stream == "dp" and isinstance(ops[op.deps[0]].payload, Compute)
    assert [op.payload.bytes for op in ops if isinstance(op.payload, Collective)] == \
        [FLOAT * m for m in R152_MSGS]
    fwd = wl.classes[0].program.blocks["F"].ops[0].payload.seconds
    assert fwd == pytest.approx(fwd_s + TIMER_SLACK_S)


def test_resnet152_time_is_at_least_its_sleeps():
    """119 ms + 10 × 23.8 ms = 357 ms of sleep; the last all-reduce starts after the last
    sleep, so the iteration takes longer than the sleeps, by at most all the all-reduces."""
    cfg = ddlsim.load_config("examples/proxies/resnet152.yaml")
    t = ddlsim.predict(cfg, "analytical").iteration_time_s
    assert 0.357 < t < 0.357 + 0.05

"""spcl/DNN-cpp-proxies ``proxies/dlrm.cpp`` reproduced by ``examples/proxies/dlrm.yaml``.

Every number is derived by hand from the proxy's source (commit 1d32dce), cited by line:

* ``#define EMB_ALL2ALL_SIZE 262144 //2048*128`` (:28); both all-to-alls (:49, :68) pass
  ``EMB_ALL2ALL_SIZE/num_proc`` MPI_FLOATs to each of the ``num_proc = 4`` ranks of
  MPI_COMM_WORLD: 65,536 floats = 262,144 B per peer, 4 × 262,144 = 1,048,576 B sent and
  received per call, two calls per iteration: 2,097,152 B each way per rank.
* ``#define TOP_MLP_SIZE 728065`` (:27) and ``BOT_MLP_SIZE 49536`` (:26) MPI_FLOATs are
  MPI_Iallreduce'd over MPI_COMM_WORLD (:59, :65): 2,912,260 B and 198,144 B, together
  3,110,404 B per rank and iteration in two calls.
* The usleeps (:31-34, :47-69): 95 + 341 + 209 + 455 + 910 + 209 + 682 + 190 = 3,091 us.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.commprofile import comm_profile
from ddlsim.workloads.proxytime import TIMER_SLACK_S
from ddlsim.workloads.trace import Collective, Compute, Wait

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/proxies/dlrm.yaml"
P = 4                                   # mpirun -n 4 (dlrm.cpp:4 --nproc_per_node=4)
EMB_ALL2ALL_SIZE, TOP_MLP_SIZE, BOT_MLP_SIZE = 262_144, 728_065, 49_536   # dlrm.cpp:26-28
FLOAT = 4                               # MPI_FLOAT


@pytest.fixture(scope="module")
def cfg():
    return ddlsim.load_config(EXAMPLE)


@pytest.fixture(scope="module")
def profile(cfg):
    return comm_profile(build_workload(cfg))


def test_derived_sizes_equal_the_proxys_defines(cfg):
    # top MLP input: 128 + F(F−1)/2 with F = 4 tables + 1 dense vector = 128 + 10 = 138;
    # 138·512+512 + 2·(512·512+512) + 512·256+256 + 256·1+1 = 71,168 + 525,312 + 131,328 + 257
    # = 728,065; bottom 3 · (128·128 + 128) = 49,536; one table of 128 columns per rank, for
    # the 2048 samples of the global batch: 2048 · 128 = 262,144 floats sent per rank.
    wl = build_workload(cfg)
    ops = {o.payload.name: o.payload for b in wl.classes[0].program.blocks.values()
           for o in b.ops}
    assert ops["top_mlp.grad.all_reduce"].bytes == TOP_MLP_SIZE * FLOAT
    assert ops["bottom_mlp.grad.all_reduce"].bytes == BOT_MLP_SIZE * FLOAT
    assert ops["embedding.all_to_all.fwd"].bytes == EMB_ALL2ALL_SIZE * FLOAT
    assert ops["embedding.all_to_all.bwd"].bytes == EMB_ALL2ALL_SIZE * FLOAT


def test_all_to_all_send_bytes_per_rank_on_four_ranks(profile):
    rows = profile[profile.op == "alltoall"]
    assert sorted(rows["rank"]) == [0, 1, 2, 3]
    assert set(rows.group_size) == {P}
    assert set(rows.calls) == {2}                                # :49 and :68
    assert set(rows.send_bytes) == {2 * EMB_ALL2ALL_SIZE * FLOAT}  # 2 × 1,048,576
    assert set(rows.recv_bytes) == {2 * EMB_ALL2ALL_SIZE * FLOAT}
    assert EMB_ALL2ALL_SIZE // P * FLOAT == 262_144              # bytes to each peer


def test_allreduce_bytes_and_no_other_communication(profile):
    rows = profile[profile.op == "iallreduce"]  # MPI_Iallreduce
    assert set(rows.calls) == {2} and set(rows.group_size) == {P}
    assert set(rows.send_bytes) == {(TOP_MLP_SIZE + BOT_MLP_SIZE) * FLOAT}  # 3,110,404
    assert set(profile.op) == {"iallreduce", "alltoall"}
    assert len(profile) == 2 * P


def test_calls_in_the_proxys_order_blocking_or_not(cfg):
    # dlrm.cpp:47-71: compute on the rank's own thread; MPI_Alltoall blocking (same stream as
    # the compute); MPI_Iallreduce non-blocking (its own stream, after the backward that
    # produced its gradients), completed by MPI_Waitall at the end.
    blocks = build_workload(cfg).classes[0].program.blocks
    seq = []
    for name in ("F", "BL", "U"):
        for o in blocks[name].ops:
            p = o.payload
            kind = (p.op if isinstance(p, Collective) else "wait" if isinstance(p, Wait)
                    else "usleep")
            seq.append((kind, o.stream, p.seconds * 1e6 if isinstance(p, Compute) else None))
    assert [s[:2] for s in seq] == [
        ("usleep", "compute"), ("all_to_all", "compute"),                   # :47, :49
        ("usleep", "compute"), ("usleep", "compute"), ("usleep", "compute"),  # :51-54
        ("usleep", "compute"), ("all_reduce", "dp"),                        # :56, :59
        ("usleep", "compute"), ("usleep", "compute"), ("all_reduce", "dp"),  # :61-65
        ("all_to_all", "compute"), ("usleep", "compute"),                   # :68, :69
        ("wait", "compute"), ("usleep", "compute")]                         # :71, no optimizer
    # each usleep(T) lasts T + Linux's 50 us timer slack; the optimizer is no call at all
    slack = round(TIMER_SLACK_S * 1e6)
    assert [round(s[2]) for s in seq if s[0] == "usleep"] == [
        t + slack for t in (95, 341, 209, 455, 910, 209, 682, 190)] + [0]
    assert cfg.num_microbatches == 1


def test_prediction_is_the_usleeps_plus_the_two_blocking_all_to_alls(cfg):
    # The Iallreduces hide behind the backward; each blocking all-to-all of 1 MiB on one
    # DGX A100 (NVSwitch, 300 GB/s per direction, 3.4 us latency: ddlsim/data/systems.yaml)
    # takes the direct form α + (p−1)/p · B / bw = 3.4 us + 0.75 · 1,048,576 B / 300 GB/s
    # (docs/trace.md) = 6.02144 us.
    a2a = 3.4e-6 + 0.75 * EMB_ALL2ALL_SIZE * FLOAT / 300e9
    for engine in ("analytical", "des"):
        r = ddlsim.predict(cfg, engine)
        sleeps = 3091e-6 + 8 * TIMER_SLACK_S  # 8 usleep calls, each 50 us of slack late
        assert r.breakdown.compute_s == pytest.approx(sleeps, rel=1e-12)
        assert r.iteration_time_s == pytest.approx(sleeps + 2 * a2a, rel=1e-3)
        assert r.comm_bytes["world"] == 2 * EMB_ALL2ALL_SIZE * FLOAT
        assert r.comm_bytes["dp"] == (TOP_MLP_SIZE + BOT_MLP_SIZE) * FLOAT

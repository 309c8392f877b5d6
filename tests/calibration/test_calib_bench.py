"""The benchmark body over a fake adapter (deterministic clock), placement, compute sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.calibration import comm_bench
from ddlsim.calibration.adapters import CommAdapter, OpCall, buffer_layout
from ddlsim.calibration.comm_bench import (placement, planned_steps, run_comm_benchmark,
                                           run_scoped_benchmarks, scoped_communicators)
from ddlsim.calibration.compute_bench import (attention_flops, default_gemm_shapes,
                                              gemm_flops, run_gemm_benchmark)
from ddlsim.calibration.efficiency import fit_compute_results
from ddlsim.calibration.schema import COMPUTE_COLUMNS, CalibrationError, tidy_frame


class Clock:
    """A fake perf_counter: each op call advances it by the model time α + β·S."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeAdapter:
    """One process pretending to be rank ``rank`` of ``hosts``; reductions are identities
    (every simulated rank would measure the same), which is what the body relies on."""

    backend, library, library_version = "fake", "Fake", "Fake 1.0"

    def __init__(self, hosts, clock, rank=0, unsupported=()):
        self.hosts, self.clock, self._rank = list(hosts), clock, rank
        self.unsupported, self.calls, self.barriers = set(unsupported), 0, 0

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return len(self.hosts)

    def hostname(self):
        return self.hosts[self._rank]

    def barrier(self):
        self.barriers += 1

    def synchronize(self):
        pass

    def allgather_obj(self, obj):
        return list(self.hosts) if obj == self.hostname() else [obj] * self.size

    def reduce_max(self, values):
        return np.asarray(values, dtype=float)

    def split(self, colors):
        mine = colors[self._rank]
        members = [i for i, c in enumerate(colors) if c == mine]
        return FakeAdapter([self.hosts[i] for i in members], self.clock,
                           members.index(self._rank), self.unsupported)

    def supports(self, op):
        return op not in self.unsupported

    def close(self):
        pass

    def make_op(self, op, nbytes):
        moved = buffer_layout(op, nbytes, self.size)[2]

        def run():
            self.calls += 1
            self.clock.now += 2e-6 + moved * 1e-10 * (2 if op == "sendrecv" else 1)
        return OpCall(run, moved, 0.5 if op == "sendrecv" else 1.0)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(comm_bench.time, "perf_counter", c)
    return c


def test_fake_adapter_satisfies_the_protocol(clock):
    assert isinstance(FakeAdapter(["a"], clock), CommAdapter)


def test_benchmark_body_times_each_op_and_size(clock):
    comm = FakeAdapter(["n0"] * 4, clock, unsupported={"all_to_all"})
    ticks = []
    rows = run_comm_benchmark(comm, ["all_reduce", "all_gather", "all_to_all", "sendrecv"],
                              [8, 1024, 1 << 20], warmup=3, reps=5, batch=2,
                              progress=ticks.append)
    df = tidy_frame(rows)
    assert len(ticks) == planned_steps(["all_reduce", "all_gather", "all_to_all", "sendrecv"],
                                       [8, 1024, 1 << 20], 1) == 12
    assert set(df["op"]) == {"all_reduce", "all_gather", "sendrecv"}  # unsupported skipped
    r = df[(df["op"] == "all_reduce") & (df["bytes"] == 1 << 20)].iloc[0]
    assert r["time_median_s"] == pytest.approx(2e-6 + (1 << 20) * 1e-10)
    assert (r["n"], r["scope"], r["ranks_per_node"]) == (5, "intra", 4)
    assert r["time_std_s"] == pytest.approx(0.0, abs=1e-15)
    assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 1.5)  # 2(n−1)/n at n = 4
    # ping-pong: the round trip is halved, so one way is α + β·S
    s = df[(df["op"] == "sendrecv") & (df["bytes"] == 1024)].iloc[0]
    assert s["time_median_s"] == pytest.approx(1e-6 + 1024 * 1e-10)
    # 3 ops × 3 sizes × (3 warm-up + 5 reps × 2 calls); one barrier before each batch
    assert comm.calls == 9 * 13 and comm.barriers == 9 * 5


def test_sizes_that_round_to_the_same_buffer_are_measured_once(clock):
    comm = FakeAdapter(["n0"] * 4, clock)
    rows = run_comm_benchmark(comm, ["all_gather"], [8, 16, 17], warmup=0, reps=1)
    assert [r["bytes"] for r in rows] == [16]  # one float per rank: 4 × 4 B


@pytest.mark.parametrize("warmup, reps, batch", [(-1, 5, 1), (0, 0, 1), (0, 5, 0), (0, 2.5, 1)])
def test_benchmark_rejects_bad_counts(clock, warmup, reps, batch):
    with pytest.raises(CalibrationError):
        run_comm_benchmark(FakeAdapter(["a", "a"], clock), ["all_reduce"], [8], warmup, reps,
                           batch=batch)


def test_placement_groups_ranks_by_host(clock):
    where = placement(FakeAdapter(["b", "b", "a", "a", "c", "c"], clock))
    assert where.node_of_rank == (0, 0, 1, 1, 2, 2) and where.local_rank == (0, 1, 0, 1, 0, 1)
    assert (where.nodes, where.ranks_per_node, where.scope) == (3, 2, "inter")
    uneven = placement(FakeAdapter(["a", "a", "b"], clock))
    assert uneven.ranks_per_node == 0


def test_multi_node_runs_add_intra_and_inter_sub_communicators(clock):
    comm = FakeAdapter(["a", "a", "b", "b"], clock)
    comms = scoped_communicators(comm)
    assert [c[0] for c in comms] == ["world", "intra", "inter"]
    rows = tidy_frame(run_scoped_benchmarks(comm, ["all_reduce"], [64], 0, 2, comms=comms))
    got = {(r.scope, r.ranks, r.nodes, r.ranks_per_node) for r in rows.itertuples()}
    assert got == {("inter", 4, 2, 2), ("intra", 2, 1, 2), ("inter", 2, 2, 1)}
    assert len(scoped_communicators(FakeAdapter(["a", "a"], clock))) == 1


def test_flop_counts():
    assert gemm_flops(2, 3, 4) == 48.0
    assert attention_flops(1, 2, 8, 4) == 4 * 2 * 64 * 4


def test_numpy_gemm_sweep_and_efficiency_fit():
    shapes = default_gemm_shapes(max_dim=128, min_dim=16)
    assert (16, 64, 16) in shapes and (128, 128, 128) in shapes
    df = run_gemm_benchmark("numpy", "cpu", ["fp32", "fp64"], shapes, warmup=1, reps=2)
    assert list(df.columns) == list(COMPUTE_COLUMNS) and len(df) == 2 * len(shapes)
    assert (df["flops_per_s"] > 0).all()
    fits = fit_compute_results(df, peaks={"fp32": 1e15})
    assert [f.dtype for f in fits] == ["fp32", "fp64"]
    assert fits[0].eta_max is not None and fits[0].rate_max_flops_per_s > 0


def test_compute_rejects_unknown_dtype_and_backend():
    with pytest.raises(CalibrationError, match="fp64"):
        run_gemm_benchmark("numpy", "cpu", ["bf16"], [(8, 8, 8)])
    with pytest.raises(CalibrationError, match="numpy"):
        run_gemm_benchmark("jax", "cpu", ["fp32"], [(8, 8, 8)])


def test_the_gemm_benchmark_times_with_the_clock_it_is_given():
    """``clock=time.process_time`` (the closed loop on a shared machine) must time every
    sample: a clock that advances 0.5 s per reading gives 0.5 s per call."""
    from itertools import count

    from ddlsim.calibration.compute_bench import run_gemm_benchmark
    ticks = count()
    df = run_gemm_benchmark("numpy", "cpu", ["fp32"], [(8, 8, 8)], warmup=1, reps=3,
                            clock=lambda: 0.5 * next(ticks))
    assert df["time_median_s"].tolist() == [0.5] and df["reps"].tolist() == [3]


def test_evicted_gemms_time_one_call_per_sample_after_the_sweep(monkeypatch):
    """``evict_bytes``: each of ``reps`` samples is one call after an untimed read of the
    sweep (the clock read twice per sample: 0.5 s a call), never for torch; bad sizes refused."""
    from itertools import count

    from ddlsim.calibration import compute_bench
    reads = []
    real = compute_bench._time_evicted

    def counting(fn, sweep, warmup, reps, clock=None):
        reads.append(sweep.nbytes)
        return real(fn, sweep, warmup, reps, clock)
    monkeypatch.setattr(compute_bench, "_time_evicted", counting)
    ticks = count()
    df = run_gemm_benchmark("numpy", "cpu", ["fp32"], [(8, 8, 8), (4, 4, 4, 2)], warmup=1,
                            reps=3, clock=lambda: 0.5 * next(ticks), evict_bytes=1 << 20)
    assert reads == [1 << 20, 1 << 20]
    assert df["time_median_s"].tolist() == [0.5, 0.5] and df["reps"].tolist() == [3, 3]
    with pytest.raises(CalibrationError, match="numpy backend only"):
        run_gemm_benchmark("torch", "cpu", ["fp32"], [(8, 8, 8)], evict_bytes=1 << 20)
    with pytest.raises(CalibrationError, match=">= 0"):
        run_gemm_benchmark("numpy", "cpu", ["fp32"], [(8, 8, 8)], evict_bytes=-1)

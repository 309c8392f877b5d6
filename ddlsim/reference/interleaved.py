"""Calibration samples and training iterations taking turns, in one MPI job.

    mpirun -n N python -m ddlsim.reference.interleaved OUT RUN.yaml [RUN2.yaml ...] \\
        --rounds 8 --warmup 2 [--clock wall --allow-shared-cores]

Every rank does, round after round (a barrier before each step):

1. one sample per GEMM shape, timed in **process CPU time**: the run's own shapes
   (:func:`~.machine.gemm_shapes`) one call each with their operands out of the core's
   caches, as an iteration meets them (:mod:`.coldgemm`), and a few squares with
   ``ddlsim calibrate compute``'s numpy benchmark (``clock=time.process_time``);
2. one sample of the element-wise rate: numpy ``z = x + y`` on arrays of the gradient
   buffer's size, counted as ddlsim counts a pass (read x, read y, write z: 3 · nbytes; the
   STREAM "Add" kernel, McCalpin 1995), the least CPU time of three calls; the same on the
   sizes of the activations' passes (:func:`tensor_sizes`), kept beside it; and one sample
   of each element-wise kernel class ddlsim times apart (:mod:`.kernels`: the model's own
   numpy LayerNorm, GeLU and Adam on the run's sizes, the bytes ddlsim counts over their
   least CPU time);
3. on more than one rank, one CPU-time (``--clock wall``: wall-time) sample of each
   collective the run configs' traces issue, at the trace's own size
   (:func:`trace_collectives`; ``calibrate comm``'s MPI benchmark, the most over ranks),
   written to ``OUT/sizes{N}.csv``: the loop keeps them in the profile beside its fitted
   curves (:mod:`ddlsim.calibration.sizes`);
4. one training iteration of each run config, in an order that turns by one each round
   (one rank count, one model, each config one ``parallel.dp_strategy``; one model and one
   Adam serve them all, in turn), timed in two
   parts, each in CPU time and the most over ranks: the forward and backward, then, after a
   barrier, the gradient exchange and update (the wall time of both parts is kept too).

With more ranks than the node's usable cores (``--allow-shared-cores``; refused without it)
the ranks take turns on the cores, and those turns are the time to predict: the loop then
compares the wall time of both parts, and ``--clock wall`` times the collectives of step 3
the same way (the GEMM and element-wise samples stay CPU time: ddlsim's device for such a
rank is a core's rates times cores / ranks, :mod:`ddlsim.topologies.sharedcores`).

Why: on a shared machine other processes take turns on the cores and the host changes a
core's speed from minute to minute (docs/validation.md, "Closed loop"). CPU time is not
inflated by the turns; samples that alternate with the iterations see the same speed as
they do. In the exchange a rank that waits for another polls (Open MPI's shared-memory
transport), and polling is CPU time: the most over ranks still counts the wait for a rank
that is working (its update, a slower copy), and counts a wait for a rank that another
process holds off its core only while the waiting rank itself has its core, and with
``OMPI_MCA_mpi_yield_when_idle=1`` (set by :mod:`.loop`) little more than its polls. So
under load the exchange is still inflated, far less than its wall time (median 24 against
143 ms, 2 ranks, load 9); the MPI curves (``calibrate comm --clock cpu``) are measured the
same way.

Every rank first keeps freed memory for reuse (:func:`~.machine.cache_allocations`, a
framework's caching allocator: numpy's temporaries are then not faulted in anew each
iteration); the minor page faults of each forward and backward are kept, to show it.

Rank 0 writes ``OUT/compute{N}.csv`` (the ``calibrate compute`` format, one row per shape
with the statistics over rounds) and ``OUT/interleaved{N}.json`` (the element-wise and
kernel-class rates per rank and round, :func:`element_rates` of them, and the per-round
times and page faults per config).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads its BLAS

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from ..calibration.comm_bench import CLOCKS  # noqa: E402  (--clock → the timer)

__all__ = ["SQUARES", "PARTS", "tensor_sizes", "phase_times", "element_rates",
           "measured_s", "measured_parts", "main"]

#: Square GEMMs measured beside the run's own shapes, so the saturation fit sees small and
#: large calls too (a subset of ``calibrate compute``'s defaults).
SQUARES = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512))


def _gemm_round(squares, own, seed: int, sweep: np.ndarray):
    """One CPU-time sample per GEMM shape: the ``squares`` with ``calibrate compute``'s
    numpy benchmark, the run's ``own`` shapes with their operands out of the core's caches,
    as the run meets them (:mod:`.coldgemm`)."""
    import pandas as pd

    from ..calibration.compute_bench import run_gemm_benchmark
    from .coldgemm import cold_gemm_round
    hot = run_gemm_benchmark("numpy", "cpu", ["fp32"], squares, warmup=1, reps=1, seed=seed,
                             clock=time.process_time)
    return pd.concat([hot, cold_gemm_round(own, seed, sweep)], ignore_index=True)


def _merge_rounds(frames):
    """One row per shape: the statistics over the rounds' single samples."""
    from ..calibration.schema import summarize
    first = frames[0].copy()
    samples = np.array([f["time_median_s"].to_numpy() for f in frames])  # rounds × shapes
    for i in range(len(first)):
        stats = summarize(samples[:, i])
        first.loc[i, "reps"] = stats.pop("n")
        for key, value in stats.items():
            first.loc[i, key] = value
    return first


def _stream_cpu_Bps(x: np.ndarray, y: np.ndarray, z: np.ndarray, reps: int = 3) -> float:
    """Bytes/s of ``z = x + y`` (3 passes of ``x.nbytes``), the least CPU time of ``reps``."""
    best = np.inf
    for _ in range(reps):
        c = time.process_time()
        np.add(x, y, out=z)
        best = min(best, time.process_time() - c)
    return 3.0 * x.nbytes / max(best, 1e-9)


def _faults() -> int:
    """Minor page faults of this process so far (``getrusage``'s ``ru_minflt``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def tensor_sizes(shape) -> dict[str, int]:
    """Elements of the tensors the trainer's element-wise passes run over (``shape``: a
    :class:`~.gpt2.GPTShape`, ``T = batch · seq`` tokens): ``hidden`` (``T·h``: LayerNorms,
    residual adds), ``mlp`` (``T·4h``: GeLU), ``scores`` (``batch·heads·seq²``: softmax),
    ``logits`` (``T·vocab``: the loss) and ``gradients``, the padded parameter buffer (the
    gradient exchange and the optimizer), whose rate is the system's memory bandwidth."""
    t = shape.batch * shape.seq
    return {"hidden": t * shape.hidden, "mlp": t * 4 * shape.hidden,
            "scores": shape.batch * shape.heads * shape.seq ** 2, "logits": t * shape.vocab,
            "gradients": shape.padded}


def trace_collectives(cfgs) -> list[tuple[str, int]]:
    """(operation, bytes) of every distinct collective the configs' traces issue (each
    config's first rank class; the data-parallel ranks are alike), sorted."""
    from ..api import build_workload
    from ..workloads.trace import Collective
    out = set()
    for cfg in cfgs:
        for block in build_workload(cfg).classes[0].program.blocks.values():
            out |= {(op.payload.op, int(op.payload.bytes)) for op in block.flat.ops
                    if isinstance(op.payload, Collective)}
    return sorted(out)


def _collective_round(adapter, where, sizes, clock=time.process_time) -> list[dict]:
    """One sample (the most over ranks, after a barrier; CPU time unless ``clock`` says
    otherwise) of each (operation, bytes): ``calibrate comm``'s MPI benchmark, one call each."""
    from ..calibration.comm_bench import run_comm_benchmark
    return [run_comm_benchmark(adapter, [op], [nbytes], 0, 1, where=where,
                               clock=clock)[0] for op, nbytes in sizes]


def _merge_collectives(rounds: list[list[dict]]) -> list[dict]:
    """One row per (operation, bytes): the statistics over the rounds' single samples."""
    from ..calibration.schema import comm_row, summarize
    out = []
    for rows in zip(*rounds):
        first = rows[0]
        stats = summarize([r["time_median_s"] for r in rows])
        out.append(comm_row(**{k: first[k] for k in ("backend", "library", "library_version",
                                                     "op", "ranks", "nodes", "ranks_per_node",
                                                     "scope")},
                            nbytes=first["bytes"], stats=stats,
                            source="the closed loop's runs' own sizes, between iterations"))
    return out


def _iteration(comm, model, opt, exchange, bucket_bytes, idx, tgt) -> tuple:
    """(loss, forward + backward CPU s, exchange + update CPU s, its wall s, minor page
    faults of the forward and backward, forward + backward wall s, CPU s per trace op), each
    the most over ranks; the ops as :mod:`.accounting` marks them, the collectives before
    the Adam step as ``exchange``."""
    from mpi4py import MPI

    from .accounting import OpTimer
    model.mark = opt.mark = timer = OpTimer()
    comm.Barrier()
    f0, c0, w0 = _faults(), time.process_time(), time.perf_counter()
    timer.start()
    loss, acts = model.forward(idx, tgt)
    model.backward(acts)
    c1, f1, w1 = time.process_time(), _faults(), time.perf_counter()
    comm.Barrier()
    t0, c2 = time.perf_counter(), time.process_time()
    timer.start()
    exchange(comm, model, opt, bucket_bytes)
    # every rank's op names (a rank that does not step Adam has no "optimizer")
    names = sorted(set().union(*comm.allgather(sorted(timer.spent))))
    spans = np.array([c1 - c0, time.process_time() - c2, time.perf_counter() - t0, f1 - f0,
                      w1 - w0, *(timer.spent.get(n, 0.0) for n in names)])
    comm.Allreduce(MPI.IN_PLACE, spans, op=MPI.MAX)
    return (loss, *map(float, spans[:5]), dict(zip(names, map(float, spans[5:]))))


def phase_times(cfgs, comm, rounds: int, warmup: int, seed: int = 0, clock: str = "cpu"):
    """Run the rounds (module docstring) on the ranks of ``comm``.

    Parameters
    ----------
    cfgs : list of RunConfig
        Configs of one model and rank count (checked by :func:`~.train.check_plan`).
    comm : mpi4py.MPI.Comm
        The data-parallel ranks.
    rounds, warmup : int
        Timed and untimed rounds.
    seed : int
        Seed of the parameters and of each rank's batch.
    clock : {"cpu", "wall"}
        The timer of the collectives' samples at the traces' own sizes (:data:`CLOCKS`);
        the GEMM and element-wise samples are CPU time either way.

    Returns
    -------
    (pandas.DataFrame, dict, list of dict, list of dict)
        GEMM samples of every timed round, element-wise rates per round by tensor
        (:func:`tensor_sizes`) and by kernel class (``class.<name>``, :mod:`.kernels`;
        bytes/s, this rank's), per
        config its ``compute_cpu_s``, ``exchange_s`` (CPU), ``compute_wall_s`` and
        ``exchange_wall_s`` lists (seconds per timed round), its
        ``ops_cpu_s`` (the same per trace op, :mod:`.accounting`), page faults and losses;
        and on more than one rank a ``calibrate comm`` row per collective the traces issue
        (:func:`trace_collectives`, its statistics over the rounds' samples).
    """
    from .gpt2 import GPT2, Adam
    from .kernels import class_kernels, class_rates
    from .coldgemm import evict_bytes
    from .machine import gemm_shapes
    from .train import STRATEGIES, shape_of
    shape = shape_of(cfgs[0])
    model, opt = GPT2(shape, seed=seed), Adam(shape.padded)
    model.ranks = comm.Get_size()  # the exchange's sum is then the mean gradient
    rng = np.random.default_rng([seed, comm.Get_rank()])
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    own = gemm_shapes(shape)
    squares = [s for s in SQUARES if s not in own]
    sweep = np.ones(evict_bytes() // 4, dtype=np.float32)
    arrays = {name: (np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32),
                     np.empty(n, dtype=np.float32)) for name, n in tensor_sizes(shape).items()}
    kernels = class_kernels(shape, seed)
    sample = _collective_sampler(cfgs, comm, CLOCKS[clock])
    colls: list[list[dict]] = []
    gemms, stream = [], {name: [] for name in [*arrays, *(f"class.{c}" for c in kernels)]}
    runs = [{"compute_cpu_s": [], "exchange_s": [], "exchange_wall_s": [],
             "compute_minor_faults": [], "compute_wall_s": [], "ops_cpu_s": {}, "losses": []}
            for _ in cfgs]
    for r in range(warmup + rounds):
        comm.Barrier()
        frame = _gemm_round(squares, own, seed + r, sweep)
        comm.Barrier()
        rates = {name: _stream_cpu_Bps(*xyz) for name, xyz in arrays.items()}
        rates.update({f"class.{c}": r for c, r in class_rates(kernels).items()})
        coll = sample() if sample else []
        # each round starts one config later, so that every config takes each place in
        # the round as often (the later iterations of a round ran slower on this machine)
        for j in range(len(cfgs)):
            cfg, run = cfgs[(j + r) % len(cfgs)], runs[(j + r) % len(cfgs)]
            loss, *spans, ops = _iteration(comm, model, opt,
                                           STRATEGIES[cfg.parallel.dp_strategy],
                                           cfg.parallel.grad_bucket_size, idx, tgt)
            run["losses"].append(loss)
            if r >= warmup:
                _record(run, spans, ops)
        if r >= warmup:
            gemms.append(frame)
            colls.append(coll)
            for name, rate in rates.items():
                stream[name].append(rate)
    return _merge_rounds(gemms), stream, runs, (_merge_collectives(colls) if sample else [])


def _collective_sampler(cfgs, comm, clock=time.process_time):
    """A function taking one round's sample (timed by ``clock``) of each collective the
    configs' traces issue (:func:`_collective_round`), or None on one rank or with none to
    time."""
    sizes = trace_collectives(cfgs) if comm.Get_size() > 1 else []
    if not sizes:
        return None
    from ..calibration.adapters import MpiAdapter
    from ..calibration.comm_bench import placement
    adapter = MpiAdapter(comm)
    where = placement(adapter)
    return lambda: _collective_round(adapter, where, sizes, clock)


def _record(run: dict, spans, ops: dict) -> None:
    """Append one timed iteration's spans (:func:`_iteration`'s CPU and wall seconds and
    page faults) and its CPU seconds per trace op to ``run``'s lists."""
    for key, value in zip(("compute_cpu_s", "exchange_s", "exchange_wall_s",
                           "compute_minor_faults", "compute_wall_s"), spans):
        run[key].append(value)
    for name, value in ops.items():
        run["ops_cpu_s"].setdefault(name, []).append(value)


def element_rates(doc: dict, statistic: str) -> dict[str, float]:
    """The element-wise rates of an interleaved job: each rank's ``statistic`` over the
    rounds (``min``: of the times, so the highest rate; ``median``), then the median over
    ranks.

    Parameters
    ----------
    doc : dict
        ``interleaved{N}.json`` (its ``rates_by_round``: per rank, name → B/s per round).
    statistic : {"median", "min"}
        Which time of the rounds.

    Returns
    -------
    dict
        Tensor name (:func:`tensor_sizes`) or ``class.<name>`` (:mod:`.kernels`) → B/s.
    """
    over_rounds = {"median": np.median, "min": np.max}[statistic]
    ranks = doc["rates_by_round"]
    return {name: float(np.median([over_rounds(r[name]) for r in ranks]))
            for name in ranks[0]}


#: ``measured_s``'s clock → the (forward and backward, exchange and update) lists it sums
PARTS = {"cpu": ("compute_cpu_s", "exchange_s"), "wall": ("compute_wall_s", "exchange_wall_s")}


def measured_s(run: dict, statistic: str, exchange_statistic: str = "median",
               clock: str = "cpu") -> float:
    """The iteration time a run measured: ``statistic`` over the rounds of the forward and
    backward's time plus ``exchange_statistic`` of the exchange and update's.

    Parameters
    ----------
    run : dict
        One config's entry of ``interleaved{N}.json`` (its lists of :data:`PARTS`).
    statistic, exchange_statistic : {"median", "min"}
        Which time of the rounds, for each part.
    clock : {"cpu", "wall"}
        CPU time (``compute_cpu_s``, ``exchange_s``: one rank per core, whatever else
        runs) or wall time (``compute_wall_s``, ``exchange_wall_s``: ranks sharing cores,
        whose turns on them are part of the time predicted).

    Returns
    -------
    float
        Seconds.
    """
    return sum(measured_parts(run, statistic, exchange_statistic, clock))


def measured_parts(run: dict, statistic: str, exchange_statistic: str = "median",
                   clock: str = "cpu") -> tuple[float, float]:
    """:func:`measured_s`'s two terms: (forward and backward, exchange and update), s."""
    reduce = {"median": np.median, "min": np.min}
    compute, exchange = PARTS[clock]
    return (float(reduce[statistic](run[compute])),
            float(reduce[exchange_statistic](run[exchange])))


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m ddlsim.reference.interleaved",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("output", type=Path, help="folder for compute{N}.csv, interleaved{N}.json")
    ap.add_argument("configs", type=Path, nargs="+", help="run configs, one model and size")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (>= 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (>= 0)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="timer of the collectives at the runs' own sizes (sizes{N}.csv): "
                         "CPU time (default) or wall time (ranks sharing cores)")
    ap.add_argument("--allow-shared-cores", action="store_true",
                    help="run more ranks than the node's usable cores (compare them in wall "
                         "time: a rank's CPU time leaves out its turns)")
    return ap.parse_args(argv)


def _load(paths, world: int):
    from ..config import load_config
    from .train import check_plan, shape_of
    cfgs = [load_config(p) for p in paths]
    for cfg in cfgs:
        check_plan(cfg, world)
    if len({shape_of(c) for c in cfgs}) != 1:
        raise ValueError("every run config of one interleaved job must have the same model, "
                         f"sequence and micro-batch; got {len(cfgs)} configs that differ")
    return cfgs


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``mpirun``; returns the exit status (2: refused input)."""
    from mpi4py import MPI

    from ..calibration.outputs import write_csv
    from ..errors import ConfigError
    from .machine import cache_allocations
    from .train import refuse_shared_cores
    args = _parse(argv)
    comm = MPI.COMM_WORLD
    try:
        if args.rounds < 1 or args.warmup < 0:
            raise ValueError(f"--rounds must be >= 1 and --warmup >= 0, got {args.rounds}, "
                             f"{args.warmup}")
        cfgs = _load(args.configs, comm.Get_size())
        refuse_shared_cores(comm, allow=args.allow_shared_cores)
    except (ValueError, ConfigError) as exc:
        if comm.Get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    cached = cache_allocations()
    gemm, stream, runs, colls = phase_times(cfgs, comm, args.rounds, args.warmup,
                                            clock=args.clock)
    every = comm.gather(stream, root=0)
    if comm.Get_rank() == 0:
        n = comm.Get_size()
        write_csv(args.output / f"compute{n}.csv", gemm, force=True)
        if colls:
            from ..calibration.schema import tidy_frame
            write_csv(args.output / f"sizes{n}.csv", tidy_frame(colls), force=True)
        out = {"ranks": n, "rounds": args.rounds, "warmup": args.warmup, "clock": args.clock,
               "cached_allocations": cached, "rates_by_round": every,
               "runs": {c.parallel.dp_strategy: {**r, "config": str(p)}
                        for c, r, p in zip(cfgs, runs, args.configs)}}
        median = element_rates(out, "median")
        out["stream_Bps"] = median["gradients"]
        out["stream_Bps_by_tensor"] = {k: v for k, v in median.items() if "." not in k}
        (args.output / f"interleaved{n}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

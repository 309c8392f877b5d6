"""The host's work laid on a ``host`` stream beside the device's ops, for a family whose
stack issues its kernels from Python (eager dispatch): ResNet's layer ops
(:mod:`ddlsim.workloads.resnet.host`) and the decoder's under FSDP2
(:mod:`ddlsim.workloads.decoder.eager_host`).

Before each compute-stream op the host has work for, a host op of that many seconds
(``<name>.host``) that the op waits for. Host ops follow one another (one stream) and wait for
nothing else: the host runs ahead of the device, its lead carried from op to op, and a device
op starts once the host has issued it and the device is free (a step is host-bound where the
host ops outlast the kernels, device-bound where not). Every other op keeps its stream,
dependencies (re-indexed) and repeat count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from .payloads import Op
from .trace import Compute

__all__ = ["lay_host_ops"]


def lay_host_ops(items: Sequence, seconds_of: Callable[[Compute], float | None],
                 clear_host_s: bool = False) -> tuple[list[Op], dict[int, int]]:
    """``items`` with the host's work laid on the ``host`` stream (the module docstring).

    Parameters
    ----------
    items : sequence
        a block's ops, or payloads (each then an :class:`Op` on the compute stream), whose
        deps index ``items``.
    seconds_of : callable
        a compute op's payload → the host's seconds for it, or None for no host op.
    clear_host_s : bool
        the op keeps no ``host_s`` where a host op takes its host work.

    Returns
    -------
    list of Op
        the ops with the host ops; their deps index this list.
    dict
        the index of each of ``items`` in it.
    """
    out: list[Op] = []
    at: dict[int, int] = {}
    for i, x in enumerate(items):
        op = x if isinstance(x, Op) else Op(x)
        deps, payload = tuple(at[d] for d in op.deps), op.payload
        seconds = seconds_of(payload) if isinstance(payload, Compute) \
            and op.stream == "compute" else None
        if seconds is not None:
            out.append(Op(Compute(f"{payload.name}.host", 0.0, kind="elementwise",
                                  dtype=payload.dtype, seconds=seconds), "host",
                          repeat=op.repeat))
            deps += (len(out) - 1,)
            if clear_host_s and payload.host_s:
                payload = replace(payload, host_s=0.0)
        at[i] = len(out)
        out.append(replace(op, payload=payload, deps=deps))
    return out, at

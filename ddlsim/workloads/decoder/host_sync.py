"""The host's waits for the device in a training step's own code (outside the model's layers):
a value the framework reads on the host (``.item()``, ``assert not t.isnan()``) makes the host
wait until the device has run everything issued before it.

After such a wait the host has no lead: the device idles from the awaited kernel's end until
the host is running again (a wake, :data:`~.moe_host.SYNC_WAKE_S`) and has issued the calls up
to the next launch the device waits for (``issue_ops``, timed by the device's host rule,
:func:`~ddlsim.simulator.kernels.host.stream_time`: ``n·h``). Each stack names its waits in
software.yaml (``host_syncs``: per site, ``wakes`` in a row and ``issue_ops``, read and counted
in the stack's code, the source beside each); a stack without the section has none.

=============  ====================================  ======================================
site           Megatron-Core r0.8.0 (software.yaml)  where the trace puts it
=============  ====================================  ======================================
``loss``       the loss's NaN check and              end of the last stage's forward
               ``num_tokens.item()``, per            (:meth:`HostSyncOps.head_forward`)
               micro-batch
``bucket``     each gradient bucket's NaN check      before the bucket's collective, after
               (``start_grad_sync``)                 its run of overlapped backward layers
                                                     (:meth:`.dpsync.GradSyncOps.bucket_pass_ops`);
                                                     not overlapped, the update block
``grad_norm``  the clip's ``total_norm.item()``      the update block, before the step
``loss_scale`` ``get_loss_scale().item()``           the update block, after the step
=============  ====================================  ======================================

**In the trace**, per wait, the two parts of the MoE dispatcher's wait (:mod:`.moe_host`): a
``<site>.sync`` op (``wakes · SYNC_WAKE_S``) and a ``<site>.issue`` op (``issue_ops`` host
operations of no device time, :func:`.moe_host.host_op`). The host waits for the compute
stream to drain and the compute stream then waits for the host's issue, so the chain is
serial on the compute stream and its ops are laid there: the same times as on a ``host``
stream of their own (as :mod:`.moe_host` lays waits that other streams' work runs beside),
while a block whose compute stream waits for another stream's ops is one the analytical
engine's max-plus solver leaves to its scheduler (``simulator/analytical/summaries.py``),
several times slower on deep pipelines. The loss's wait ends the head's forward
(:meth:`HostSyncOps.head_forward`), which the search tier builds as a piece, so it reaches
that tier through the same ops; the search tier times the others by :func:`host_sync_times`
and :func:`.dpsync.bucket_run_times` (the overlapped buckets' runs in its flow shop). The
wait's time is booked as compute, as host-bound kernels are (:mod:`ddlsim.simulator.kernels.host`).

Not charged: the collectives the waits wait for (the reporting loss's all-reduce over the
data-parallel group, the grad norm's all-reduce over the world; 8 and 4 bytes), and a wait's
host work that runs while the device has work (the bucket's ``shard_buffer`` slices beside its
scaling pass). A device without ``launch`` facts has no host model and no waits; nor have
ZeRO-3 plans (their units run on one stream, as :mod:`.moe_host` leaves them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...simulator.kernels.host import stream_times
from ..trace import Compute, Op
from .moe_host import SYNC_WAKE_S, host_op
from .stage import StageBase

__all__ = ["HostSync", "HostSyncOps", "SITES", "host_sync_times", "site_seconds",
           "stack_host_syncs", "wait_ops"]

#: the sites a stack's ``host_syncs`` section may name (module docstring)
SITES = ("loss", "bucket", "grad_norm", "loss_scale")


@dataclass(frozen=True)
class HostSync:
    """One site's waits: ``wakes`` device→host reads in a row and the ``issue_ops`` calls
    into torch after them, up to the next launch the device waits for."""

    wakes: int
    issue_ops: int


@functools.lru_cache(maxsize=None)
def stack_host_syncs(stack: str) -> dict[str, HostSync]:
    """The ``host_syncs`` section of stack ``stack`` in software.yaml, by site (empty where
    the stack names none).

    Parameters
    ----------
    stack : str
        a software stack's name.

    Returns
    -------
    dict of str to HostSync

    Raises
    ------
    ValueError
        for a site not in :data:`SITES` (a mistake in software.yaml).
    """
    from ...software import _stack_table
    out = {}
    for site, entry in (_stack_table()[stack].get("host_syncs") or {}).items():
        if site not in SITES:
            raise ValueError(f"software.yaml {stack}.host_syncs: site {site!r} is not one of "
                             f"{', '.join(SITES)}")
        out[site] = HostSync(int(entry["value"]["wakes"]), int(entry["value"]["issue_ops"]))
    return out


def wait_ops(site: str, sync: HostSync, dtype: str, repeat: int = 1) -> list[Op]:
    """One site's wait as ops appended to a block, after the device ops it waits for: the
    wake (``wakes · SYNC_WAKE_S``) and the issue (``issue_ops`` host operations, timed by the
    host rule), on the compute stream (module docstring: the chain is serial there); no op
    has index deps, so the list may be appended to any op list (a head's, a block's).

    Parameters
    ----------
    site : str
        the ops' name prefix (``loss``, ``bucket``, …).
    sync : HostSync
        the site's waits.
    dtype : str
        the ops' dtype label (no FLOPs).
    repeat : int
        how many such waits follow one another (one per bucket).

    Returns
    -------
    list of Op
    """
    wake = Compute(f"{site}.sync", 0.0, kind="elementwise", dtype=dtype,
                   seconds=sync.wakes * SYNC_WAKE_S)
    return [Op(wake, repeat=repeat),
            Op(host_op(f"{site}.issue", sync.issue_ops, dtype), repeat=repeat)]


def host_sync_times(stack: str, launch: Any, launch_spec: Any, buckets: Any) -> np.ndarray:
    """Seconds the update block's waits add to the step (the ``bucket`` site once per bucket,
    ``grad_norm`` and ``loss_scale`` once), for the vectorised search tier: the same ops as
    :meth:`HostSyncOps.step_sync_ops`, each serial on the compute stream.

    Parameters
    ----------
    stack : str
        the software stack's name.
    launch : Launch
        the kernel device's host and gap per kernel (``KernelDevice.launch``).
    launch_spec : LaunchSpec or None
        ``system.device.launch`` (None: no host model, no waits).
    buckets : array
        gradient buckets per plan (0 where the plan reduces no gradients).

    Returns
    -------
    array of seconds, broadcast with ``buckets``.
    """
    buckets = np.asarray(buckets, dtype=float)
    return (buckets * site_seconds(stack, launch, launch_spec, "bucket")
            + site_seconds(stack, launch, launch_spec, "grad_norm")
            + site_seconds(stack, launch, launch_spec, "loss_scale"))


def site_seconds(stack: str, launch: Any, launch_spec: Any, site: str) -> float:
    """Seconds one wait at ``site`` holds the compute stream (:func:`wait_ops` on its own):
    ``wakes · SYNC_WAKE_S`` and its issue by the host rule; 0 where the stack has no such
    wait or the device no host model (``launch_spec`` None). Parameters as
    :func:`host_sync_times`."""
    sync = stack_host_syncs(stack).get(site)
    if launch_spec is None or sync is None:
        return 0.0
    return sync.wakes * SYNC_WAKE_S + float(stream_times(0.0, sync.issue_ops, launch))


class HostSyncOps(StageBase):
    """The stack's waits outside the layers (module docstring); reads the plan's software and
    device."""

    def _syncs(self) -> dict[str, HostSync]:
        """The stack's waits, or none (no host model on the device; ZeRO-3)."""
        if self.plan.device.launch is None or self.plan.zero_stage == 3:
            return {}
        return stack_host_syncs(self.sw.name)

    def host_wait_ops(self, site: str, repeat: int = 1) -> list[Op]:
        """``repeat`` of the stack's waits at ``site`` (:func:`wait_ops`), or none where the
        stack or the plan has none."""
        sync = self._syncs().get(site)
        return wait_ops(site, sync, self.dtype, repeat) if sync is not None and repeat else []

    def _append_wait(self, ops: list, site: str, repeat: int = 1) -> None:
        ops += self.host_wait_ops(site, repeat)

    def head_forward(self) -> list:
        """The head's forward (:meth:`.edges.EdgeOps.head_forward`) and, where the stack has
        it, the loss's wait after it: as ops (payloads wrapped on the compute stream)."""
        head = super().head_forward()
        if "loss" not in self._syncs():
            return head
        ops = [x if isinstance(x, Op) else Op(x) for x in head]
        self._append_wait(ops, "loss")
        return ops

    def step_sync_ops(self, ops: list, n_buckets: float, before_step: bool) -> None:
        """Append the update block's waits to ``ops``: the buckets' NaN checks and the grad
        norm's read (``before_step``), or the loss scale's read."""
        if before_step:
            self._append_wait(ops, "bucket", int(n_buckets))
            self._append_wait(ops, "grad_norm")
        else:
            self._append_wait(ops, "loss_scale")

    def stage_buckets(self, stage: int, skip_first: bool = False) -> int:
        """Gradient buckets of ``stage`` in one step (every chunk's, each as
        :func:`.dpsync.buckets` counts them from :meth:`.dpsync.GradSyncOps.bucket_bytes`;
        ``skip_first``: but the first chunk's)."""
        from .dpsync import buckets
        layers = sum(self.split[stage])
        grad = self.stage_params(stage) * self.gdt
        return sum(int(buckets(grad * (n / layers if layers else 1.0),
                               self.plan.bucket_bytes(stage, c)))
                   for c, n in enumerate(self.split[stage])
                   if (n or not layers) and not (skip_first and c == 0))

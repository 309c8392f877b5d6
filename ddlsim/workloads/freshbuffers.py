"""Receive buffers a program allocates fresh every iteration, and what their first touch
costs the receiving rank.

``spcl/DNN-cpp-proxies``' comm_only pipelines (``comm_only/gpt2_large.cpp:63-64``,
``comm_only/bert_large.cpp:63-64``) ``calloc`` a new send and receive buffer at the top of
``run_pipeline``, every iteration, and never free them. A request that large is served from
pages the kernel has never mapped (glibc's ``mmap`` threshold, mallopt(3)), so the
iteration's first receive, the receiving process's copy into ``recv_buffer`` (out of Open
MPI's shared-memory segment, or CMA's ``process_vm_readv``), page-faults on every page and the
kernel zeroes each one inside that copy. Later receives of the iteration, forward or backward,
land in the same buffer, now mapped. The send buffer is only read (never written): its first
read maps the kernel's shared zero page, a fault that zeroes nothing; it is not charged (a
numpy copy out of a fresh 4 MiB mapping took 1.35 µs more per page than the same copy again
here, 2026-11-29, but which process takes those faults depends on Open MPI's transport, CMA
or copy-in/copy-out, not established for the proxies' runs).

``model.recv_buffers: fresh`` says a program does this; the cost is the host's measured
first-touch cost per page (``system.first_touch``, or a calibration profile's ``first_touch``
from ``ddlsim calibrate first-touch``) times the pages of the message, a compute op on the
receiving rank right after the receive completes, in both engines. Without a measurement
nothing is charged and the result says so (:func:`resolve_first_touch`).
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

from pydantic import Field

from .trace import Block, Compute, Op, insert_op

__all__ = ["RecvBuffers", "RECV_BUFFERS_FIELD", "first_touch_op", "insert_after",
           "fresh_recv_buffers", "resolve_first_touch"]

RecvBuffers = Literal["reused", "fresh"]
#: the model field: ``reused`` (one receive buffer for the run) or ``fresh`` (a new one every
#: iteration, never freed: the comm_only pipeline proxies)
RECV_BUFFERS_FIELD = Field(
    default="reused", description="pipeline receive buffer: reused, or allocated fresh every "
    "iteration (comm_only proxies: the iteration's first receive faults its pages in)")


def fresh_recv_buffers(cfg) -> bool:
    """Whether ``cfg``'s program allocates its pipeline receive buffer every iteration."""
    return getattr(cfg.model, "recv_buffers", "reused") == "fresh"


def first_touch_op(cfg, nbytes: float, tag: str) -> Op | None:
    """The first touch of a fresh ``nbytes`` receive buffer, as a compute op of the
    receiving rank, or None when ``cfg.system.first_touch`` is unset (not charged).

    Parameters
    ----------
    cfg : the run configuration.
    nbytes : bytes the receive writes (B).
    tag : names the op ``first_touch.<tag>``.

    Returns
    -------
    Op or None
        ``ceil(nbytes / page_bytes) × s_per_page`` seconds on the compute stream.
    """
    spec = cfg.system.first_touch
    if spec is None:
        return None
    pages = math.ceil(nbytes / spec.page_bytes)
    return Op(Compute(f"first_touch.{tag}", 0.0, float(nbytes), kind="elementwise",
                      dtype="fp32", seconds=pages * spec.s_per_page))


def insert_after(block: Block, index: int, op: Op, name: str) -> Block:
    """``block`` renamed ``name`` with ``op`` inserted after its op ``index``: ``op``
    depends on op ``index``, and later ops' dependencies on ops after ``index`` shift by
    one."""
    new = Op(op.payload, op.stream, (index,), op.repeat)
    return Block(name, block.phase, insert_op(block.ops, index + 1, new))


def resolve_first_touch(cfg, profile) -> tuple[object, str | None]:
    """``cfg`` with ``system.first_touch`` taken from ``profile``'s measurement where the
    system has none, and the sentence a result carries about it (None: nothing to say).

    Parameters
    ----------
    cfg : the run configuration.
    profile : a :class:`~ddlsim.calibration.CalibrationProfile`, or None.

    Returns
    -------
    (RunConfig, str or None)

    Raises
    ------
    ConfigError
        When the system and the profile give different figures.
    """
    from ..config_system import FirstTouchSpec
    from ..errors import ConfigError, DDLSimWarning

    entry = getattr(getattr(profile, "doc", None), "first_touch", None)
    spec = cfg.system.first_touch
    if not fresh_recv_buffers(cfg):
        return cfg, (None if entry is None else "the profile's first_touch measurement is "
                     "not used: no buffer of this workload is allocated fresh each iteration")
    if entry is not None:
        measured = FirstTouchSpec(s_per_page=entry.s_per_page, page_bytes=entry.page_bytes,
                                  source=entry.source)
        if spec is not None and spec != measured:
            raise ConfigError(f"system.first_touch = {spec.s_per_page!r} s per "
                              f"{spec.page_bytes} B page and the calibration profile's "
                              f"first_touch = {entry.s_per_page!r} s per {entry.page_bytes} B "
                              "page disagree: give one of them")
        spec = measured
        cfg = cfg.model_copy(update={"system": cfg.system.model_copy(
            update={"first_touch": spec})})
    if spec is None:
        note = ("first touch not charged: model.recv_buffers is 'fresh' but there is no "
                "measurement of this host's first-touch cost (`ddlsim calibrate first-touch "
                "PROFILE`, then --calibration PROFILE; or system.first_touch)")
        warnings.warn(note, DDLSimWarning, stacklevel=3)
        return cfg, note
    return cfg, (f"first touch of each iteration's fresh receive buffer charged at "
                 f"{spec.s_per_page * 1e6:.3g} us per {spec.page_bytes} B page ({spec.source})")

"""Which of the software stack's overlap options apply to a decoder plan (docs/overlap.md).

A stack default that cannot apply to the plan (``tp_comm_overlap`` without sequence
parallelism, ``overlap_p2p_comm`` without a pipeline or without the interleaved schedule, …)
is inactive and the plan line says so; the same option set explicitly in ``parallel.*`` is
refused with the reason.
"""

from __future__ import annotations

from typing import Any

from ...software import stalled_grad_reduce
from . import tp_overlap

__all__ = ["inactive_reasons", "shown_inactive", "check_overlap", "overlap_phrase"]


def inactive_reasons(cfg: Any) -> dict[str, str]:
    """Option → why it does not apply to ``cfg`` (only options that are on)."""
    p, sw, out = cfg.parallel, cfg.software, {}
    if sw.tp_comm_overlap != "off" and tp_overlap.mode(cfg) != sw.tp_comm_overlap:
        if p.tp == 1:
            why = "tensor_model_parallel_size is 1"
        elif not p.sequence_parallel:
            why = ("it needs sequence_parallel (Megatron-LM arguments.py asserts it: TE "
                   "overlaps the SP all-gathers and reduce-scatters)")
        elif cfg.model.num_local_experts and sw.tp_comm_overlap == "torch_async":
            why = ("torch's async TP (torch_async) is modelled for dense models only")
        else:
            why = ("it is modelled with 1-D tensor parallelism and ZeRO 0-2 or per-layer "
                   "ZeRO-3 (FSDP)")
        out["tp_comm_overlap"] = why
    if sw.tp_async_backward and p.tp > 1 and tp_overlap.mode(cfg) is None:
        out["tp_async_backward"] = (
            "it is modelled with 1-D tensor parallelism and ZeRO 0-2")
    if sw.overlap_grad_reduce and p.zero_stage == 3:
        out["overlap_grad_reduce"] = ("ZeRO-3 reduce-scatters each layer's gradients within "
                                      "its backward (docs/overlap.md, ZeRO-3 / FSDP)")
    elif sw.overlap_grad_reduce and p.dp_strategy != "ddp":
        out["overlap_grad_reduce"] = (f"dp_strategy {p.dp_strategy!r} updates after the "
                                      "whole backward")
    if sw.overlap_param_gather and (p.zero_stage not in (1, 2) or p.dp_strategy != "ddp"):
        out["overlap_param_gather"] = ("it needs the distributed optimizer (ZeRO-1/2 with "
                                       "dp_strategy 'ddp'; Megatron-LM asserts "
                                       "--use-distributed-optimizer)")
    if sw.overlap_p2p_comm and p.pp == 1:
        out["overlap_p2p_comm"] = "pipeline_model_parallel_size is 1"
    elif sw.overlap_p2p_comm and p.schedule != "interleaved":
        out["overlap_p2p_comm"] = (
            "it needs the interleaved schedule (Megatron-LM arguments.py sets it False "
            "otherwise: 'non-interleaved schedule does not support overlapping p2p "
            "communication'); the pipeline's P2P blocks")
    return out


def shown_inactive(cfg: Any) -> dict[str, str]:
    """:func:`inactive_reasons` as the plan line and the result show them: with the gradient
    reduction the collective library switched off (no asynchronous progress,
    :func:`ddlsim.software.stalled_grad_reduce`; not the plan's doing, so not refused)."""
    stall = stalled_grad_reduce(cfg.software)
    off = inactive_reasons(cfg)
    return {**off, "overlap_grad_reduce": stall} if stall else off


def p2p_overlapped(cfg: Any) -> bool:
    """Whether pipeline sends and receives overlap compute (``overlap_p2p_comm`` on and
    applicable: receives posted ahead) or block (Megatron's ``_communicate``: each receive
    posted where it is called, after the rank's previous compute)."""
    sw = cfg.software
    return bool(sw.overlap_p2p_comm) and "overlap_p2p_comm" not in inactive_reasons(cfg)


def check_overlap(cfg: Any) -> None:
    """Refuse an overlap option the plan sets (``parallel.<option>``) that cannot apply."""
    for field, why in inactive_reasons(cfg).items():
        if cfg.software.sources.get(field) == f"parallel.{field}":
            value = getattr(cfg.parallel, field)
            raise ValueError(f"parallel.{field} = {value!r} cannot apply to this plan: {why}. "
                             f"Remove it (or set it off) to run the plan without it")


def overlap_phrase(cfg: Any) -> str:
    """``overlaps: grad-reduce, tp-comm pipelined; inactive: p2p (PP is 1)`` for the plan
    line (empty when nothing is on)."""
    sw, off = cfg.software, shown_inactive(cfg)
    on = []
    for field, label in (("overlap_grad_reduce", "grad-reduce"),
                         ("overlap_param_gather", "param-gather"),
                         ("overlap_p2p_comm", "p2p")):
        if sw.overlap.get(field) and field not in off:
            on.append(label)
    if sw.tp_comm_overlap != "off" and "tp_comm_overlap" not in off:
        on.append(f"tp-comm {sw.tp_comm_overlap}")
    if tp_overlap.mode(cfg) == "async":
        on.append("tp-async backward")
    short = {"tp_comm_overlap": "tp-comm", "overlap_param_gather": "param-gather",
             "overlap_p2p_comm": "p2p", "overlap_grad_reduce": "grad-reduce",
             "tp_async_backward": "tp-async backward"}
    text = f"overlaps: {', '.join(on) or 'none'}"
    if off:
        text += "; inactive here: " + ", ".join(short[f] for f in off)
    if cfg.parallel.zero_stage == 3:
        from .zero3 import zero3_phrase
        from .fsdp import reshard_phrase
        text += f"; ZeRO-3 gathers {zero3_phrase(sw)}{reshard_phrase(cfg)}"
        if sw.zero3_gather == "per_tensor" and (sw.zero3_host_python_op or sw.zero3_host_copy
                                                 or sw.zero3_host_gather_call):
            text += ", host-issued per rank (the device's wait counts as 'bubble / wait')"
    return text

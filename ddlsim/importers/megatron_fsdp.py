"""Megatron-LM's Megatron-FSDP flags → ddlsim fields (:func:`megatron_fsdp_flags`).

``--use-custom-fsdp`` (Megatron-LM 9c1a5351 and 1e057005; ``--use-megatron-fsdp`` later) with
``--data-parallel-sharding-strategy optim_grads_params`` is ZeRO-3 run by Megatron-FSDP:
``parallel.zero_stage: 3`` with ``system.software.overlap.zero3_implementation:
megatron_fsdp`` on the ``megatron-core-2025`` stack
(:mod:`ddlsim.workloads.decoder.megatron_fsdp`). Megatron-LM asks for
``--use-distributed-optimizer`` beside it (1e057005 ``arguments.py`` lines 590-592) and turns
both overlaps on (lines 531-533): those flags then say the same ZeRO-3 and set nothing more.
The ``no_shard``, ``optim`` and ``optim_grads`` strategies are refused by name (not modelled).
"""

from __future__ import annotations

from .common import Draft

__all__ = ["FSDP_FLAGS", "megatron_fsdp_flags"]

#: the switches that turn Megatron-FSDP on (the 2025 name and the later one)
SWITCHES = ("use-custom-fsdp", "use-megatron-fsdp")
STRATEGY = "data-parallel-sharding-strategy"
#: every flag :func:`megatron_fsdp_flags` reads
FSDP_FLAGS = (*SWITCHES, STRATEGY)
#: what Megatron-FSDP's optim_grads_params makes of the distributed optimizer's fields
_FOLDED = {"parallel.zero_stage": 1, "parallel.overlap_grad_reduce": True,
           "parallel.overlap_param_gather": True}


def megatron_fsdp_flags(draft: Draft, given: list[tuple[str, list[str]]]) -> None:
    """Set ``draft``'s fields from the Megatron-FSDP flags ``given`` (``(flag, values)``,
    after every other flag was read), or refuse them by name."""
    if not given:
        return
    args = {flag: values for flag, values in given}
    shown = " ".join(f"--{f} {' '.join(v)}".strip() for f, v in given)
    on = [f for f in SWITCHES if f in args]
    strategy = args.get(STRATEGY, ["no_shard"])
    if any(args[f] for f in on):
        draft.refuse(shown, f"--{on[0]} takes no value")
    elif not on:
        draft.refuse(shown, f"--{STRATEGY} shards only under Megatron-FSDP (--use-custom-fsdp); "
                            "ddlsim reads it with that flag only")
    elif strategy != ["optim_grads_params"]:
        draft.refuse(shown, f"ddlsim models Megatron-FSDP's --{STRATEGY} optim_grads_params "
                            f"(ZeRO-3) only, got {' '.join(strategy)!r}")
    else:
        folded = [p for p, implied in _FOLDED.items() if draft.fields.get(p) == implied]
        for path in folded:                 # the distributed optimizer's, made ZeRO-3
            del draft.fields[path]
        if folded:
            draft.note(shown, f"{', '.join(folded)} folded into Megatron-FSDP's ZeRO-3 (its "
                              "per-layer gathers and reduce-scatters are the overlaps)")
        draft.set("parallel.zero_stage", 3, shown)
        draft.set("system.software.overlap.zero3_implementation", "megatron_fsdp", shown)
        draft.set("system.software.stack", "megatron-core-2025", shown)

"""Test helper: a built workload's compute ops by name (shared by the MoE kernel tests)."""

from __future__ import annotations

import ddlsim
from ddlsim.workloads.trace import Compute


def compute_ops(cfg: dict) -> dict[str, Compute]:
    """The compute ops of stage 0 of the run ``cfg``, by name (the first of each name)."""
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    out: dict[str, Compute] = {}
    for block in w.classes[0].program.blocks.values():
        for op in block.flat.ops:
            if type(op.payload) is Compute:
                out.setdefault(op.payload.name, op.payload)
    return out

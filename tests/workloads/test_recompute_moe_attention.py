"""Selective recomputation re-runs the same attention kernels in an MoE layer as in a dense one
(Megatron-Core checkpoints the core attention module, whatever follows it)."""

from pathlib import Path

import ddlsim
from ddlsim.api import build_workload

EXAMPLE = Path(__file__).parents[2] / "examples" / "mixtral-8x7b-ep8.yaml"


def _recompute_ops(overrides):
    cfg = ddlsim.load_config(str(EXAMPLE), ["train.recompute=selective", *overrides])
    prog = build_workload(cfg).classes[0].program
    return [op.payload for step in prog.steps for op in prog.blocks[step.block].flat.ops
            if getattr(op.payload, "name", "") == "recompute.attn_core"]


def test_moe_layer_recomputes_the_flash_forward():
    ops = _recompute_ops([])
    assert ops, "a selective plan recomputes the attention core"
    for op in ops:
        # the flash forward kernel again, not a roofline over the s x s scores
        assert op.kernels and any(k.kind == "flash" for k in op.kernels)
        s, heads = 4096, 32
        assert op.bytes < 2 * heads * s * s   # no score matrix is written

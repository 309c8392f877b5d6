"""Selective recomputation's ``mla_up_proj`` runs MLA's rotary embedding again as the
forward runs it (simulator/kernels/rotary.py: rope_bytes, rope_classes, rope_widths),
not by passes written out by hand: the stack's fused kernel, rotate-half or complex form,
on q_pe (``a·d_r/t``) and the shared k_pe (``d_r``) apart."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import layer_elementwise_parts
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.recompute_modules import (RECOMPUTE_MODULES, LayerContext,
                                                        separate_norms)

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _builder(**kernels):
    """DeepSeek-V3 cut to two layers (the first dense), TP 1, EP 8, one DGX H100."""
    run = {"model": {"preset": "deepseek-v3", "num_hidden_layers": 2,
                     "first_k_dense_replace": 1},
           "parallel": {"expert_model_parallel_size": 8,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                "permute_fusion": True}},
           "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
                     "recompute": "selective", "recompute_modules": ["mla_up_proj"]},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2025", "kernels": kernels}}}
    cfg = ddlsim.load_config(run)
    return StageBuilder.from_config(cfg, cfg.model.shape())


def _recomputed_rope(b):
    """The memory kernels of mla_up_proj's recomputation but its last (the concatenations)."""
    ctx = LayerContext(b.b, b.s, b.tp, b.sp, False, False,
                       separate_norms(b.shape, b.sw, False), b.dt)
    mem = [k for k in RECOMPUTE_MODULES["mla_up_proj"].kernels(b, ctx) if k.kind == "memory"]
    return tuple(mem[:-1])


@pytest.mark.parametrize("kernels, per", [
    ({}, (4,)),                                                   # TE's fused RoPE: 2d
    ({"fused_rope": False}, (4, 2, 4, 4, 6)),                     # rotate-half: 10d
    ({"fused_rope": False, "rope_form": "complex"}, (6, 8, 6)),   # upcast, multiply, cast
])
def test_the_recomputed_rope_is_the_forwards(kernels, per):
    b = _builder(**kernels)
    got = _recomputed_rope(b)
    assert got == layer_elementwise_parts(b.shape, b.b, b.s, b.tp, b.sp, b.dt, b.sw,
                                          b.dtype)["rope"]
    # by hand, bf16 (B per element): each pass over q_pe (128 heads × 64), then over the
    # shared k_pe (64)
    m = b.shape.mla
    q, k = 4096 * b.shape.heads * m.qk_rope_head_dim, 4096 * m.qk_rope_head_dim
    assert [x.bytes for x in got] == [p * n for n in (q, k) for p in per]

"""One element-wise rule for every decoder layer: an MoE layer's non-MLP element-wise ops
(norms, residual connections, rotary embedding, query and key norms) are the dense layer's
kernels, forward and backward, by the same functions and arguments (simulator/kernels/
elementwise.py, elementwise_backward.py: torch's autograd backward, the stack's fused or
unfused forms), less the dense MLP's activation; not a byte count with twice it backward."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.simulator.kernels.elementwise import layer_elementwise_parts
from ddlsim.simulator.kernels.elementwise_backward import layer_elementwise_backward_parts
from ddlsim.workloads.decoder.builder import StageBuilder

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Qwen3-30B-A3B (query and key norms) cut to two MoE layers, TP 2 with SP, EP 4
RUN = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
       "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                    "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                            "permute_fusion": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": "megatron-core-2025"}}}


def _builder(**kernels):
    run = copy.deepcopy(RUN)
    run["system"]["software"]["kernels"] = kernels
    cfg = ddlsim.load_config(run)
    return StageBuilder.from_config(cfg, cfg.model.shape())


def _op(ops, name):
    return next(o for o in ops if getattr(o, "name", None) == name)


@pytest.mark.parametrize("kernels", [{}, {"fused_rope": False, "fused_bias_gelu": False,
                                          "fused_layernorm": False}])
@pytest.mark.parametrize("backward", [False, True])
def test_an_moe_layer_has_the_dense_layers_elementwise_kernels_less_its_activation(
        kernels, backward):
    b = _builder(**kernels)
    name = "bwd.elementwise" if backward else "fwd.elementwise"
    moe = _op([o.payload for o in b.moe_layer_body(backward)], name)
    # the dense builder's kernels for the same shapes (layerkernels.layer_kernels' ew and
    # bwd.ew: b sequences of s/cp tokens, TP 2 with SP), by op, less the MLP activation's
    make = layer_elementwise_backward_parts if backward else layer_elementwise_parts
    parts = make(b.shape, b.b, b.s, b.tp, b.sp, b.dt, b.sw, b.dtype)
    assert sum(parts.values(), ()) == b.kernels["bwd.ew" if backward else "ew"]
    assert len(parts["activation"]) == (3 if kernels and backward else 2 if kernels else 1)
    assert moe.kernels == sum((k for op, k in parts.items() if op != "activation"), ())
    assert moe.bytes == pytest.approx(sum(k.bytes for k in moe.kernels))


def test_an_moe_layers_backward_is_torchs_autograd_not_twice_the_forward():
    # megatron-core-2025 with the fusions off: unfused residual adds (their backward one
    # gradient sum, 3d, against the forward's 3d twice over), TE's norms (one backward kernel,
    # 3d, not 4d), the rotate-half RoPE (its forward's kernels again, not twice them)
    b = _builder(fused_rope=False, fused_bias_dropout_add=False)
    fwd = _op([o.payload for o in b.moe_layer_body(False)], "fwd.elementwise")
    bwd = _op([o.payload for o in b.moe_layer_body(True)], "bwd.elementwise")
    sh, x = b.shape, b.b * b.s * b.shape.hidden / b.tp            # SP: the norms' b·s·h/t
    q, k = b.b * b.s * sh.q_width / b.tp, b.b * b.s * sh.kv_width / b.tp
    d = b.dt
    rope = [p * d * n for n in (q, k) for p in (2, 1, 2, 2, 3)]
    qk = [3 * d * q, 3 * d * k]                                   # TE's q/k norms backward
    want = [3 * d * x] * 2 + qk + [3 * d * x] * 2 + rope
    assert [kk.bytes for kk in bwd.kernels] == pytest.approx(want)
    assert bwd.bytes < 2 * fwd.bytes

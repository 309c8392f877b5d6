"""``kernels.qkv_bias_pass`` reaches the trace: the decoder builder puts the QKV bias's pass in
the attention's forward op and its gradient's sum in the backward's, once per layer, with
:func:`~ddlsim.workloads.decoder.layerkernels.qkv_bias_kernels`' bytes, derived here by hand
(GPT-2 124M: 12 layers, hidden 768, Q, K and V each 768 wide, biased; micro-batch 4 × 64
tokens, fp32, TP 1)."""

from __future__ import annotations

import warnings

import ddlsim

CONFIG = "examples/gpt2-2ranks-one-node.yaml"
#: the QKV output of one micro-batch, elements: tokens × (q + 2·kv)
QKV = 4 * 64 * 3 * 768


def _attn_ops(bias_pass: bool) -> dict[str, tuple[float, int, int]]:
    """(kernel bytes, kernels, repeat) of ``fwd.attn`` and ``bwd.attn`` under a 2021
    Megatron-LM stack that adds the QKV bias apart or in the GEMM."""
    stack = ("system.software={stack: megatron-lm-2021, kernels: {qkv_bias_pass: "
             f"{str(bias_pass).lower()}}}}}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        work = ddlsim.build_workload(ddlsim.load_config(CONFIG, [stack]))
    return {op.payload.name: (sum(k.bytes for k in op.payload.kernels),
                              len(op.payload.kernels), op.repeat)
            for b in work.classes[0].program.blocks.values() for op in b.flat.ops
            if op.payload.name in ("fwd.attn", "bwd.attn")}


def test_the_bias_pass_and_its_gradient_sum_land_in_the_attention_ops():
    apart, fused = _attn_ops(True), _attn_ops(False)
    # forward: read + write the QKV output, 4 B each; backward: read the gradient, 4 B
    for name, extra in (("fwd.attn", 2 * 4 * QKV), ("bwd.attn", 4 * QKV)):
        (b1, n1, r1), (b0, n0, r0) = apart[name], fused[name]
        assert (n1 - n0, r1, r0) == (1, 12, 12), name      # one kernel more, per layer
        assert b1 - b0 == extra, name

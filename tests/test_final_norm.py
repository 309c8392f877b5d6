"""The final norm before the output head (Megatron-Core ``TransformerBlock.final_layernorm``,
torchtitan ``Transformer.norm``, HF ``model.norm``): the last pipeline stage runs it forward
and backward, with the kernels of a layer's own norm on the rank's tokens; no other stage
does; the search's tier times it as the exact engine."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.gpt import build_gpt_workload

BASE = {"model": "gpt2-124m", "system": {"preset": "dgx-a100", "nodes": 1},
        "train": {"micro_batch_size": 2, "global_batch_size": 16, "seq_length": 1024}}
H = 768


def _cfg(parallel: dict, **over):
    d = {**BASE, "parallel": parallel, **over}
    return ddlsim.load_config(d)


def _norm_ops(cfg) -> dict[str, list]:
    """Each rank class's final-norm ops (forward and backward), in program order."""
    out = {}
    for c in build_gpt_workload(cfg).classes:
        out[c.name] = [op.payload for blk in c.program.blocks.values() for op in blk.flat.ops
                       if op.name in ("final_norm", "bwd.final_norm")]
    return out


@pytest.mark.parametrize("parallel, tokens", [
    # b·s/cp/(t if sp) tokens of h elements; Megatron-Core's fused norm (TE) reads and
    # writes each once in bf16: 2 + 2 bytes per element; its backward one kernel reading the
    # gradient and the input, writing the input's gradient: 6 (fused_norm_backward one_kernel)
    ({"pipeline_model_parallel_size": 2}, 2 * 1024),
    ({"pipeline_model_parallel_size": 2, "tensor_model_parallel_size": 2}, 2 * 1024),
    ({"pipeline_model_parallel_size": 2, "tensor_model_parallel_size": 2,
      "sequence_parallel": True}, 2 * 1024 / 2),
    ({"pipeline_model_parallel_size": 2, "tensor_model_parallel_size": 2,
      "sequence_parallel": True, "context_parallel_size": 2}, 2 * 1024 / 2 / 2),
])
def test_last_stage_runs_the_final_norm(parallel, tokens):
    cfg = _cfg(parallel)
    ops = _norm_ops(cfg)
    last = [n for n in ops if ops[n]]
    assert len(last) == 1 and last[0] == sorted(ops)[-1]      # the stage holding the head
    fwd = [x for x in ops[last[0]] if x.name == "final_norm"]
    bwd = [x for x in ops[last[0]] if x.name == "bwd.final_norm"]
    assert fwd and bwd      # once in each of the stage's forward and backward blocks
    assert [x.bytes for x in fwd] == pytest.approx([4 * tokens * H] * len(fwd), rel=1e-12)
    assert [x.bytes for x in bwd] == pytest.approx([6 * tokens * H] * len(bwd), rel=1e-12)


@pytest.mark.parametrize("stack, sp", [("megatron-core-2024", True),
                                       ("megatron-lm-2021", False),
                                       ("torchtitan-2024", True)])   # tp_needs_sp
def test_final_norm_has_the_layer_norm_kernels(stack, sp):
    """The same kernels (passes, classes) as the layer's input norm, whatever the stack
    fuses: the first of the layer's element-wise kernels."""
    par = {"tensor_model_parallel_size": 2, "sequence_parallel": sp}
    if stack == "torchtitan-2024":
        cfg = ddlsim.load_config({**BASE, "model": "llama-3.1-8b", "parallel": par,
                                  "system": {**BASE["system"], "software": {"stack": stack}}})
    else:
        cfg = _cfg(par, system={**BASE["system"], "software": {"stack": stack}})
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    fwd = b.final_norm(False)
    n = len(fwd.kernels)
    assert fwd.kernels == b.kernels["ew"][:n]
    assert fwd.bytes == pytest.approx(sum(k.bytes for k in fwd.kernels), rel=1e-12)
    bwd = b.final_norm(True)          # and the backward of the layer's input norm
    assert bwd.kernels == b.kernels["bwd.ew"][:len(bwd.kernels)]
    assert bwd.bytes == pytest.approx(sum(k.bytes for k in bwd.kernels), rel=1e-12)
    if stack == "torchtitan-2024":   # torch's composite RMSNorm in eager mode: 8 kernels
        assert n == 8 and {k.variant for k in fwd.kernels} == {"norm"}
    else:
        assert n == 1 if stack == "megatron-core-2024" else n >= 1


@pytest.mark.parametrize("kernels, final_kernels", [
    ({"compile": True}, 8),                             # Inductor fuses the blocks' norms only
    ({"compile": True, "fused_layernorm": True}, 1),    # a fused norm the config sets itself
])
def test_compiled_torchtitan_leaves_the_final_norm_eager(kernels, final_kernels):
    """torchtitan compiles each TransformerBlock, not the model's final norm: under
    ``compile: true`` the layers' RMSNorm is one kernel, the final one torch's composite."""
    cfg = ddlsim.load_config({**BASE, "model": "llama-3.1-8b", "parallel": {},
                              "system": {**BASE["system"], "software": {
                                  "stack": "torchtitan-2024", "kernels": kernels}}})
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    assert b.kernels["ew"][0].variant == ""             # the layer's fused norm
    assert len(b.final_norm(False).kernels) == final_kernels


@pytest.mark.parametrize("stack", ["megatron-lm-2021", "megatron-core-2024"])
@pytest.mark.parametrize("t, sp, per_token", [(1, False, 4 * H), (2, False, 4 * H),
                                              (2, True, 4 * H / 2)])
def test_megatron_keeps_the_final_norm_input_and_output(stack, t, sp, per_token):
    """On the last stage Megatron keeps the final norm's 16-bit input and its output (the
    output layer's saved input, the sequence shard under SP): 2·2·h bytes per token, over
    ``t`` under sequence parallelism, as the layers' norm inputs are counted."""
    from ddlsim.workloads.allocator import head_bytes
    from ddlsim.workloads.framework_memory import framework
    assert head_bytes(framework(stack), H, t, sp) == pytest.approx(per_token, rel=1e-12)

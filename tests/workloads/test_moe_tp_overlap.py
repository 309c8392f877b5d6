"""TP overlaps in a Mixture-of-Experts model (``tp_overlap.attention_slice``): an MoE layer's
attention linears (Transformer Engine's ``linear_qkv``/``linear_proj``) take the userbuffers
and the async backward as a dense layer's do; the experts and the dispatcher do not."""

import copy

import pytest

import ddlsim
from ddlsim.workloads.trace import Loop, Wait
from ddlsim.workloads.decoder.builder import StageBuilder

#: Mixtral 8x7B on 32 H100s: TP 2 with sequence parallelism, PP 2, EP 4, Megatron-Core 2025
MIXTRAL = {"model": "mixtral-8x7b",
           "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                        "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 4,
                        "expert_tensor_parallel_size": 1, "zero_stage": 1},
           "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 4096,
                     "dtype": "bf16"},
           "system": {"preset": "dgx-h100", "nodes": 4,
                      "software": {"stack": "megatron-core-2025"}}}


def _cfg(overlap: str, model: str = "mixtral-8x7b", **parallel):
    data = copy.deepcopy(MIXTRAL)
    data["model"] = model
    data["parallel"].update(tp_comm_overlap=overlap, **parallel)
    return ddlsim.load_config(data)


def _tp_stream(ops) -> list[str]:
    """The collectives put on the ``tp`` stream (beside a GEMM), in order."""
    return [o.payload.name for o in ops if o.stream == "tp" and type(o.payload) is not Wait]


@pytest.mark.parametrize("overlap", ["bulk", "pipelined"])
def test_userbuffers_are_modelled_for_an_moe_layers_attention(overlap):
    """Refused ("modelled for dense models") until 2026-11-30."""
    cfg = _cfg(overlap)
    assert cfg.software.tp_comm_overlap == overlap
    for engine in ("analytical", "des"):
        assert ddlsim.predict(cfg, engine).iteration_time_s > 0


def test_only_the_attention_linears_collectives_leave_the_compute_stream():
    """Pipelined: forward, the all-gather feeding qkv (moved before it: the partitioner
    emits it after proj's reduce-scatter, for the next layer) and proj's pipelined
    reduce-scatter beside their GEMMs; backward, the output-gradient gather feeding proj's
    dgrad, qkv's input gather and its dgrad reduce-scatter. The dispatcher's collectives
    (``tp_ep``) and the experts stay on the compute stream."""
    cfg = _cfg("pipelined")
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    fwd, bwd = b.moe_layer_body(False), b.moe_layer_body(True)
    assert _tp_stream(fwd) == ["fwd.proj.ag", "fwd.proj.rs.overlapped"]
    names = [o.payload.name for o in fwd]
    assert names.index("fwd.proj.ag") < names.index("fwd.qkv")
    assert _tp_stream(bwd) == ["bwd.qkv.ag", "bwd.qkv.ag.input", "bwd.qkv.rs"]
    for ops in (fwd, bwd):
        assert all(o.stream != "tp" for o in ops        # (the host's own work on "host")
                   if getattr(o.payload, "group", None) == "tp_ep"
                   or ".experts." in o.payload.name)
    assert "fwd.proj.tp_overlap.sm_contention" in names


def test_the_async_backward_applies_to_an_moe_layer_and_makes_it_faster():
    """tp_comm_overlap off: Megatron-Core's NCCL overlap of the backward (the stack's
    tp_async_backward) now reaches an MoE model's attention linears too."""
    cfg = _cfg("off")
    assert cfg.software.tp_async_backward
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    assert b.plan.tp_overlap == "async"
    assert _tp_stream(b.moe_layer_body(True)) == ["bwd.qkv.ag.input", "bwd.qkv.rs"]
    assert _tp_stream(b.moe_layer_body(False)) == []             # the forward blocks
    plain = copy.deepcopy(MIXTRAL)
    plain["system"]["software"]["overlap"] = {"tp_async_backward": False}
    for engine in ("analytical", "des"):
        assert (ddlsim.predict(cfg, engine).iteration_time_s
                < ddlsim.predict(ddlsim.load_config(plain), engine).iteration_time_s)


def test_an_moe_models_dense_layers_take_the_dense_overlap():
    """DeepSeek-V2-Lite's first layer is dense: its loop is the dense overlapped one."""
    cfg = _cfg("pipelined", "deepseek-v2-lite", pipeline_model_parallel_size=1)
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    dense = b._dense_layer_ops(False, 1)
    assert len(dense) == 1 and isinstance(dense[0].payload, Loop)
    assert any(o.stream == "tp" for o in dense[0].payload.body)


def test_torchs_async_tp_stays_refused_for_an_moe_model():
    with pytest.raises(ddlsim.ConfigError, match="torch_async.*dense models only"):
        ddlsim.build_workload(_cfg("torch_async"))

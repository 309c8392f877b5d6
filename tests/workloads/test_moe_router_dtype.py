"""``--moe-router-dtype fp32``: the router's GEMM on fp32 casts at TF32, and its casts
(decoder/moe_router.py ``router_gemm``; Megatron-LM 1e057005 ``router.py`` lines 77-82)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers.megatron import read_megatron

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

T, H, E = 4096, 2048, 128        # one micro-batch of 4,096 tokens; Qwen3-30B-A3B: h, experts


def qwen3_30b(dtype: str = "bf16", **moe) -> dict:
    """Qwen3-30B-A3B cut to one layer on one DGX H100, EP8, alltoall, TP 1, one micro-batch."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 1},
            "parallel": {"expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": True, **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": T,
                      "dtype": dtype},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _router_ops(cfg: dict, block: str) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    ops = [getattr(o, "payload", o) for o in w.classes[0].program.blocks[block].flat.ops]
    return [p for p in ops if getattr(p, "name", "").split(".")[1:2] == ["router"]
            and not p.name.endswith((".kernels", ".loss"))]


def test_fp32_router_casts_its_operands_and_runs_its_gemm_at_tf32():
    fwd = _router_ops(qwen3_30b(router_dtype="fp32"), "F0")
    assert [o.name for o in fwd] == ["fwd.router.cast", "fwd.router"]
    cast, gemm = fwd
    # input T x h and weight E x h, bf16 read (2 B) and fp32 written (4 B)
    assert [k.bytes for k in cast.kernels] == [T * H * 6.0, E * H * 6.0]
    assert [(k.kind, k.dtype, k.shape) for k in gemm.kernels] == [("gemm", "tf32", (T, E, H))]
    bwd = _router_ops(qwen3_30b(router_dtype="fp32"), "B0")
    assert [o.name for o in bwd] == ["bwd.router", "bwd.router.cast"]   # gradients cast back
    assert [k.dtype for k in bwd[0].kernels] == ["tf32", "tf32"]
    assert [k.bytes for k in bwd[1].kernels] == [T * H * 6.0, E * H * 6.0]


def test_the_router_gemm_is_the_layers_dtype_without_it_fp8_training_included():
    for dtype in ("bf16", "fp8"):   # a plain torch linear, outside Transformer Engine's FP8
        ops = _router_ops(qwen3_30b(dtype), "F0")
        assert [o.name for o in ops] == ["fwd.router"]
        assert [k.dtype for k in ops[0].kernels] == ["bf16"]


def test_fp32_router_takes_longer():
    slow = ddlsim.predict(ddlsim.load_config(qwen3_30b(router_dtype="fp32"))).iteration_time_s
    fast = ddlsim.predict(ddlsim.load_config(qwen3_30b())).iteration_time_s
    assert slow > fast


def test_fp64_is_refused_by_the_config_and_the_importer():
    with pytest.raises(ConfigError, match="router_dtype"):
        ddlsim.load_config(qwen3_30b(router_dtype="fp64"))
    draft = read_megatron("pretrain_gpt.py --num-experts 128 --moe-router-dtype fp32", "run.sh")
    assert draft.fields["parallel.moe.router_dtype"] == "fp32" and not draft.refused
    draft = read_megatron("pretrain_gpt.py --num-experts 128 --moe-router-dtype fp64", "run.sh")
    assert "parallel.moe.router_dtype" not in draft.fields
    assert any("moe-router-dtype" in str(r) for r in draft.refused)

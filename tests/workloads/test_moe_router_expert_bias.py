"""The expert bias's kernels in the router (decoder/moe_router.py, Megatron-LM d98e8a64
``moe_utils.py`` line 924 and ``router.py`` ``_apply_expert_bias`` lines 733-744)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.moe_router import RouterPass, router_kernels
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def qwen3_30b(recompute: str = "selective", **moe) -> dict:
    """Qwen3-30B-A3B cut to one layer on one DGX H100, EP8, a sigmoid router."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 1},
            "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": True, "router_score_function": "sigmoid",
                                 **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096,
                      "dtype": "bf16", "recompute": recompute},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _plan(**moe):
    return resolve_moe(ddlsim.load_config(qwen3_30b(**moe)))


@pytest.mark.parametrize("fused, forward, backward", [
    (False, RouterPass(10 + 1 + 1, 1), RouterPass(4, 0)),     # the add; the map's sum, +=
    (True, RouterPass(1 + 0 + 1, 1), RouterPass(1, 0))])      # TE's top-k takes the bias
def test_the_bias_adds_its_kernels(fused, forward, backward):
    plan = _plan(router_enable_expert_bias=True, router_fusion=fused)
    assert router_kernels(plan, False) == forward
    assert router_kernels(plan, True) == backward
    off = _plan(router_fusion=fused)
    assert router_kernels(off, False).scores == forward.scores - (1 if fused else 2)


def _router_kernels(cfg: dict, block: str, name: str) -> int:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    ops = [o for o in w.classes[0].program.blocks[block].flat.ops
           if getattr(o.payload, "name", "") == name]
    return len(ops[0].payload.kernels)


def test_a_checkpointed_first_forward_counts_no_tokens():
    """Gradients off in a checkpointed layer's first forward: the bias is added, the tokens
    per expert are not accumulated (``torch.is_grad_enabled()``, router.py line 740)."""
    on = qwen3_30b("full", router_enable_expert_bias=True)
    off = qwen3_30b("full")
    assert _router_kernels(on, "F0", "fwd.router.kernels") == \
        _router_kernels(off, "F0", "fwd.router.kernels") + 1

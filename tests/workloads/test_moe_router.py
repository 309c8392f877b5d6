"""The router's kernels beside its GEMM and the load-balancing loss's all-reduce
(decoder/moe_router.py, docs/moe.md "The router's kernels")."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.importers.megatron import read_megatron
from ddlsim.workloads.decoder.moe_router import ROUTER_KERNELS, RouterPass, router_kernels
from ddlsim.workloads.decoder.moeplan import resolve_moe

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def qwen3_30b(tp: int = 1, cp: int = 1, stack: str = "megatron-core-2025", **moe) -> dict:
    """Qwen3-30B-A3B cut to one layer on one DGX H100, EP8, alltoall, one micro-batch."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 1},
            "parallel": {"tensor_model_parallel_size": tp, "context_parallel_size": cp,
                         "sequence_parallel": tp > 1, "expert_model_parallel_size": 8 // tp // cp,
                         "expert_tensor_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": True, **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 // (tp * cp),
                      "seq_length": 4096, "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def _forward(cfg: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o for o in w.classes[0].program.blocks["F0"].flat.ops]


def _plan(**moe):
    return resolve_moe(ddlsim.load_config(qwen3_30b(tp=2, **moe)))


def test_kernel_counts_per_part_as_counted_in_the_code():
    # fused: top-k 1 + 1; forced balance's clone and normal_ 2 + 0; the loss 3 + 2 each way
    assert router_kernels(_plan(router_fusion=True, aux_loss_coeff=0.0), False) == \
        RouterPass(1, 0)
    plan = _plan(router_fusion=True, aux_loss_coeff=1e-3, router_force_load_balancing=True)
    assert router_kernels(plan, False) == RouterPass(1 + 2 + 3, 2)
    assert router_kernels(plan, True) == RouterPass(1 + 0 + 3, 2)
    # unfused: top-k 10 + 4, the loss 9 + 5 forward, 2 + 4 backward
    plan = _plan(aux_loss_coeff=1e-3)
    assert router_kernels(plan, False) == RouterPass(10 + 9, 5)
    assert router_kernels(plan, True) == RouterPass(4 + 2, 4)
    assert set(ROUTER_KERNELS) == {(p, f) for p in ("forced", "topk", "aux_loss",
                                                    "expert_bias", "bias_counts")
                                   for f in (True, False)}


def test_the_loss_needs_aux_loss_balancing_and_a_coefficient():
    assert not _plan(aux_loss_coeff=0.0).aux_loss               # Megatron's default 0
    # unset: qwen3-30b-a3b's config.json leaves output_router_logits false, so its
    # router_aux_loss_coef is not trained with (tests/test_hf_aux_loss.py): Megatron's 0
    assert _plan().aux_loss_coeff == 0.0 and not _plan().aux_loss
    assert _plan(aux_loss_coeff=1e-3).aux_loss
    assert _plan(aux_loss_coeff=1e-3, router_load_balancing_type="seq_aux_loss").aux_loss
    for balancing in ("sinkhorn", "none"):
        with pytest.raises(ConfigError, match="aux_loss_coeff = 0.001 with"):
            ddlsim.load_config(qwen3_30b(aux_loss_coeff=1e-3,
                                         router_load_balancing_type=balancing))


def test_the_fused_router_is_the_stacks_and_refused_where_it_has_none():
    plan = _plan()
    assert plan.router_fusion is False and "line 792" in plan.sources["router_fusion"]
    with pytest.raises(ConfigError, match="has no fused router"):
        ddlsim.load_config(qwen3_30b(stack="megatron-core-2024", token_dispatcher_type="alltoall",
                                     router_fusion=True, permute_fusion=False))


def test_forward_router_then_kernels_then_the_counts_all_reduce_over_tp_then_the_loss():
    ops = _forward(qwen3_30b(tp=2, aux_loss_coeff=1e-3, router_fusion=True))
    names = [o.payload.name for o in ops]
    i = names.index("fwd.router")
    assert names[i:i + 4] == ["fwd.router", "fwd.router.kernels", "fwd.router.aux_allreduce.tp",
                              "fwd.router.loss"]
    reduce = ops[i + 2]
    assert reduce.stream == "compute" and reduce.payload.group == "tp"
    assert reduce.payload.op == "all_reduce" and reduce.payload.bytes == 8 * 128   # E int64
    T, E = 4096 / 2, 128                       # the sequence-parallel shard, the experts
    loss = ops[i + 3].payload
    assert len(loss.kernels) == 3 and loss.kernels[0].bytes == pytest.approx(8 * T * E)


def test_no_all_reduce_without_tp_or_cp_and_none_without_the_loss():
    names = [o.payload.name for o in _forward(qwen3_30b(aux_loss_coeff=1e-3))]
    assert "fwd.router.loss" in names and not any("aux_allreduce" in n for n in names)
    names = [o.payload.name for o in _forward(qwen3_30b(tp=2, aux_loss_coeff=0.0))]
    assert "fwd.router.kernels" in names and "fwd.router.loss" not in names
    assert not any("aux_allreduce" in n for n in names)


def test_the_backward_runs_the_kernels_before_the_router_gemm():
    w = ddlsim.build_workload(ddlsim.load_config(qwen3_30b(tp=2, aux_loss_coeff=1e-3)))
    ops = [o for b in w.classes[0].program.blocks.values() for o in b.flat.ops]
    names = [o.payload.name for o in ops]
    k, g = names.index("bwd.router.kernels"), names.index("bwd.router")
    assert k < g and len(ops[k].payload.kernels) == 4 + 2 + 4


def test_the_loss_costs_time_in_both_engines():
    base = qwen3_30b(tp=2, aux_loss_coeff=0.0)
    loss = qwen3_30b(tp=2, aux_loss_coeff=1e-3)
    for engine in ("analytical", "des"):
        t0 = ddlsim.predict(base, engine).to_dict()["iteration_time_s"]
        t1 = ddlsim.predict(loss, engine).to_dict()["iteration_time_s"]
        assert t1 > t0


def test_megatron_arguments_set_the_coefficient_and_the_fusion():
    draft = read_megatron("pretrain_gpt.py --num-experts 128 --moe-aux-loss-coeff 1e-3 "
                          "--moe-router-fusion", "run.sh")
    assert draft.fields["parallel.moe.aux_loss_coeff"] == pytest.approx(1e-3)
    assert draft.fields["parallel.moe.router_fusion"] is True
    assert not draft.refused


def test_a_checkpointed_layer_computes_the_loss_in_its_recomputation_only():
    # full recomputation: the first forward runs without gradients (no loss, no all-reduce),
    # the backward's recomputed forward with them
    cfg = qwen3_30b(tp=2, aux_loss_coeff=1e-3)
    cfg["train"]["recompute"] = "full"
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    names = [o.payload.name for b in w.classes[0].program.blocks.values() for o in b.flat.ops]
    assert "fwd.router.kernels" in names and "fwd.router.loss" not in names
    assert not any(n.startswith("fwd.router.aux_allreduce") for n in names)
    assert "recompute.router.loss" in names and "recompute.router.aux_allreduce.tp" in names

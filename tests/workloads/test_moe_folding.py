"""Megatron-Core's MoE parallel folding and MoE options (docs in ddlsim/workloads/decoder/moe.py
and moeplan.py): expert TP independent of TP, EP carved out of TP·CP·DP, context parallelism
with MoE, the dispatchers, routing load, shared-expert overlap; both engines run them."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")
H, F_E, E, K, SEQ = 4096, 14336, 8, 2, 4096


def plan(tp=2, etp=1, ep=8, cp=1, nodes=1, stack="megatron-core-2025", **moe) -> dict:
    """Mixtral 8x7B cut to 2 layers on ``nodes`` DGX H100s, TP·CP·DP = 8·nodes."""
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": tp, "expert_tensor_parallel_size": etp,
                         "expert_model_parallel_size": ep, "context_parallel_size": cp,
                         "sequence_parallel": tp > 1,
                         "moe": {"token_dispatcher_type": "alltoall", **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * nodes // (tp * cp),
                      "seq_length": SEQ, "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": nodes, "software": stack}}


def colls(w):
    for c in w.classes:
        for block in c.program.blocks.values():
            for o in block.flat.ops:
                if isinstance(o.payload, Collective):
                    yield o.payload


def test_ep_folded_over_tp_and_dp_need_not_divide_dp():
    # TP2 on 8 GPUs: DP4; EP8 with expert TP 1 spans TP×DP = 8 ranks (EDP 1). Megatron-Core
    # 2025 runs it; 2024 refuses it (EP must divide DP there: its rule, with the source)
    cfg = ddlsim.load_config(plan())
    mesh = cfg.mesh
    assert (mesh.size("dp"), mesh.size("ep"), mesh.size("etp"), mesh.size("edp")) == (4, 8, 1, 1)
    w = ddlsim.build_workload(cfg)
    assert w.groups["ep"].size == 8 and "etp" not in w.groups
    a2a = [p for p in colls(w) if p.op == "all_to_all"]
    # T = b·s/tp = 2048 tokens, × k × h × 2 bytes per dispatch
    assert a2a and {p.group for p in a2a} == {"ep"} and {p.bytes for p in a2a} == {2048 * K * H * 2}
    with pytest.raises(ConfigError, match="rule moe_ep_divides_dp"):
        ddlsim.load_config(plan(stack="megatron-core-2024"))
    for engine in ("analytical", "des"):
        assert ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s > 0


def test_expert_tp_gathers_over_etp_and_splits_expert_weights():
    # EP4 × expert TP 2 on 8 GPUs (TP 1, DP 8): EDP = 8 / (2·4) = 1; each rank holds
    # E/EP = 2 experts, each split in 2: 2 layers × 2 × 3·h·f_e / 2 parameters
    cfg = ddlsim.load_config(plan(tp=1, etp=2, ep=4))
    w = ddlsim.build_workload(cfg)
    assert w.groups["etp"].size == 2
    names = {(p.op, p.group) for p in colls(w)}
    assert {("all_gather", "etp"), ("reduce_scatter", "etp")} <= names
    from ddlsim.workloads.decoder.builder import StageBuilder
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    assert b.stage_expert_params(0) == 2 * 2 * 3 * H * F_E / 2


def test_context_parallel_with_moe_runs_on_both_engines():
    cfg = ddlsim.load_config(plan(tp=1, cp=2, ep=8))
    w = ddlsim.build_workload(cfg)
    kinds = {p.group for p in colls(w)}
    assert "ep" in kinds
    # T = b·s/cp tokens per rank: 2048 × k × h × 2 bytes
    assert {p.bytes for p in colls(w) if p.op == "all_to_all"} == {2048 * K * H * 2}
    r_a = ddlsim.predict(cfg, "analytical", check_fit=False)
    r_d = ddlsim.predict(cfg, "des", check_fit=False)
    assert r_a.iteration_time_s > 0 and r_d.iteration_time_s > 0


def test_a_hot_expert_rank_sets_the_time_and_a_capacity_caps_it():
    base = ddlsim.predict(ddlsim.load_config(plan()), check_fit=False).iteration_time_s
    hot_cfg = ddlsim.load_config(plan(router_imbalance=2.0))
    hot = ddlsim.predict(hot_cfg, check_fit=False).iteration_time_s
    assert hot > base
    split = {p.split_bytes for p in colls(ddlsim.build_workload(hot_cfg)) if p.op == "all_to_all"}
    total = 2048 * K * H * 2
    assert (2 * total / 8, *([total * 6 / 7 / 8] * 7)) in split
    capped = ddlsim.load_config(plan(router_imbalance=2.0), ["model.capacity_factor=1.25"])
    t_cap = ddlsim.predict(capped, check_fit=False).iteration_time_s
    assert base < t_cap < hot


def test_allgather_dispatcher_gathers_over_tp_ep():
    cfg = ddlsim.load_config(plan(token_dispatcher_type="allgather"))
    w = ddlsim.build_workload(cfg)
    got = {(p.op, p.group, p.bytes) for p in colls(w) if p.group == "tp_ep"}
    # all 8 ranks' T·h: 8 × 2048 × h × 2 bytes
    assert ("all_gather", "tp_ep", 8 * 2048 * H * 2) in got
    assert ("reduce_scatter", "tp_ep", 8 * 2048 * H * 2) in got


def test_grouped_gemm_is_one_launch_of_all_local_experts():
    cfg = ddlsim.load_config(plan(tp=1, ep=2, grouped_gemm=True))
    fwd = ddlsim.build_workload(cfg).classes[0].program.blocks["F0"].flat.ops
    fc1 = next(o.payload for o in fwd if o.payload.name == "fwd.experts.fc1")
    assert len(fc1.kernels) == 1 and fc1.kernels[0].batch == E // 2
    cfg = ddlsim.load_config(plan(tp=1, ep=2, grouped_gemm=False))
    fwd = ddlsim.build_workload(cfg).classes[0].program.blocks["F0"].flat.ops
    fc1 = next(o.payload for o in fwd if o.payload.name == "fwd.experts.fc1")
    assert len(fc1.kernels) == E // 2 and fc1.kernels[0].batch == 1


def test_moe_options_on_a_dense_model_are_refused():
    with pytest.raises(ConfigError, match="parallel.moe"):
        ddlsim.load_config({"model": "gpt3-1.3b", "parallel": {"moe": {"grouped_gemm": True}},
                            "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                      "seq_length": 2048},
                            "system": {"preset": "dgx-h100", "nodes": 1}})


def test_shared_experts_beside_the_dispatch_when_overlapped():
    # one shared expert (f_e wide) on Mixtral cut to 2 layers: with shared_expert_overlap its
    # GEMMs run while the dispatch all-to-all is on the ep stream, so the iteration is shorter
    def cfg(overlap: bool):
        c = plan(shared_expert_overlap=overlap)
        c["model"]["n_shared_experts"] = 1
        return ddlsim.load_config(c)
    on, off = cfg(True), cfg(False)
    body = ddlsim.build_workload(on).classes[0].program.blocks["F0"].flat.ops
    assert any(o.stream == "ep" and isinstance(o.payload, Collective) for o in body)
    t_on = ddlsim.predict(on, check_fit=False).iteration_time_s
    t_off = ddlsim.predict(off, check_fit=False).iteration_time_s
    assert t_on < t_off
    with pytest.raises(ConfigError, match="shared_expert_overlap = true needs shared experts"):
        ddlsim.load_config(plan(shared_expert_overlap=True))

"""Megatron-Core's selective recomputation by module (``train.recompute_modules``,
``ddlsim/workloads/decoder/recompute_modules.py``): what each module frees and what its
backward runs again, in both engines; the names checked against the registry; stacks without
the option refuse it."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder.recompute_modules import RECOMPUTE_MODULES

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def moe_run(modules=None, stack: str = "megatron-core-2025", **train) -> dict:
    """Qwen3-30B-A3B cut to two layers, EP8 and TP2 with SP on one DGX H100, BF16."""
    rec = ({"recompute": "selective", "recompute_modules": list(modules)}
           if modules is not None else {"recompute": "none"})
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                         "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": True, "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
                      **rec, **train},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def dense_run(modules=None) -> dict:
    """Llama-2 7B cut to two layers on one GPU of a DGX H100 (TP 1)."""
    rec = ({"recompute": "selective", "recompute_modules": list(modules)}
           if modules is not None else {"recompute": "none"})
    return {"model": {"preset": "llama-2-7b", "num_hidden_layers": 2},
            "parallel": {},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 4096,
                      **rec},
            "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def _predict(cfg: dict, engine: str = "analytical"):
    return ddlsim.predict(cfg, engine=engine, check_fit=False)


@pytest.mark.parametrize("modules", [["moe_act"], ["layernorm"], ["moe_act", "layernorm"]])
def test_a_recomputed_moe_module_frees_memory_and_costs_time(modules):
    base, rec = _predict(moe_run()), _predict(moe_run(modules))
    assert rec.memory.activations < base.memory.activations
    assert rec.iteration_time_s > base.iteration_time_s


def test_what_moe_act_and_layernorm_free_is_their_outputs():
    """Per MoE layer and rank (TP2 with SP, bf16): moe_act frees fc2's input, 2·sb·k·f_e/t;
    layernorm the pre-MLP norm's output, 2·sb·h/t (the input norm is fused into QKV)."""
    cfg = ddlsim.load_config(moe_run())
    sh = cfg.model.shape()
    s, t = 4096, 2
    from ddlsim.workloads.decoder.recompute_modules import layer_bytes
    sw = cfg.software
    none = sh.layer_activation_bytes(1, s, t, True, "none", moe=True, flash=True)
    act = layer_bytes(sh, ("moe_act",), sw, 1, s, t, True, moe=True, flash=True)
    norm = layer_bytes(sh, ("layernorm",), sw, 1, s, t, True, moe=True, flash=True)
    assert none - act == pytest.approx(2 * s * sh.top_k * sh.f_e / t)
    assert none - norm == pytest.approx(2 * s * sh.hidden / t)


def test_mlp_recomputation_of_a_dense_model_frees_memory_and_costs_time():
    base, rec = _predict(dense_run()), _predict(dense_run(["mlp"]))
    assert rec.memory.activations < base.memory.activations
    assert rec.iteration_time_s > base.iteration_time_s


def test_the_event_driven_engine_sees_the_same_recomputation():
    base, rec = _predict(moe_run(), "des"), _predict(moe_run(["moe_act", "layernorm"]), "des")
    assert rec.iteration_time_s > base.iteration_time_s
    ana = _predict(moe_run(["moe_act", "layernorm"]))
    assert rec.iteration_time_s == pytest.approx(ana.iteration_time_s, rel=0.05)


def test_core_attn_alone_is_the_stacks_selective_recomputation_bit_for_bit():
    plain = moe_run()
    plain["train"]["recompute"] = "selective"
    a, b = _predict(plain), _predict(moe_run(["core_attn"]))
    assert a.iteration_time_s == b.iteration_time_s
    assert a.memory.total == b.memory.total


def test_an_unknown_module_is_refused_naming_the_allowed_ones():
    with pytest.raises(ConfigError) as e:
        ddlsim.load_config(moe_run(["moe_actt"]))
    msg = str(e.value)
    assert "recompute_modules" in msg and "moe_actt" in msg
    assert all(name in msg for name in RECOMPUTE_MODULES)


def test_modules_need_selective_recomputation():
    cfg = moe_run(["moe_act"])
    cfg["train"]["recompute"] = "full"
    with pytest.raises(ConfigError, match="needs recompute = 'selective'"):
        ddlsim.load_config(cfg)


@pytest.mark.parametrize("stack", ["megatron-core-2024", "torchtitan-2025"])
def test_stacks_without_the_option_refuse_it(stack):
    cfg = dense_run(["core_attn"])
    cfg["system"]["software"]["stack"] = stack
    with pytest.raises(ConfigError, match="no_recompute_modules"):
        ddlsim.load_config(cfg)


def test_delayed_fp8_refuses_norm_and_act_recomputation():
    cfg = moe_run(["moe_act"], dtype="fp8")
    with pytest.raises(ConfigError, match="recompute_norm_act_not_delayed_fp8"):
        ddlsim.load_config(cfg)


@pytest.mark.parametrize("modules, match", [
    (["moe_act"], "no Mixture-of-Experts layers"),
    (["layernorm"], "fused into the next GEMM"),
    (["moe"], "no Mixture-of-Experts layers"),
    (["mla_up_proj"], "needs Multi-head Latent Attention"),
])
def test_a_module_with_nothing_to_recompute_is_refused(modules, match):
    with pytest.raises(ConfigError, match=match):
        _predict(dense_run(modules))


def _tp2(modules, sp: bool) -> dict:
    cfg = dense_run(modules)
    cfg["system"]["devices_per_node"] = 2
    cfg["parallel"] = {"tensor_model_parallel_size": 2, "sequence_parallel": sp}
    return cfg


@pytest.mark.parametrize("sp, names", [
    (True, ["recompute.mlp.rs", "recompute.mlp.ag"]),    # fc2's reduce-scatter, fc1's gather
    (False, ["recompute.mlp.ar"])])                      # fc2's all-reduce
def test_mlp_under_tensor_parallelism_runs_its_collectives_again(sp, names, monkeypatch):
    """Refused until 2026-11-30 ('tensor_model_parallel_size 1 only'): Megatron-Core's
    checkpointed MLP runs its linears' TP collectives again in the backward
    (decoder/recompute_comms.py): the dense layer's MLP pair, after the recomputation op,
    and it costs time in both engines."""
    from ddlsim.workloads.decoder.builder import StageBuilder
    cfg = ddlsim.load_config(_tp2(["mlp"], sp))
    bwd = StageBuilder.from_config(cfg, cfg.model.shape()).layer_backward()
    got = [x.name for x in bwd if x.name.startswith("recompute.") and hasattr(x, "group")]
    assert [n.split(".")[0] + "." + n.split(".")[1] + "." + n.split(".")[-1] for n in got] \
        == names
    assert all(x.group == "tp" for x in bwd if x.name in got)
    with_them = {e: _predict(_tp2(["mlp"], sp), e).iteration_time_s
                 for e in ("analytical", "des")}
    from ddlsim.workloads.decoder import recompute_comms
    monkeypatch.setattr(recompute_comms, "module_collectives", lambda b, moe: [])
    for engine, t in with_them.items():
        assert t > _predict(_tp2(["mlp"], sp), engine).iteration_time_s


def test_mla_up_proj_and_shared_experts_at_tp2_run_their_gathers_again():
    """DeepSeek-V2-Lite (no query LoRA: the up projection of the query reads the hidden
    states; kv_lora_rank 512; two shared experts) at TP 2 with sequence parallelism: the
    recomputed up projections gather their sequence-sharded inputs again, b·s·h and b·s·512
    elements, and the recomputed shared experts their own gather and reduce-scatter of the
    b·s·h hidden states."""
    from ddlsim.workloads.decoder.builder import StageBuilder
    data = moe_run(["mla_up_proj", "shared_experts"])
    data["model"] = {"preset": "deepseek-v2-lite", "num_hidden_layers": 2}
    cfg = ddlsim.load_config(data)
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    ops = [o.payload for o in b.moe_layer_body(True)]
    got = {x.name: x.bytes for x in ops if x.name.startswith("recompute.")
           and hasattr(x, "group")}
    hidden = 4096 * 2048 * 2.0
    assert got == {"recompute.mla_up_proj.q.ag": hidden,
                   "recompute.mla_up_proj.kv.ag": 4096 * 512 * 2.0,
                   "recompute.shared.ag": hidden, "recompute.shared.rs": hidden}


def test_the_plan_line_and_the_json_name_the_modules():
    from ddlsim.planinfo import plan_fields
    cfg = ddlsim.load_config(moe_run(["moe_act", "layernorm"]))
    assert "recompute selective (moe_act, layernorm)" in cfg.family.plan_summary(cfg)
    assert plan_fields(cfg)["recompute_modules"] == ["moe_act", "layernorm"]
    plain = ddlsim.load_config(moe_run())
    assert "recompute_modules" not in plan_fields(plain)


def test_the_moe_module_recomputes_the_block_with_its_all_to_alls():
    """``moe`` frees the MoE block's tensors (more than moe_act, which it contains) and its
    backward opens with the block's forward again, dispatch and combine included."""
    base, act, moe = (_predict(moe_run(m)) for m in (None, ["moe_act"], ["moe"]))
    assert moe.memory.activations < act.memory.activations < base.memory.activations
    assert moe.iteration_time_s > act.iteration_time_s > base.iteration_time_s
    both = _predict(moe_run(["moe", "moe_act"]))     # moe_act inside moe adds nothing
    assert both.memory.activations == moe.memory.activations
    assert both.iteration_time_s == moe.iteration_time_s
    w = ddlsim.build_workload(ddlsim.load_config(moe_run(["moe"])))
    names = []
    for block in w.classes[0].program.blocks.values():
        for o in block.flat.ops:
            names.append((o.payload.name, getattr(o.payload, "op", None)))
    assert any(n.startswith("recompute.") and op == "all_to_all" for n, op in names)
    des = _predict(moe_run(["moe"]), "des")
    assert des.iteration_time_s == pytest.approx(moe.iteration_time_s, rel=0.05)


def test_the_moe_module_under_the_combined_1f1b_is_refused_as_megatron_core_refuses_it():
    """Megatron-LM d7288711 transformer_config.py asserts 'moe' out of recompute_modules
    under the expert-parallel overlap: a rule of the stack, named as one."""
    cfg = moe_run(["moe"])
    cfg["parallel"]["moe"].update(overlap_expert_parallel_comm=True, delay_wgrad_compute=True)
    with pytest.raises(ConfigError, match="Megatron-Core cannot recompute 'moe'.*lines "
                                          "2109-2111"):
        _predict(cfg)


def test_adding_a_module_never_makes_the_backward_shorter():
    """core_attn keeps the selective op in MoE layers; the others add their own op."""
    core = _predict(moe_run(["core_attn"]))
    more = _predict(moe_run(["core_attn", "moe_act", "layernorm"]))
    assert more.iteration_time_s > core.iteration_time_s
    assert more.memory.activations < core.memory.activations


def test_mla_up_proj_frees_the_query_key_and_value_and_reruns_the_up_projections():
    """DeepSeek-V3 cut to two layers (its first dense, the second MoE), TP 1, EP 8."""
    def run(modules=None):
        cfg = moe_run(modules)
        cfg["model"] = {"preset": "deepseek-v3", "num_hidden_layers": 2,
                        "first_k_dense_replace": 1}
        cfg["parallel"].update(tensor_model_parallel_size=1, sequence_parallel=False,
                               expert_model_parallel_size=8)
        return cfg
    base, rec = _predict(run()), _predict(run(["mla_up_proj"]))
    assert rec.memory.activations < base.memory.activations
    assert rec.iteration_time_s > base.iteration_time_s
    cfg = ddlsim.load_config(run())
    sh = cfg.model.shape()
    from ddlsim.workloads.decoder.recompute_modules import layer_bytes
    none = sh.layer_activation_bytes(1, 4096, 1, False, "none", moe=False, flash=True)
    up = layer_bytes(sh, ("mla_up_proj",), cfg.software, 1, 4096, 1, False, moe=False,
                     flash=True)
    assert none - up == pytest.approx(2 * 4096 * (2 * sh.q_width + sh.kv_width))


def test_shared_experts_without_shared_experts_is_refused():
    with pytest.raises(ConfigError, match="no shared experts"):
        _predict(moe_run(["shared_experts"]))


def test_a_grid_with_recompute_modules_is_searched_by_the_exact_tier():
    """The vectorised tier times the stack's selective recomputation only: such a grid is
    searched plan by plan, its figures ddlsim.predict's."""
    cfg = dense_run(["mlp"])
    cfg["search"] = {"axes": {"train.micro_batch_size": [1, 2]}}
    from exacttier import assert_searched_by_the_exact_tier
    assert_searched_by_the_exact_tier(cfg, _predict)


def test_megatron_core_2025_refuses_its_torch_fsdp2_with_expert_parallelism():
    cfg = moe_run()
    cfg["parallel"].update(zero_stage=3)
    with pytest.raises(ConfigError, match="zero3_no_expert_parallel"):
        ddlsim.load_config(cfg)


def test_core_attn_beside_other_modules_under_the_combined_1f1b_is_modelled():
    """Refused until 2026-11-30 ('not modelled: the combined 1F1B's layer nodes carry one
    recompute op'): the attention node now carries the attention core's op and the other
    modules' op beside it, as the layer's backward does outside the combined schedule; it
    costs more than core_attn alone, in both engines."""
    def run(modules):
        cfg = moe_run(modules)
        cfg["parallel"]["moe"].update(overlap_expert_parallel_comm=True, delay_wgrad_compute=True)
        return cfg
    for engine in ("analytical", "des"):
        both = _predict(run(["core_attn", "moe_act", "layernorm"]), engine).iteration_time_s
        assert both > _predict(run(["core_attn"]), engine).iteration_time_s
    from ddlsim.workloads.decoder.builder import StageBuilder
    from ddlsim.workloads.decoder.combined_nodes import moe_layer_nodes
    cfg = ddlsim.load_config(run(["core_attn", "moe_act", "layernorm"]))
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    names = [o.payload.name for o in moe_layer_nodes(b, True, True)["attn"]]
    assert names.index("recompute.modules") == names.index("recompute.attn_core") + 1

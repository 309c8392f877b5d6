"""``train.recompute_modules`` under context parallelism (Megatron 1-D): the modules rebuilt
on the rank's ``s/cp`` tokens, in the MoE layers (the builder's ops, the recomputed MoE block
with its all-to-alls) and in the dense layers the 1-D partitioner builds (their norms); the
memory they free; both engines and the search's exact tier; what stays refused."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def moe_run(modules=None, cp: int = 2, recompute: str = "none") -> dict:
    """Qwen3-30B-A3B cut to two layers, TP2 with SP, CP ``cp``, EP4, 8k tokens, one DGX
    H100, BF16; ``modules``: ``train.recompute_modules`` (else ``recompute``)."""
    rec = ({"recompute": "selective", "recompute_modules": list(modules)}
           if modules is not None else {"recompute": recompute})
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                         "context_parallel_size": cp, "expert_model_parallel_size": 4,
                         "expert_tensor_parallel_size": 1,
                         "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                 "permute_fusion": True, "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 8192,
                      **rec},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def dense_run(modules=None, cp: int = 2, recompute: str = "none") -> dict:
    """Llama-2 7B cut to two layers, TP2 with SP, CP ``cp`` on ``2·cp`` GPUs, its norms not
    fused into the next GEMM (``kernels.fused_layernorm: false``: both norms are modules of
    their own, which ``layernorm`` recomputes)."""
    rec = ({"recompute": "selective", "recompute_modules": list(modules)}
           if modules is not None else {"recompute": recompute})
    return {"model": {"preset": "llama-2-7b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                         "context_parallel_size": cp},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 4096,
                      **rec},
            "system": {"preset": "dgx-h100", "nodes": 1, "devices_per_node": 2 * cp,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"fused_layernorm": False}}}}


def _predict(cfg: dict, engine: str = "analytical"):
    return ddlsim.predict(cfg, engine=engine, check_fit=False)


def _backward_ops(cfg: dict) -> list:
    """(name, op kind or None, bytes) of every op in the workload's blocks, each loop body
    once."""
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    out = []

    def walk(ops):
        for o in ops:
            p = o.payload
            if hasattr(p, "body"):
                walk(p.body)
            else:
                out.append((p.name, getattr(p, "op", None), getattr(p, "bytes", None)))
    for cls in w.classes:
        for block in cls.program.blocks.values():
            walk(block.flat.ops)
    return out


@pytest.mark.parametrize("run", [moe_run, dense_run], ids=["moe", "dense"])
def test_the_modules_under_cp_cost_time_between_none_and_full_and_free_memory(run):
    mods = ["layernorm", "moe"] if run is moe_run else ["layernorm"]
    none, rec, full = (_predict(run(mods if k == "mods" else None, recompute=k))
                       for k in ("none", "mods", "full"))
    assert none.iteration_time_s < rec.iteration_time_s < full.iteration_time_s
    assert rec.memory.activations < none.memory.activations


def test_the_recomputed_moe_block_under_cp_runs_its_all_to_alls_again():
    names = _backward_ops(moe_run(["layernorm", "moe"]))
    assert any(n.startswith("recompute.") and op == "all_to_all" for n, op, _ in names)
    assert any(n == "recompute.modules" for n, _, _ in names)


@pytest.mark.parametrize("run,mods", [(moe_run, ["layernorm"]), (dense_run, ["layernorm"]),
                                      (moe_run, ["layernorm", "moe"])])
def test_what_the_modules_free_and_rerun_per_rank_is_the_cp1_layers_over_cp(run, mods):
    """A rank of CP 2 holds half the tokens of the CP 1 plan's rank: the bytes the modules
    free and the recomputed norms' traffic are half the CP 1 plan's (the CP 1 plan is the
    1-D builder's, the CP 2 one the partitioner's for dense layers)."""
    def freed(cp):
        return (_predict(run(None, cp)).memory.activations
                - _predict(run(mods, cp)).memory.activations)
    assert freed(2) == pytest.approx(freed(1) / 2, rel=1e-9)

    def norms(cp):   # one layer's op (every block holds the same)
        return max(b for n, _, b in _backward_ops(run(mods, cp)) if n == "recompute.modules")
    assert norms(1) > 0
    assert norms(2) == pytest.approx(norms(1) / 2, rel=1e-9)


def test_an_moe_layers_activations_under_cp_are_the_cp1_ranks_over_cp():
    """The rank of CP 2 keeps half the activations of the rank of CP 1 (FlashAttention: no
    ``s²`` term), whatever is recomputed (MoE layers' were counted for the whole sequence
    before)."""
    for kw in ({"recompute": "none"}, {"recompute": "full"},
               {"modules": ["layernorm", "moe"]}):
        one, two = (_predict(moe_run(cp=cp, **kw)).memory.activations for cp in (1, 2))
        assert two == pytest.approx(one / 2, rel=1e-12)


def test_the_event_driven_engine_sees_the_same_recomputation_under_cp():
    ana, des = (_predict(moe_run(["layernorm", "moe"]), e) for e in ("analytical", "des"))
    assert des.iteration_time_s == pytest.approx(ana.iteration_time_s, rel=0.05)
    assert des.memory.activations == ana.memory.activations


def test_a_cp_grid_with_recompute_modules_is_searched_by_the_exact_tier():
    cfg = moe_run(["layernorm", "moe"])
    cfg["search"] = {"axes": {"train.micro_batch_size": [1, 2]}}
    from exacttier import assert_searched_by_the_exact_tier
    assert_searched_by_the_exact_tier(cfg, _predict)


@pytest.mark.parametrize("module", ["mlp"])
def test_a_dense_mlp_under_cp_is_refused_not_approximated(module):
    cfg = dense_run([module])
    cfg["parallel"].update(tensor_model_parallel_size=1, sequence_parallel=False)
    cfg["system"]["devices_per_node"] = 2
    with pytest.raises(ConfigError, match="without context parallelism only"):
        _predict(cfg)


def test_other_tensor_parallel_schemes_stay_refused_naming_the_mode():
    cfg = dense_run(["layernorm"], cp=1)
    cfg["parallel"] = {"tensor_parallel": {"mode": "2d", "q": 2}}
    cfg["train"]["micro_batch_size"] = 2
    cfg["system"]["devices_per_node"] = 4
    with pytest.raises(ConfigError, match=r"1-D tensor parallelism, with or without context "
                                          r"parallelism \(here tensor_parallel.mode '2d'\)"):
        _predict(cfg)

"""Multi-head Latent Attention under 1-D tensor parallelism as Megatron-Core runs it
(ddlsim/workloads/decoder/partition/mla_1d.py): the down projections replicated on the rank's
own tokens, the latents gathered under sequence parallelism instead of the hidden state, and
the backward's collectives of the up projections only."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.trace import Collective, Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

S = 4096          # tokens of one micro-batch
DT = 2            # bf16


def _builder(tp: int = 2, sp: bool = True, cp: int = 1, what_if: bool = False):
    """DeepSeek-V3 cut to two layers (the first dense, the second MoE) on one DGX H100."""
    run = {"model": {"preset": "deepseek-v3", "num_hidden_layers": 2,
                     "first_k_dense_replace": 1},
           "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": sp,
                        "context_parallel_size": cp, "expert_model_parallel_size": 4,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
           "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": S},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2025", "what_if": what_if}}}
    cfg = ddlsim.load_config(run)
    return StageBuilder.from_config(cfg, cfg.model.shape())


def _payloads(ops) -> list:
    return [getattr(o, "payload", o) for o in ops]


def _collectives(ops) -> dict[str, tuple[str, float]]:
    return {c.name: (c.op, c.bytes) for c in _payloads(ops) if type(c) is Collective}


def _gemms(ops, name: str) -> list[tuple]:
    op = next(c for c in _payloads(ops) if type(c) is Compute and c.name == name)
    return [k.shape for k in op.kernels if k.kind == "gemm"]


def test_the_moe_layers_attention_gathers_its_latents_not_the_hidden_state():
    b = _builder()
    m, h = b.shape.mla, b.shape.hidden
    fwd = b.moe_layer_body(False)
    comm = _collectives(fwd)
    # three gathers of the normalised latents and the rotary key: 1,536 + 512 + 64 wide
    assert comm["fwd.q_up.q.ag"] == ("all_gather", S * m.q_lora_rank * DT)
    assert comm["fwd.kv_up.kv.ag"] == ("all_gather", S * m.kv_lora_rank * DT)
    assert comm["fwd.kv_up.k_pos.ag"] == ("all_gather", S * m.qk_rope_head_dim * DT)
    # the output projection's reduce-scatter, and no gather of h for the next layer
    assert comm["fwd.proj.rs"] == ("reduce_scatter", S * h * DT)
    assert "fwd.proj.ag" not in comm
    assert not any(name.startswith(("fwd.q_down", "fwd.kv_down")) for name in comm)
    # the down projections whole, on the rank's s/t tokens
    assert _gemms(fwd, "fwd.q_down") == [(S / 2, m.q_lora_rank, h)]
    assert _gemms(fwd, "fwd.kv_down") == [(S / 2, m.kv_lora_rank + m.qk_rope_head_dim, h)]


def test_the_moe_layers_attention_backward_has_the_up_projections_collectives_only():
    b = _builder()
    m, h = b.shape.mla, b.shape.hidden
    comm = {n: c for n, c in _collectives(b.moe_layer_body(True)).items()
            if n.startswith(("bwd.q_", "bwd.kv_", "bwd.proj"))}
    assert comm == {
        "bwd.kv_up.kv.ag.input": ("all_gather", S * m.kv_lora_rank * DT),
        "bwd.kv_up.kv.rs": ("reduce_scatter", S * m.kv_lora_rank * DT),
        "bwd.kv_up.k_pos.rs": ("reduce_scatter", S * m.qk_rope_head_dim * DT),
        "bwd.q_up.q.ag.input": ("all_gather", S * m.q_lora_rank * DT),
        "bwd.q_up.q.rs": ("reduce_scatter", S * m.q_lora_rank * DT),
        "bwd.q_up.ag": ("all_gather", S * h * DT),    # proj's output gradient
    }


def test_the_dense_layer_gathers_the_latents_before_its_attention():
    b = _builder()
    m, h = b.shape.mla, b.shape.hidden
    fwd = b.layer_forward(moe=False)
    names = [p.name for p in fwd]
    assert names[:3] == ["fwd.attn.q.ag", "fwd.attn.kv.ag", "fwd.attn.k_pos.ag"]
    comm = _collectives(fwd)
    assert comm["fwd.attn.ag"] == ("all_gather", S * h * DT)       # into the MLP
    assert "fwd.mlp.ag" not in comm                                 # the next layer's own
    bwd = _collectives(b.layer_backward(moe=False))
    assert {n for n in bwd if n.startswith("bwd.attn")} == {
        "bwd.attn.kv.ag.input", "bwd.attn.kv.rs", "bwd.attn.k_pos.rs",
        "bwd.attn.q.ag.input", "bwd.attn.q.rs", "bwd.attn.ag"}
    # the fused op's kernels: the down projections on s/t rows
    assert (S / 2, m.q_lora_rank, h) in _gemms(fwd, "fwd.attn")


def test_the_down_projections_flops_on_the_ranks_tokens():
    """Under SP a t-th of the down projections (each rank its own tokens); without it all of
    them on every rank (a what-if: Megatron-Core refuses MoE with TP and no SP)."""
    for sp in (True, False):
        b = _builder(sp=sp, what_if=not sp)
        g = b.shape.layer_gemm_flops(b.b, b.s, moe=False)
        total = g["q"] + g["kv"] + g["attn_core"] + g["proj"]
        down = 2.0 * S * b.shape.mla.down_params(b.shape.hidden)
        attn = next(p for p in b.layer_forward(moe=False) if p.name == "fwd.attn")
        want = total / 2 if sp else (total - down) / 2 + down
        assert attn.flops == pytest.approx(want, rel=1e-12)


def test_without_sequence_parallelism_the_latents_gradients_are_all_reduced():
    b = _builder(sp=False, what_if=True)
    m = b.shape.mla
    assert not any(isinstance(p, Collective) and p.op == "all_gather"
                   for p in b.moe_layer_body(False))
    comm = {n: c for n, c in _collectives(b.layer_backward(moe=False)).items()
            if n.startswith("bwd.attn")}
    assert comm == {"bwd.attn.kv.ar": ("all_reduce", S * m.kv_lora_rank * DT),
                    "bwd.attn.q.ar": ("all_reduce", S * m.q_lora_rank * DT)}
    moe = _collectives(b.moe_layer_body(True))
    assert {n for n in moe if n.startswith(("bwd.q_", "bwd.kv_"))} == {"bwd.kv_up.ar",
                                                                      "bwd.q_up.ar"}


def test_context_parallelism_builds_the_same_attention_collectives():
    """The partitioner's template (CP > 1) strings the same GEMMs: latents gathered, no
    collective of the down projections, no gather of h after the layer's last linear."""
    b = _builder(cp=2)
    comm = _collectives(b.moe_layer_body(False))
    assert {"fwd.q_up.q.ag", "fwd.kv_up.kv.ag", "fwd.kv_up.k_pos.ag"} <= set(comm)
    assert "fwd.proj.ag" not in comm


def test_a_standard_attention_is_unchanged():
    """Llama's layer still gathers h after each row-parallel linear (the next one's input)."""
    cfg = ddlsim.load_config({"model": "llama-2-7b", "parallel": {
        "tensor_model_parallel_size": 2, "sequence_parallel": True},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": S},
        "system": {"preset": "dgx-h100", "nodes": 1}})
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    comm = _collectives(b.layer_forward())
    assert comm["fwd.mlp.ag"] == ("all_gather", S * 4096 * DT)
    assert comm["fwd.attn.ag"] == ("all_gather", S * 4096 * DT)


def test_tp2_mla_plans_agree_between_the_engines():
    """The DES times the new collectives as the analytical engine does (one MoE stage)."""
    run = {"model": {"preset": "deepseek-v3", "num_hidden_layers": 2,
                     "first_k_dense_replace": 1},
           "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                        "expert_model_parallel_size": 4,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
           "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": S},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2025"}}}
    cfg = ddlsim.load_config(run)
    a = ddlsim.predict(cfg).iteration_time_s
    d = ddlsim.predict(cfg, engine="des").iteration_time_s
    assert d == pytest.approx(a, rel=0.02)


def test_every_tp_rank_holds_the_down_projections_whole():
    """Weights, gradients and optimizer state count MLA's down projections whole on each TP
    rank (dense and MoE layers), the rest of the layer a t-th; at TP 1 nothing changes."""
    sh = _builder(tp=1, sp=False).shape
    down = sh.mla.down_params(sh.hidden)
    assert down == 7168 * (1536 + 512 + 64)
    experts = sh.experts * sh.mlp_params(sh.f_e)
    for tp in (1, 2):
        b = _builder(tp=tp, sp=tp > 1)
        rest = {False: sh.dense_layer_params - down, True: sh.moe_layer_params - experts - down}
        for moe in (False, True):
            assert b.layer_rank_params(moe)[0] == pytest.approx(rest[moe] / tp + down,
                                                                rel=1e-12)
    assert sh.tp_rank_params(1000.0, 4) == pytest.approx((1000.0 - down) / 4 + down)


def test_a_dense_mla_grid_is_searched_by_the_exact_engine():
    """The vectorised tier's parameter terms split every weight by TP, so a dense MLA model's
    grid goes to the exact engine as a whole (its plans' memory then counts the down
    projections whole)."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    data = {"model": {"architecture": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
                      "intermediate_size": 2816, "num_attention_heads": 16,
                      "vocab_size": 32000, "q_lora_rank": 384, "kv_lora_rank": 256,
                      "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64},
            "parallel": {}, "train": {"micro_batch_size": 1, "global_batch_size": 16,
                                      "seq_length": 1024},
            # MLA: megatron-core-2024 (900f1b76) has none (no_mla)
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}
    grid = evaluate_grid(data, None, [], {"parallel.tensor_model_parallel_size": [1, 2],
                                          "parallel.sequence_parallel": [False, True]},
                         Constraints())
    assert grid.frame.attrs["tier"] == "exact" and len(grid.frame) == 3
    cfg = ddlsim.load_config({**data, "parallel": {"tensor_model_parallel_size": 2,
                                                   "sequence_parallel": True}})
    row = grid.frame[(grid.frame["parallel.tensor_model_parallel_size"] == 2)
                     & grid.frame["parallel.sequence_parallel"]].iloc[0]
    assert row["iteration_time_s"] == pytest.approx(ddlsim.predict(cfg).iteration_time_s,
                                                    rel=1e-9)


@pytest.mark.parametrize("cp", [1, 2])
def test_the_output_layer_gathers_the_final_norms_output(cp):
    """The last layer gathers no h for what follows it, so the output layer (column-parallel
    under SP) gathers the final norm's output itself, as a standard model's last layer did
    for it; a standard model's head gathers nothing (unchanged)."""
    b = _builder(cp=cp)
    names = [p.name for p in _payloads(b.head_forward())]
    comm = _collectives(b.head_forward())
    assert names[1] == "head.ag" and names.index("head.ag") < names.index("logits")
    assert comm["head.ag"] == ("all_gather", S / cp * b.shape.hidden * DT)
    cfg = ddlsim.load_config({"model": "llama-2-7b", "parallel": {
        "tensor_model_parallel_size": 2, "sequence_parallel": True},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": S},
        "system": {"preset": "dgx-h100", "nodes": 1}})
    std = StageBuilder.from_config(cfg, cfg.model.shape())
    assert "head.ag" not in _collectives(std.head_forward())

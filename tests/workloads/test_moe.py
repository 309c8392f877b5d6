"""Mixture-of-Experts end to end: parameter counts as printed, all-to-all bytes per MoE layer,
expert gradients on the expert-data-parallel group, memory by EP, ZeRO per group, refusals.

Every pinned number is derived in its comment (notation of
``ddlsim/workloads/models/decoder.py``: ``h`` hidden, ``f_e`` expert FFN, ``E`` experts,
``k`` top-k), not copied from a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.errors import ConfigError
from ddlsim.workloads.trace import Collective

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

H, F_E, E, K = 4096, 14336, 8, 2          # Mixtral 8x7B (its config.json)
SEQ, MB = 4096, 1


def mixtral(layers: int = 4, ep: int = 8, tp: int = 1, pp: int = 1, nodes: int = 2,
            **model) -> dict:
    """Mixtral 8x7B shortened to ``layers`` layers on ``nodes`` DGX H100s (DP = 8·nodes/(TP·PP))."""
    return {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": layers, **model},
            "parallel": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                         "expert_model_parallel_size": ep, "sequence_parallel": tp > 1,
                         "moe": {"token_dispatcher_type": "alltoall"}},
            "train": {"micro_batch_size": MB, "global_batch_size": 32, "seq_length": SEQ,
                      "recompute": "full"},
            "system": {"preset": "dgx-h100", "nodes": nodes}}


def collectives(workload, op: str | None = None):
    """Every collective of every block of every class: (class, block, op wrapper, payload)."""
    for c in workload.classes:
        for bname, block in c.program.blocks.items():
            for o in block.flat.ops:
                if isinstance(o.payload, Collective) and (op is None or o.payload.op == op):
                    yield c, bname, o, o.payload


# ---------------------------------------------------------------- parameter counts
def test_mixtral_8x7b_parameters_as_printed(tmp_path):
    # per layer: attention 2h² + 2h·(8·128) = 41,943,040; norms 2h = 8,192; router h·E = 32,768;
    # experts E · 3·h·f_e = 8 × 176,160,768 = 1,409,286,144 → 1,451,270,144; × 32 layers =
    # 46,440,644,608; + embeddings and untied head 2·V·h = 262,144,000 + final norm 4,096
    # = 46,702,792,704
    path = tmp_path / "run.json"
    path.write_text(json.dumps(mixtral(layers=32, pp=4, nodes=4)))
    r = runner.invoke(app, ["predict", str(path), "-f", "json", "--allow-oom"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parameter_count"] == 46_702_792_704
    # active: 6 of the 8 experts per layer untouched: 46,702,792,704 − 32·6·176,160,768
    # = 12,879,925,248 ≈ 12.9 B (Jiang et al. 2024: "13B active parameters")
    sh = ddlsim.load_config(mixtral(layers=32, pp=4, nodes=4)).model.shape()
    assert sh.active_params == 46_702_792_704 - 32 * 6 * 3 * H * F_E == 12_879_925_248


# ---------------------------------------------------------------- the trace
@pytest.mark.parametrize("cf, pad", [(None, False), (1.25, False), (1.25, True)])
def test_all_to_all_bytes_per_moe_layer(cf, pad):
    # tokens of one micro-batch × top-k × hidden × 2 bytes (bf16): 1·4096 × 2 × 4096 × 2 =
    # 67,108,864 B per dispatch and combine; a capacity factor drops tokens (balanced routing
    # drops none: the same bytes), padded to capacity every slot travels (× 1.25 =
    # 83,886,080 B; Megatron-Core num_out_tokens = capacity·E)
    extra = {} if cf is None else {"capacity_factor": cf}
    cfg = ddlsim.load_config(mixtral(layers=4, **extra),
                             ["parallel.moe.pad_expert_input_to_capacity=true"] if pad else [])
    w = ddlsim.build_workload(cfg)
    want = MB * SEQ * K * H * 2 * (cf if pad else 1.0)
    a2a = list(collectives(w, "all_to_all"))
    assert a2a and {p.bytes for *_, p in a2a} == {want}
    assert {p.group for *_, p in a2a} == {"ep"} and w.groups["ep"].size == 8
    # 4 per MoE layer and micro-batch: dispatch + combine forward, their gradients backward
    # (with full recomputation the forward pair runs once more before the backward)
    fwd = sum(o.repeat for _, b, o, p in a2a if b == "F0")
    bwd = sum(o.repeat for _, b, o, p in a2a if b == "B0" and not
              p.name.startswith("recompute"))
    assert (fwd, bwd) == (2 * 4, 2 * 4)


def test_expert_gemms_sized_by_the_tokens_each_expert_receives():
    # EP8 over 8 experts: one local expert receiving k·(8 ranks · b·s)/E = 2·4096 tokens,
    # forward 2 · 3 · h · f_e FLOPs per token (× 1.5 with a capacity factor of 1.5, padded:
    # Megatron-Core's pad_expert_input_to_capacity; dropping at capacity under balanced
    # routing drops nothing)
    for cf in (None, 1.5):
        extra = {} if cf is None else {"capacity_factor": cf}
        pad = [] if cf is None else ["parallel.moe.pad_expert_input_to_capacity=true"]
        w = ddlsim.build_workload(ddlsim.load_config(mixtral(**extra), pad))
        fwd = w.classes[0].program.blocks["F0"].flat.ops
        experts = sum(o.payload.flops * o.repeat for o in fwd
                      if o.payload.name.startswith("fwd.experts.")) / 4   # per layer
        assert experts == pytest.approx(
            K * 8 * MB * SEQ / E * (E // 8) * 2 * 3 * H * F_E * (cf or 1.0), rel=1e-12)


def test_expert_gradients_reduced_over_edp_dense_over_dp():
    # 16 ranks, TP2 → DP8; EP4 carved out of TP·DP = 16 with expert TP 2 → EDP = 16/(2·4) = 2
    cfg = ddlsim.load_config(mixtral(layers=4, ep=4, tp=2))
    w = ddlsim.build_workload(cfg)
    assert (w.groups["dp"].size, w.groups["ep"].size, w.groups["edp"].size) == (8, 4, 2)
    grads = [p for *_, p in collectives(w) if p.name.startswith("grad.")]
    expert = {p.group for p in grads if ".expert." in p.name}
    dense = {p.group for p in grads if ".expert." not in p.name}
    assert expert == {"edp"} and dense == {"dp"}
    # bytes per iteration: the rank's expert parameters 4 layers · (E/EP = 2) · 3·h·f_e / TP
    # as fp32 main grads (bf16 on Megatron-Core: 4 B each) go over edp; everything else over dp
    stage_expert = 4 * 2 * 3 * H * F_E / 2 * 4
    sent = sum(o.repeat * p.bytes for _, _, o, p in collectives(w)
               if p.name.startswith("grad.expert."))
    assert sent == pytest.approx(stage_expert, rel=1e-12)


def test_ep_shows_in_breakdown_and_comm_bytes(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(mixtral(layers=4)))
    r = runner.invoke(app, ["predict", str(path), "-f", "json", "--allow-oom"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # 4 MoE layers × 6 all-to-alls (2 fwd, 2 recomputed, 2 bwd) × 2 micro-batches (32 / DP16),
    # and the dispatcher's token counts gathered before each forward one (fwd, recomputed):
    # 8 EP ranks × 8 experts' int64 counts (moe_dispatch.alltoall_counts)
    assert d["comm_bytes"]["ep"] == 4 * 6 * 2 * MB * SEQ * K * H * 2 + 4 * 2 * 2 * 8 * 8 * 8
    assert d["breakdown"]["exposed_comm_s"]["ep"] > 0
    r = runner.invoke(app, ["predict", str(path), "--allow-oom"])
    assert "exposed comm: ep" in r.stdout


# ---------------------------------------------------------------- memory
def test_expert_weights_sharded_by_ep():
    # 4 layers on one stage, TP1: each rank holds E/EP experts per layer. From EP1 to EP8 the
    # weights (bf16) shrink by 4 layers · (8 − 1) experts · 3·h·f_e · 2 bytes
    m1 = ddlsim.memory_per_device(ddlsim.load_config(mixtral(ep=1)))
    m8 = ddlsim.memory_per_device(ddlsim.load_config(mixtral(ep=8)))
    assert m1.weights - m8.weights == pytest.approx(4 * 7 * 3 * H * F_E * 2, rel=1e-12)
    assert m1.optimizer / m8.optimizer == pytest.approx(m1.weights / m8.weights, rel=1e-12)


def test_zero_shards_experts_over_edp_and_dense_over_dp():
    # ZeRO-1 divides the optimizer states of dense parameters D by DP = 16 and of the rank's
    # expert parameters X by EDP = 16/8 = 2: opt1/opt0 = (D/16 + X/2) / (D + X)
    cfg0 = ddlsim.load_config(mixtral(ep=8))
    cfg1 = ddlsim.load_config(mixtral(ep=8), ["parallel.zero_stage=1"])
    from ddlsim.workloads.decoder.builder import StageBuilder
    b = StageBuilder.from_config(cfg0, cfg0.model.shape())
    X = b.stage_expert_params(0)
    D = b.stage_params(0) - X
    assert X == 4 * 3 * H * F_E            # one local expert per layer
    o0 = ddlsim.memory_per_device(cfg0).optimizer
    o1 = ddlsim.memory_per_device(cfg1).optimizer
    assert o1 / o0 == pytest.approx((D / 16 + X / 2) / (D + X), rel=1e-12)


def test_every_other_layer_moe_counts_half_the_layers():
    # GPT-3 1.3B with 8 experts, top-1, every 2nd layer: 24 layers → 12 MoE layers; the trace's
    # dispatch all-to-all runs 12 times per micro-batch forward
    cfg = ddlsim.load_config({
        "model": {"preset": "gpt3-1.3b", "num_local_experts": 8, "num_experts_per_tok": 1,
                  "decoder_sparse_step": 2},
        "parallel": {"expert_model_parallel_size": 8,
                     "moe": {"token_dispatcher_type": "alltoall"}},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
        "system": {"preset": "dgx-h100", "nodes": 1}})
    w = ddlsim.build_workload(cfg)
    disp = [o for _, b, o, p in collectives(w, "all_to_all") if b == "F0"
            and p.name == "fwd.dispatch"]
    assert sum(o.repeat for o in disp) == 12


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("change, match", [
    (["parallel.expert_model_parallel_size=3"], r"does not divide model.num_local_experts = 8"),
    (["system.nodes=1", "parallel.tensor_model_parallel_size=2",
      "parallel.expert_model_parallel_size=8"],
     r"expert_tensor_parallel_size = 8 × 2 = 16 must divide the ranks of one pipeline stage"),
    (["system.nodes=1", "parallel.tensor_model_parallel_size=2",
      "parallel.expert_model_parallel_size=8", "parallel.expert_tensor_parallel_size=1"],
     r"megatron-core-2024' cannot run expert parallelism that does not divide data"),
    (["parallel.moe.router_imbalance=1.5", "parallel.moe.router_force_load_balancing=true"],
     r"router_force_load_balancing = true"),
    (["parallel.moe.pad_expert_input_to_capacity=true"], r"needs a capacity factor"),
    (["parallel.expert_tensor_parallel_size=3"], r"does not divide the expert FFN size 14336"),
    (["model.num_experts_per_tok=9"], r"num_experts_per_tok = 9"),
    (["parallel.dp_strategy=reduce_broadcast"], r"dp_strategy = 'reduce_broadcast'"),
])
def test_bad_expert_plans_are_refused_in_one_paragraph(change, match):
    with pytest.raises(ConfigError, match=match) as exc:
        ddlsim.load_config(mixtral(), change)
    assert "\n" not in str(exc.value)


def test_expert_parallelism_on_a_dense_model_is_refused():
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size = 2 needs a "
                                          r"Mixture-of-Experts model"):
        ddlsim.load_config({"model": "gpt3-1.3b", "parallel": {"expert_model_parallel_size": 2},
                            "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                      "seq_length": 2048},
                            "system": {"preset": "dgx-h100", "nodes": 1}})


def test_moe_fields_on_a_dense_model_are_refused():
    with pytest.raises(ConfigError, match=r"num_local_experts is 0"):
        ddlsim.load_config({"model": {"preset": "gpt3-1.3b", "num_experts_per_tok": 2},
                            "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                      "seq_length": 2048},
                            "system": {"preset": "dgx-h100", "nodes": 1}})


# ---------------------------------------------------------------- presets
def _params(preset: str) -> int:
    from ddlsim.workloads.registry import validate_model
    from ddlsim.config import resolve_section
    return validate_model(resolve_section("model", preset)).shape().params


def _mlp(h: int, f: int) -> int:      # GeLU MLP with biases: 2hf + f + h
    return 2 * h * f + f + h


def test_moe_presets_against_their_dense_bases():
    # DeepSpeed-MoE 1.3B+MoE-128: GPT-3 XL with 12 of 24 MLPs replaced by 128 experts and a
    # router h·128: + 12 · (127 · MLP + 128h) ≈ 52 B (Rajbhandari et al. 2022, Table 1: 52 B)
    h = 2048
    ds = _params("gpt3-1.3b") + 12 * (127 * _mlp(h, 4 * h) + 128 * h)
    assert _params("deepspeed-moe-1.3b-128e") == ds and abs(ds / 52e9 - 1) < 0.02
    # GPT-3 MoE of the proxies: every MLP of GPT-3 175B becomes 16 experts of 4h/16 plus a
    # router 16h
    h = 12288
    g = _params("gpt3-175b") + 96 * (16 * _mlp(h, 3072) + 16 * h - _mlp(h, 4 * h))
    assert _params("gpt3-moe-16e") == g
    # Mixtral 8x22B (its config.json): 56 layers, h 6144, 48 heads / 8 KV of 128, f_e 16384,
    # V 32000: 56 · (2h² + 2h·1024 + 2h + 8h + 8 · 3h·16384) + 2Vh + h
    h = 6144
    layer = 2 * h * h + 2 * h * 1024 + 2 * h + 8 * h + 8 * 3 * h * 16384
    assert _params("mixtral-8x22b") == 56 * layer + 2 * 32000 * h + h == 140_620_634_112


def test_qwen2_moe_config_json_predicts_with_its_shared_expert(tmp_path):
    # Qwen1.5-MoE-A2.7B's published shape (tests/workloads/test_decoder.py derives its
    # 14,315,784,192 parameters): 60 experts, top-4, one gated shared expert of 5632, EP4
    doc = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
           "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
           "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
           "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
           "max_position_embeddings": 8192, "decoder_sparse_step": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    cfg = ddlsim.load_config({"model": {"hf_config": str(path)},
                              "parallel": {"expert_model_parallel_size": 4},
                              "train": {"micro_batch_size": 1, "global_batch_size": 16,
                                        "seq_length": 2048},
                              # shared experts: megatron-core-2024 (900f1b76) has none
                              "system": {"preset": "dgx-h100", "nodes": 1,
                                         "software": {"stack": "megatron-core-2025"}}})
    assert cfg.model.n_shared_experts == 1 and cfg.model.shared_expert_gate
    r = ddlsim.predict(cfg, check_fit=False).to_dict()
    assert r["parameter_count"] == 14_315_784_192
    # shared expert: a dense MLP of 5632 on every token, forward 2·3·b·s·h·5632 FLOPs (TP1)
    fwd = ddlsim.build_workload(cfg).classes[0].program.blocks["F0"].flat.ops
    shared = sum(o.payload.flops * o.repeat for o in fwd
                 if o.payload.name.startswith("fwd.shared.")) / 24   # per layer
    assert shared == pytest.approx(2 * 3 * 2048 * 2048 * 5632, rel=1e-12)

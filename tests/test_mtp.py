"""Multi-token prediction (``model.mtp_num_layers``, ddlsim/workloads/decoder/mtp.py): each
depth's layer, projection, head and loss on the last stage, its parameters, and the model
FLOPs as Megatron's ``num_floating_point_operations`` counts them."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.workloads.decoder.split import chunk_layers

#: DeepSeek-V3 cut to 8 layers (3 dense, then MoE) on 2 nodes: TP 2, PP 2 × VPP 2, EP 8
BASE = {"model": {"preset": "deepseek-v3", "num_hidden_layers": 8},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                     "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2,
                     "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
                     "sequence_parallel": True,
                     "zero_stage": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2025"}}


def config(mtp: int, **parallel):
    d = copy.deepcopy(BASE)
    d["model"]["mtp_num_layers"] = mtp
    d["parallel"].update(parallel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def _ops(cfg, block: str, stage: int = -1) -> list:
    program = ddlsim.build_workload(cfg).classes[stage].program
    return [op.payload for op in program.blocks[block].flat.ops]


def test_depth_layer_is_one_more_layer_of_the_last_chunk():
    """Megatron-Core builds the MTP layer on the last stage (its last chunk); the layout's
    'm' puts it there too."""
    assert chunk_layers(config(0)) == ((2, 2), (2, 2))
    assert chunk_layers(config(1)) == ((2, 2), (2, 3))
    lay = config(1, pipeline_model_parallel_layout="Ett|ttt|tt|tmL")
    assert chunk_layers(lay) == ((2, 2), (3, 2))   # 'Ett' 'tt' on stage 0, 'ttt' 'tmL' on 1


def test_model_flops_are_megatrons():
    """Per depth: 3 × (one MoE layer's forward, 2·(3h + 2h²) per token, 2·h·V per token),
    by hand from Megatron's num_floating_point_operations (d98e8a64 training.py lines
    1042-1046, 1288-1303)."""
    cfg0, cfg1 = config(0), config(1)
    sh, B, s = cfg0.model.shape(), 16, 1024
    h, V = sh.hidden, sh.vocab
    layer = sh.layer_forward_flops(1, s, moe=True)
    by_hand = 3 * B * (layer + 2 * s * (3 * h + 2 * h * h) + 2 * s * h * V)
    f0 = ddlsim.build_workload(cfg0).meta.model_flops
    f1 = ddlsim.build_workload(cfg1).meta.model_flops
    assert f1 - f0 == pytest.approx(by_hand, rel=1e-12)


def test_last_stage_runs_the_depths_ops():
    """The last stage's last chunk: the projection's GEMM (2·b·s·2h·h/TP FLOPs), a second
    logits GEMM and loss, one more MoE layer's all-to-alls; none on the first stage."""
    cfg = config(1)
    sh = cfg.model.shape()
    fwd = _ops(cfg, "F1")
    names = [p.name for p in fwd]
    eh = [p for p in fwd if p.name == "mtp.eh_proj"]
    assert len(eh) == 1 and eh[0].flops == pytest.approx(2 * 1024 * 2 * sh.hidden ** 2 / 2)
    assert names.count("logits") == 2 and names.count("loss") == 2
    assert "mtp.eh_proj.ag" in names and "mtp.eh_proj.gather" in names
    bwd = [p.name for p in _ops(cfg, "B1")]
    assert "mtp.bwd.eh_proj" in bwd and "mtp.bwd.eh_proj.rs" in bwd
    assert not any(n.startswith("mtp.") for n in (p.name for p in _ops(cfg, "F1", 0)))
    base = [p.name for p in _ops(config(0), "F1")]
    assert base.count("logits") == 1 and not any(n.startswith("mtp.") for n in base)


def test_last_stage_parameters():
    """The last stage holds, per depth, one more MoE layer, eh_proj's 2h²/TP and three
    norms, and its own copy of the input embedding V·h/TP (gpt_model.py line 173)."""
    from ddlsim.workloads.decoder.builder import StageBuilder
    b0 = StageBuilder.from_config(config(0), config(0).model.shape())
    b1 = StageBuilder.from_config(config(1), config(1).model.shape())
    sh, t = b0.shape, 2
    layer = sum(b0.layer_rank_params(True))
    extra = layer + 2 * sh.hidden ** 2 / t + 3 * sh.hidden + sh.vocab * sh.hidden / t
    assert b1.stage_params(1) - b0.stage_params(1) == pytest.approx(extra)
    assert b1.stage_params(0) == b0.stage_params(0)
    assert b1.stage_expert_params(1) - b0.stage_expert_params(1) == pytest.approx(
        b0.layer_rank_params(True)[1])


def test_mtp_makes_the_step_longer_and_the_last_stage_heavier():
    r0 = ddlsim.predict(config(0), check_fit=False)
    r1 = ddlsim.predict(config(1), check_fit=False)
    assert r1.iteration_time_s > r0.iteration_time_s


@pytest.mark.parametrize("change, match", [
    ({"context_parallel_size": 2}, "context_parallel_size = 2"),
])
def test_unmodelled_plans_refused(change, match):
    with pytest.raises(ddlsim.ConfigError, match=f"model.mtp_num_layers = 1 with parallel.{match}"):
        config(1, **change)


def test_search_tier_refuses_mtp():
    from ddlsim.search.decoder import DecoderVectors
    d = copy.deepcopy(BASE)
    d["model"] = {"preset": "llama-3.1-8b", "num_hidden_layers": 8, "mtp_num_layers": 1}
    d["parallel"] = {"pipeline_model_parallel_size": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(d)
    with pytest.raises(ddlsim.ConfigError, match="model.mtp_num_layers = 1: the vectorised"):
        DecoderVectors().prepare(cfg)


def test_last_stage_holds_a_second_set_of_logits():
    """The depth's logits and their temporaries sit beside the main head's: the last stage's
    head term doubles (one depth), the first stage's is unchanged."""
    from ddlsim.workloads.decoder.build import decoder_memory
    m0 = decoder_memory(config(0), config(0).model.shape())
    m1 = decoder_memory(config(1), config(1).model.shape())
    assert m0[-1].other > 0 and m1[-1].other == pytest.approx(2 * m0[-1].other)
    assert m1[0].other == m0[0].other


def test_both_engines_time_the_depths():
    """The analytical engine and the DES agree on the plan with MTP (the trace semantics)."""
    a = ddlsim.predict(config(1), check_fit=False)
    d = ddlsim.predict(config(1), check_fit=False, engine="des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-3)


def test_embedding_copies_all_reduce_their_gradients():
    """The MTP stage's copy of the input embedding and the first stage's all-reduce their
    gradients before the step (Megatron-LM d98e8a64 finalize_model_grads.py line 146), as a
    tied embedding's do (ddlsim/workloads/decoder/tied_embedding.py)."""
    from ddlsim.workloads.decoder.tied_embedding import OP_NAME
    for mtp, expected in ((0, False), (1, True)):
        wl = ddlsim.build_workload(config(mtp))
        for cls in (wl.classes[0], wl.classes[-1]):
            names = [getattr(op.payload, "name", None)
                     for op in cls.program.blocks["update"].flat.ops]
            assert (OP_NAME in names) is expected


def test_the_files_mtp_depth_is_said_only_where_the_section_leaves_it_unset():
    # config.json's num_nextn_predict_layers is the section's model.mtp_num_layers to decide
    # (hf_keys.SUPERSEDED_BY): named as not modelled without it, silent once it is set
    import warnings

    def said(model):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddlsim.load_config({"model": model, "parallel": {"expert_model_parallel_size": 8},
                                "train": {"micro_batch_size": 1, "global_batch_size": 8,
                                          "seq_length": 4096},
                                # DeepSeek-V3's MLA: megatron-core-2024 (900f1b76) has none
                                "system": {"preset": "dgx-h100", "nodes": 1,
                                           "software": {"stack": "megatron-core-2025"}}})
        return " ".join(str(w.message) for w in caught)

    assert "num_nextn_predict_layers=1" in said("deepseek-v3")
    for depth in (0, 1):
        assert "num_nextn_predict_layers" not in said({"preset": "deepseek-v3",
                                                        "mtp_num_layers": depth})

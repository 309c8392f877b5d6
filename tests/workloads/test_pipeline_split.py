"""Megatron-Core's uneven pipeline splits (ddlsim/workloads/decoder/split.py): the layers of
each model chunk, the errors, and what the trace and memory make of them."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.split import chunk_layers

ROOT = "examples"


def _cfg(layers: int, pp: int, vpp: int | None = None, **split) -> dict:
    parallel = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": pp,
                "data_parallel_size": 1, **split}
    if vpp:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vpp)
    return {"model": {"name": "tiny", "architecture": "llama", "num_hidden_layers": layers,
                      "hidden_size": 1024, "intermediate_size": 2816,
                      "num_attention_heads": 16, "num_key_value_heads": 8,
                      "vocab_size": 32000, "max_position_embeddings": 2048},
            "parallel": parallel,
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
            # Megatron-Core's uneven split came after 900f1b76 (megatron-core-2024 refuses it:
            # no_megatron_uneven_split); megatron-core-2025 runs it
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def test_llama31_405b_on_pp8_vpp8_holds_one_layer_in_the_first_and_last_chunk():
    # Megatron-Core: (126 + 1 + 1) / (8·8) = 2 per chunk; the first chunk gives one up to the
    # embedding, the last one to the loss
    cfg = ddlsim.load_config(_cfg(126, 8, 8, account_for_embedding_in_pipeline_split=True,
                                  account_for_loss_in_pipeline_split=True))
    split = chunk_layers(cfg)
    assert split[0] == (1, 2, 2, 2, 2, 2, 2, 2)
    assert split[7] == (2, 2, 2, 2, 2, 2, 2, 1)
    assert all(row == (2,) * 8 for row in split[1:7])
    assert sum(map(sum, split)) == 126


def test_first_and_last_stage_sizes_split_the_rest_evenly():
    cfg = ddlsim.load_config(_cfg(30, 4, num_layers_in_first_pipeline_stage=6,
                                  num_layers_in_last_pipeline_stage=6))
    assert chunk_layers(cfg) == ((6,), (9,), (9,), (6,))


def test_an_even_split_is_unchanged():
    assert chunk_layers(ddlsim.load_config(_cfg(32, 4, 2))) == ((4, 4),) * 4


@pytest.mark.parametrize("layers,pp,vpp,split,message", [
    (126, 8, 8, {}, r"126 is not divisible by .* = 64; Megatron-Core can split unevenly"),
    (30, 4, None, {"num_layers_in_first_pipeline_stage": 7},
     r"leaves 23, not divisible by the 3 other pipeline stages"),
    (32, 4, 2, {"num_layers_in_first_pipeline_stage": 5},
     r"num_layers_in_first_pipeline_stage = 5 is not divisible by "
     r"virtual_pipeline_model_parallel_size = 2"),
    (32, 4, None, {"num_layers_in_first_pipeline_stage": 8,
                   "account_for_loss_in_pipeline_split": True}, r"cannot be set together"),
    (32, 4, None, {"num_layers_in_last_pipeline_stage": 40}, r"= 40 exceeds"),
])
def test_an_impossible_split_names_the_field(layers, pp, vpp, split, message):
    with pytest.raises(ddlsim.ConfigError, match=message):
        ddlsim.load_config(_cfg(layers, pp, vpp, **split))


def test_a_family_without_pipeline_layers_refuses_the_option():
    with pytest.raises(ddlsim.ConfigError, match=r"account_for_loss_in_pipeline_split = True: "
                                                 r"the \w+ family does not use"):
        ddlsim.load_config(f"{ROOT}/proxies/resnet50.yaml",
                           overrides=["parallel.account_for_loss_in_pipeline_split=true"])


def test_the_lighter_first_and_last_stages_hold_fewer_parameters_and_less_memory():
    even = ddlsim.load_config(_cfg(32, 4))
    uneven = ddlsim.load_config(_cfg(32, 4, num_layers_in_first_pipeline_stage=6,
                                     num_layers_in_last_pipeline_stage=6))
    m_even, m_uneven = even.family.memory(even), uneven.family.memory(uneven)
    # stage 0 holds 6 layers instead of 8, a middle stage 10 instead of 8
    assert m_uneven[0].weights < m_even[0].weights
    assert m_uneven[1].weights > m_even[1].weights
    assert m_uneven[1].activations > m_even[1].activations
    total = lambda ms: sum(m.weights for m in ms)  # noqa: E731
    assert total(m_uneven) == pytest.approx(total(m_even), rel=1e-12)


def test_moving_layers_off_the_edge_stages_balances_the_pipeline():
    # the first stage carries the embedding, the last the output layer and loss: with a
    # 32k vocabulary and a small model, taking a layer off each edge shortens the critical
    # stage, so the iteration gets faster
    base = _cfg(32, 4)
    base["train"]["global_batch_size"] = 64
    even = ddlsim.predict(base)
    uneven = ddlsim.predict({**base, "parallel": {
        **base["parallel"], "num_layers_in_first_pipeline_stage": 7,
        "num_layers_in_last_pipeline_stage": 7}})
    assert uneven.iteration_time_s < even.iteration_time_s


def test_both_engines_agree_on_an_uneven_interleaved_plan():
    cfg = _cfg(30, 4, 2, account_for_embedding_in_pipeline_split=True,
               account_for_loss_in_pipeline_split=True)
    a = ddlsim.predict(cfg, "analytical")
    d = ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


def test_an_uneven_split_is_searched_by_the_exact_tier():
    """The vectorised tier assumes L/(PP·VPP) layers per chunk: an uneven split's grid is
    searched plan by plan by the exact engine (ddlsim/search/exact.py), its figures
    ddlsim.predict's."""
    cfg = _cfg(31, 4, account_for_loss_in_pipeline_split=True)   # (31 + 1) / 4 = 8
    cfg["search"] = {"axes": {"train.micro_batch_size": [1, 2]}}
    from exacttier import assert_searched_by_the_exact_tier
    assert_searched_by_the_exact_tier(cfg, lambda plan: ddlsim.predict(plan, check_fit=False))


def test_context_parallelism_is_searched_by_the_exact_tier():
    cfg = _cfg(32, 1, context_parallel_size=2)
    cfg["search"] = {"axes": {"train.micro_batch_size": [1]}}
    frame = ddlsim.search(cfg, top=1)
    assert frame.attrs["tier"] == "exact" and len(frame) == 1


def test_the_plan_line_gives_each_stage_its_layers():
    cfg = ddlsim.load_config(_cfg(126, 8, 8, account_for_embedding_in_pipeline_split=True,
                                  account_for_loss_in_pipeline_split=True))
    assert "PP8(v8) [15+16×6+15 layers]" in cfg.family.plan_summary(cfg)
    even = ddlsim.load_config(_cfg(32, 4))
    assert "layers]" not in even.family.plan_summary(even)

"""Pipeline chunks without a transformer layer where Megatron-Core's split counts the
embedding and the loss as layers (``account_for_embedding/loss_in_pipeline_split``,
ddlsim/workloads/decoder/split.py): the first chunk runs the embedding alone, the last the
loss alone, as Megatron-Core builds them (NVIDIA/Megatron-LM d7288711 transformer_block.py
lines 183-196)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.decoder.split import chunk_layers

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _cfg(layers: int, pp: int, vpp: int, dp: int = 1, **split) -> dict:
    parallel = {"pipeline_model_parallel_size": pp, "data_parallel_size": dp,
                "schedule": "interleaved", "virtual_pipeline_model_parallel_size": vpp,
                "account_for_embedding_in_pipeline_split": True,
                "account_for_loss_in_pipeline_split": True, **split}
    return {"model": {"name": "tiny", "architecture": "llama", "num_hidden_layers": layers,
                      "hidden_size": 1024, "intermediate_size": 2816,
                      "num_attention_heads": 16, "num_key_value_heads": 8,
                      "vocab_size": 32000, "max_position_embeddings": 2048},
            "parallel": parallel,
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * dp, "seq_length": 2048},
            # Megatron-Core's uneven split came after 900f1b76 (megatron-core-2024 refuses it:
            # no_megatron_uneven_split); megatron-core-2025 runs it
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025"}}}


def test_qwen3_235b_on_pp32_vp3_leaves_the_first_and_last_chunk_without_a_layer():
    cfg = ddlsim.load_config({
        "model": "qwen3-235b-a22b",
        "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                     "pipeline_model_parallel_size": 32, "expert_model_parallel_size": 8,
                     "expert_tensor_parallel_size": 1, "schedule": "interleaved",
                     "virtual_pipeline_model_parallel_size": 3,
                     "account_for_embedding_in_pipeline_split": True,
                     "account_for_loss_in_pipeline_split": True,
                     "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
        "train": {"micro_batch_size": 1, "global_batch_size": 2048, "seq_length": 4096},
        "system": {"preset": "dgx-h100", "nodes": 32,
                   "software": {"stack": "megatron-core-2025"}}})
    split = chunk_layers(cfg)
    assert split[0] == (0, 1, 1) and split[-1] == (1, 1, 0)
    assert all(row == (1, 1, 1) for row in split[1:-1])
    assert sum(map(sum, split)) == 94


@pytest.mark.parametrize("dp", [1, 2])
def test_the_empty_chunks_run_the_embedding_and_the_loss_alone(dp):
    cfg = ddlsim.load_config(_cfg(6, 4, 2, dp))      # (6 + 2) / 8 = 1 layer per chunk
    assert chunk_layers(cfg)[0] == (0, 1) and chunk_layers(cfg)[-1] == (1, 0)
    w = ddlsim.build_workload(cfg)
    first = w.classes[0].program.blocks
    last = w.classes[-1].program.blocks
    names = [o.payload.name for o in first["F0"].ops]
    assert not any(n.startswith("fwd.") for n in names)          # no layer's op
    assert any("embedding" in n for n in names) and names[-1].startswith("send.")
    last_names = [o.payload.name for o in last["F1"].ops]
    assert last_names[0].startswith("recv.") and not any(
        n.startswith("fwd.") for n in last_names)
    assert (("B0.sync" in first) == (dp > 1)) and (("B1.sync" in first) == (dp > 1))


def test_both_engines_predict_the_split_and_agree():
    cfg = _cfg(6, 4, 2, 2)
    a = ddlsim.predict(cfg, "analytical")
    d = ddlsim.predict(cfg, "des")
    assert a.iteration_time_s > 0
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.02)


def test_an_empty_chunk_costs_less_than_a_layer_in_it():
    """The two edge chunks without a layer against the same model with one layer more in
    each: the layers removed shorten the iteration."""
    empty = ddlsim.predict(_cfg(6, 4, 2), "analytical")
    even = ddlsim.predict(_cfg(8, 4, 2, account_for_embedding_in_pipeline_split=False,
                               account_for_loss_in_pipeline_split=False), "analytical")
    assert empty.iteration_time_s < even.iteration_time_s


def test_the_combined_1f1b_with_an_empty_chunk_is_refused_not_approximated():
    cfg = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
           "parallel": {"expert_model_parallel_size": 8, "pipeline_model_parallel_size": 2,
                        "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2,
                        "account_for_embedding_in_pipeline_split": True,
                        "account_for_loss_in_pipeline_split": True,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                "overlap_expert_parallel_comm": True,
                                "delay_wgrad_compute": True}},
           "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
           "system": {"preset": "dgx-h100", "nodes": 2,
                      "software": {"stack": "megatron-core-2025"}}}
    with pytest.raises(ddlsim.ConfigError, match="combined 1F1B of such a chunk is not "
                                                 "modelled"):
        ddlsim.predict(cfg, check_fit=False)

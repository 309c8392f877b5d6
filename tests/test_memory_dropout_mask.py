"""The first stage's embedding-dropout mask (Korthikanti et al. 2022 §4.3: 1 byte per element
of the embedding output) is counted only where the model has dropout: PyTorch's dropout
returns its input at ``p = 0`` and torchtitan's Llama has no dropout module, so a
dropout-free model keeps no mask (its embedding output is the first layer's input, counted
with the layers). Bytes by hand."""

from __future__ import annotations

import pytest

import ddlsim

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

B, S, H = 2, 1024, 1024


def _first_stage(dropout: bool):
    """A 4-layer GPT on Megatron-Core, PP 2 (1F1B, 4 micro-batches: 2 in flight on stage 0),
    no TP: the first stage's memory."""
    cfg = {"model": {"architecture": "gpt", "name": "gpt-4x1024", "num_hidden_layers": 4,
                     "hidden_size": H, "num_attention_heads": 16, "vocab_size": 32000,
                     "max_position_embeddings": S, "dropout": dropout},
           "parallel": {"pipeline_model_parallel_size": 2, "data_parallel_size": 1},
           "train": {"micro_batch_size": B, "global_batch_size": 4 * B, "seq_length": S},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2024"}}}
    run = ddlsim.load_config(cfg)
    return next(m for m in run.family.memory(run) if m.stage == 0)


def test_the_embedding_mask_is_counted_with_dropout_only():
    with_mask, without = _first_stage(True), _first_stage(False)
    # 2 micro-batches in flight on stage 0 of 1F1B over 2 stages, 1 byte per b·s·h element
    assert with_mask.other - without.other == pytest.approx(2 * B * S * H, rel=1e-12)
    assert without.other == 0.0

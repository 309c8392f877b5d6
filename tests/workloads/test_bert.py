"""The ``bert`` family: HuggingFace BERT parameter counts, FLOPs, buckets, memory and errors.

Counts are derived here from the shapes of Devlin et al. 2019 (L, H, A; FFN 4H; vocab 30522,
512 positions, 2 token types), tensor by tensor as HuggingFace's BertForPreTraining holds them.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads.bert.build import stage_buckets

H, L, V, P, T, F = 1024, 24, 30522, 512, 2, 4096
LAYER = 4 * (H * H + H) + 2 * H + (H * F + F) + (F * H + H) + 2 * H   # attention, LN, FFN, LN
EMB = V * H + P * H + T * H + 2 * H                                    # word, pos, type, LN
POOLER = H * H + H
MLM = V + (H * H + H) + 2 * H                  # output bias, transform dense, transform LN
NSP = 2 * H + 2

SMALL = {"model": {"architecture": "bert", "name": "bert-small", "num_hidden_layers": 4,
                   "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 30522,
                   "tie_word_embeddings": False},
         "parallel": {"data_parallel_size": 2, "pipeline_model_parallel_size": 2},
         "train": {"micro_batch_size": 4, "global_batch_size": 32, "seq_length": 128,
                   "dtype": "bf16"},
         "system": {"preset": "dgx-a100", "nodes": 1}}


def _model(preset: str):
    return ddlsim.load_config({**SMALL, "model": preset,
                               "parallel": {"data_parallel_size": 1}}).model


def test_bert_large_parameters():
    # BertModel (with pooler) 335,141,888 — the "340M" of Devlin et al. 2019 —, and
    # BertForPreTraining with the decoder tied to the word embeddings 336,226,108
    assert LAYER == 12_596_224
    assert EMB + L * LAYER + POOLER == 335_141_888
    m = _model("bert-large")
    assert m.params == EMB + L * LAYER + POOLER + MLM + NSP == 336_226_108
    assert len(m.layer_tensors()) == 16


def test_bert_base_parameters():
    # BertModel of bert-base-uncased: 109,482,240 (12 × 768, 12 heads, FFN 3072)
    h, f = 768, 3072
    layer = 4 * (h * h + h) + 4 * h + (h * f + f) + (f * h + h)
    base = V * h + P * h + T * h + 2 * h + 12 * layer + h * h + h
    assert base == 109_482_240
    m = _model("bert-base")
    assert m.params == base + V + h * h + h + 2 * h + 2 * h + 2


def test_layer_flops():
    # per layer and sequence of s tokens: 2·s·(4h² + 2hf) in GEMMs, 4·s²·h in QKᵀ and AV
    m = _model("bert-large")
    gemm, attn = m.layer_flops(1, 512)
    assert gemm == 2 * 512 * (4 * H * H + 2 * H * F)
    assert attn == 4 * 512 * 512 * H


def test_per_layer_buckets_and_ddp_buckets():
    cfg = ddlsim.load_config({**SMALL, "model": {**SMALL["model"], "grad_buckets": "per_layer"},
                              "parallel": {"data_parallel_size": 2,
                                           "pipeline_model_parallel_size": 2,
                                           "overlap_grad_reduce": False}})
    h, f, v = 256, 1024, 30522
    layer = 4 * (h * h + h) + 4 * h + (h * f + f) + (f * h + h)
    grads, ready, issue = stage_buckets(cfg, 0)
    # stage 0 (2 layers): in layer order, embeddings + layer 0, then layer 1 (2 bytes each)
    assert [sum(grads[i] for i in r) for r in issue] == \
        [2 * (v * h + 512 * h + 2 * h + 2 * h + layer), 2 * layer]
    grads, ready, issue = stage_buckets(cfg, 1)
    heads = (h * h + h) + v + (h * h + h) + 2 * h + v * h + 2 * h + 2   # untied decoder
    assert [sum(grads[i] for i in r) for r in issue] == [2 * layer, 2 * (layer + heads)]
    ddp = ddlsim.load_config(SMALL)
    grads, ready, issue = stage_buckets(ddp, 1)
    assert ready == issue and sum(len(r) for r in ready) == 2 * 16 + 10


def test_memory_per_stage():
    cfg = ddlsim.load_config(SMALL)
    mems = ddlsim.build_workload(cfg).memory
    assert len(mems) == 2
    m = cfg.model
    for stage, mem in enumerate(mems):
        # bf16 weights and gradients, Adam's fp32 master, m, v: 2 + 2 + 12 bytes a parameter
        n = sum(m.stage_tensors(stage, 2))
        assert (mem.weights, mem.gradients, mem.optimizer) == (2 * n, 2 * n, 12 * n)
    # Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer; stage 0 of 1F1B holds 2
    # micro-batches of its 2 layers
    assert mems[0].activations == 2 * 2 * 128 * 4 * 256 * (34 + 5 * 4 * 128 / 256)


def test_des_agrees_with_analytical_on_one_node():
    cfg = ddlsim.load_config(SMALL)
    a = ddlsim.predict(cfg, "analytical").iteration_time_s
    d = ddlsim.predict(cfg, "des").iteration_time_s
    assert d == pytest.approx(a, rel=0.01)


def _bad(**parts):
    doc = {**SMALL, **parts}
    with pytest.raises(ConfigError) as err:
        ddlsim.build_workload(ddlsim.load_config(doc))
    return str(err.value)


def test_bad_input():
    model = SMALL["model"]
    assert "not divisible" in _bad(model={**model, "num_hidden_layers": 3})
    assert "multiple of" in _bad(model={**model, "num_attention_heads": 3})
    assert "paired" in _bad(model={**model, "stage_exchange": "paired"},
                            parallel={"data_parallel_size": 4})
    assert "proxy_timings.backward_per_microbatch" in _bad(model={
        **model, "compute": "proxy", "proxy_timings": {"forward_per_microbatch": "0 s"}})
    assert "p2p_attention_mask" in _bad(model={**model, "p2p_attention_mask": True},
                                        parallel={"data_parallel_size": 4})
    assert "grad_bucket_size" in _bad(model={**model, "grad_buckets": "per_layer"},
                                      parallel={**SMALL["parallel"], "grad_bucket_size": "5 MiB"})
    assert "max_position_embeddings" in _bad(train={**SMALL["train"], "seq_length": 1024})
    assert "tensor_model_parallel_size" in _bad(parallel={"tensor_model_parallel_size": 2,
                                                          "data_parallel_size": 2})

"""DeepSpeed ZeRO-3's edges without pipelining (workloads/decoder/zero3_edges.py): the
embedding and the output layer fetched by the leaf-module hooks, bytes by hand on Llama 3.1 8B
cut to 2 layers (untied) and GPT-3 1.3B cut to 2 layers (tied, learned positions), ZeRO-3 over
8 H100s under the deepspeed stack (one coalesced collective per module, bf16 gradients)."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective

BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
        "parallel": {"zero_stage": 3, "data_parallel_size": 8},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                  "dtype": "bf16", "recompute": "none"},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": "deepspeed"}}
#: Llama 3.1 8B: vocabulary 128,256 × hidden 4096, the final RMSNorm's 4096 (persistent:
#: under stage3_param_persistence_threshold = 1e5, never gathered, still reduce-scattered)
VH, NORM = 128256 * 4096, 4096
#: one layer's elements (attention, SwiGLU, two norms)
LAYER = 2 * 4096 ** 2 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096


def edges(d: dict, block: str) -> list[tuple[str, float]]:
    """(name, bytes) of stage 0's edge collectives in ``block``, in issue order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = build_workload(ddlsim.load_config(d)).classes[0].program.blocks[block].ops
    return [(o.payload.name, o.payload.bytes) for o in ops if isinstance(o.payload, Collective)
            and o.payload.name.endswith((".embedding", ".head"))]


def test_the_embedding_and_the_output_layer_are_fetched_for_the_forward():
    assert edges(BASE, "F0") == [("param.all_gather.embedding", 2 * VH),
                                 ("param.all_gather.head", 2 * VH)]


def test_the_head_is_kept_and_the_embedding_fetched_again_beyond_the_reuse_distance():
    """Between the embedding's two visits: 2 layers forward and backward and the head twice,
    2·2·LAYER + 2·VH = 1.9e9 elements, over the 1e9 reuse distance: fetched again. The head's
    backward follows its forward: kept. Gradients per module: the final norm's and the output
    layer's after the head's backward, the embedding's at the end (bf16, 2 B)."""
    assert 2 * 2 * LAYER + 2 * VH > 1e9
    assert edges(BASE, "B0") == [("grad.reduce_scatter.head", 2 * NORM),
                                 ("grad.reduce_scatter.head", 2 * VH),
                                 ("param.all_gather.embedding", 2 * VH),
                                 ("grad.reduce_scatter.embedding", 2 * VH)]
    d = copy.deepcopy(BASE)
    d["system"]["software"] = {"stack": "deepspeed",
                               "overlap": {"zero3_max_reuse_distance": 2_000_000_000}}
    assert "param.all_gather.embedding" not in [n for n, _ in edges(d, "B0")]


def test_a_tied_head_fetches_the_embeddings_weight_and_reduces_it_with_the_embedding():
    """GPT-3 1.3B (the preset's vocabulary V, hidden 2048, 2048 learned positions, LayerNorm
    weight and bias): the head fetches V·h again; its
    backward reduce-scatters the final norm only; the embedding's reduce-scatters carry the
    tied weight and the positions, one collective per leaf module."""
    d = copy.deepcopy(BASE)
    d["model"] = {"preset": "gpt3-1.3b", "num_hidden_layers": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = ddlsim.load_config(d).model.shape()
    vh, pos = shape.vocab * 2048, 2048 * 2048
    assert shape.tied_embeddings and shape.max_positions == 2048
    assert edges(d, "F0") == [("param.all_gather.embedding", 2 * vh),
                              ("param.all_gather.embedding", 2 * pos),
                              ("param.all_gather.head", 2 * vh)]
    back = edges(d, "B0")
    assert back[0] == ("grad.reduce_scatter.head", 2 * 2 * 2048)
    assert back[-2:] == [("grad.reduce_scatter.embedding", 2 * vh),
                         ("grad.reduce_scatter.embedding", 2 * pos)]


def test_both_engines_time_the_edges_alike():
    """The analytical engine and the DES time the trace with the edges' units alike and
    count the same bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(copy.deepcopy(BASE))
        a, s = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert a.comm_bytes == s.comm_bytes
    assert s.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-9)

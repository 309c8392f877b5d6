"""The layer's forward is built once for the signatures that differ only in the async TP
overlap (issue 27's speed target; task HS2).

Megatron's async TP overlap (``tp_async_backward``) overlaps the backward's input-gradient
all-reduce only; the stage builder keeps the forward's plain ops under it
(:meth:`~ddlsim.workloads.decoder.builder.StageBuilder._dense_layer_ops`). ZeRO-3 turns
the overlap off (:func:`~ddlsim.workloads.decoder.tp_overlap.mode`), so a ZeRO-3 signature
and a ZeRO-1 one at TP > 1 share their forward and differ in their backward. The search
tier's piece keys (``ddlsim/search/blocks.py``, ``_piece_keys``) must say so, and must not
where the overlap does reach the forward (TransformerEngine's userbuffers).
``tests/test_search_pieces.py`` checks that equal keys give equal op lists.
"""

from __future__ import annotations

import pytest

from ddlsim.config import build_config
from ddlsim.search.blocks import _PIECES, _piece_keys, piece_config
from ddlsim.search.family import vector_family
from ddlsim.workloads.decoder.builder import StageBuilder


def _keys_and_ops(tp_comm_overlap: str, zero: int) -> tuple[dict, dict]:
    data = {"model": "gpt3-760m",
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2024",
                                    "overlap": {"tp_comm_overlap": tp_comm_overlap,
                                                "tp_async_backward": True}}},
            "parallel": {}}
    cfg = build_config(data, ["parallel.tensor_model_parallel_size=1",
                              "parallel.data_parallel_size=1"])
    ctx = vector_family(cfg.model.architecture).prepare(cfg)
    sb = StageBuilder.from_config(piece_config(ctx.cfg, 2, True, 1, "none", zero), ctx.shape)
    keys = _piece_keys(sb, 1, 2, True, "none", zero)
    return keys, {name: tuple(_PIECES[name](sb)) for name in ("fwd", "bwd")}


def test_the_async_overlap_shares_the_forward_not_the_backward():
    k1, ops1 = _keys_and_ops("off", 1)
    k3, ops3 = _keys_and_ops("off", 3)
    assert k1["fwd"] == k3["fwd"] and ops1["fwd"] == ops3["fwd"]
    assert k1["bwd"] != k3["bwd"] and ops1["bwd"] != ops3["bwd"]


@pytest.mark.parametrize("tp_comm_overlap", ["bulk", "pipelined"])
def test_the_userbuffers_overlap_keeps_its_own_forward(tp_comm_overlap):
    k1, ops1 = _keys_and_ops(tp_comm_overlap, 1)
    k0, ops0 = _keys_and_ops("off", 1)
    assert ops1["fwd"] != ops0["fwd"] and k1["fwd"] != k0["fwd"]

"""The search tier builds each piece of a stage once per distinct key of the plan fields the
piece reads (``ddlsim/search/blocks.py``, ``_piece_keys``): two signatures with the same key
must have the same op list. Checked here by building every piece of every signature afresh,
on each stack the vectorised tier times, with several dtypes and TP overlap modes: a piece
that starts to read a field its key leaves out (the head reading ``train.recompute``, say)
fails this test instead of being shared wrongly."""

from __future__ import annotations

import itertools

import pytest

from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.search.blocks import _PIECES, _piece_keys, piece_config
from ddlsim.search.family import vector_family
from ddlsim.search.plans import RECOMPUTE
from ddlsim.workloads.decoder.builder import StageBuilder

CONTEXTS = [
    ("megatron-core-2024", "bf16", "off"),
    ("megatron-core-2024", "fp8", "pipelined"),
    ("megatron-core-2025", "bf16", "bulk"),
    ("megatron-lm-2021", "fp16", "off"),
    ("deepspeed", "bf16", "off"),
    ("deepspeed-2021", "fp32", "off"),
    ("megatron-core-2024", "bf16", "saves_gathered"),
]
#: a stack whose sequence-parallel linears save the gathered input, as DTensor's do
#: (torchtitan's, which the vectorised tier does not time for its FSDP2): the layer's
#: forward then depends on the recomputation (``regathers_input``)
KERNELS = {"saves_gathered": {"sp_saves_gathered_input": True, "sp_layout_copy": True}}


def _context(stack: str, dtype: str, tp_overlap: str):
    """The search's base config of one context (one device, one stage) and its prepared
    vectorised form; skipped where the vectorised tier does not time the stack."""
    data = {"model": "gpt3-760m",
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048,
                      "dtype": dtype},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": stack, "kernels": KERNELS.get(tp_overlap, {}),
                                    "overlap": {"tp_comm_overlap": tp_overlap
                                                if tp_overlap not in KERNELS else "off",
                                                "tp_async_backward": True}}},
            "parallel": {}}
    try:
        cfg = build_config(data, ["parallel.tensor_model_parallel_size=1",
                                  "parallel.data_parallel_size=1"])
        return cfg, vector_family(cfg.model.architecture).prepare(cfg)
    except ConfigError as exc:
        pytest.skip(f"{stack} {dtype} {tp_overlap}: not a vectorised context ({exc})")


@pytest.mark.parametrize("stack, dtype, tp_overlap", CONTEXTS)
def test_equal_piece_keys_have_equal_ops(stack, dtype, tp_overlap):
    cfg, ctx = _context(stack, dtype, tp_overlap)
    seen: dict[tuple, tuple] = {}
    shared = 0
    for mbs, tp, sp, zero, recompute in itertools.product((1, 2), (1, 2, 4), (False, True),
                                                          (0, 1, 3), RECOMPUTE):
        if sp and tp == 1:
            continue
        sb = StageBuilder.from_config(piece_config(cfg, tp, sp, mbs, recompute, zero),
                                      ctx.shape)
        keys = _piece_keys(sb, mbs, tp, sp, recompute, zero)
        assert set(keys) == set(_PIECES)
        for name, make in _PIECES.items():
            ops = tuple(make(sb))
            first = seen.setdefault(keys[name], ops)
            if first is not ops:
                shared += 1
                assert ops == first, (f"{name} of mbs {mbs} TP {tp} SP {sp} ZeRO {zero} "
                                      f"recompute {recompute} differs from another signature "
                                      f"with the same key {keys[name]}")
    assert shared > 0     # the keys do let signatures share pieces


def test_pieces_are_keyed_by_name():
    """Each piece's key names its piece, so two pieces never share an entry."""
    cfg, ctx = _context("megatron-core-2024", "bf16", "off")
    sb = StageBuilder.from_config(piece_config(cfg, 2, True, 1, "none", 0), ctx.shape)
    keys = _piece_keys(sb, 1, 2, True, "none", 0)
    assert len(set(keys.values())) == len(keys)

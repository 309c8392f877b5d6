"""A stage piece no plan of a signature reads is not built (issue 27's speed target; task HS).

:func:`ddlsim.search.blocks.stage_pieces` builds a signature's pieces with the family's own
builder; the first stage's embedding forward and backward on a PP = 1 rank (``emb1``,
``emb_b1``) are read only by plans with one stage (and ZeRO-3's root unit), the last stage's
batch loading and the embedding backward beside a head-less first stage (``load_l``,
``emb_b``) only by plans with several. A grid whose plans all have PP > 1 must not ask the
builder for the PP = 1 pieces, and the other way round; their seconds are NaN there, and the
grid's frame has none (the pieces read are the ones built).
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.search import blocks
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints

BASE = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}
AXES = {"parallel.tensor_model_parallel_size": [1, 2],
        "train.micro_batch_size": [1, 2], "train.recompute": ["none", "full"]}


@pytest.fixture
def asked(monkeypatch) -> dict[str, int]:
    """How many op lists the builder made for each piece over the grids of the test."""
    counts = {name: 0 for name in blocks._PIECES}
    for name, make in dict(blocks._PIECES).items():
        def counted(sb, name=name, make=make):
            counts[name] += 1
            return make(sb)
        monkeypatch.setitem(blocks._PIECES, name, counted)
    return counts


@pytest.mark.parametrize("pp, unread", [([2, 4], {"emb1", "emb_b1"}),
                                        ([1], {"load_l", "emb_b"})])
def test_the_pieces_no_plan_reads_are_not_built(asked, monkeypatch, pp, unread):
    from ddlsim.search import decoder

    seen = []

    def kept(*args, **kwargs):
        seen.append(blocks.stage_pieces(*args, **kwargs))
        return seen[-1]
    monkeypatch.setattr(decoder, "stage_pieces", kept)
    grid = evaluate_grid(BASE, None, [], {**AXES, "parallel.pipeline_model_parallel_size": pp},
                         Constraints(must_fit=False))
    assert len(grid.frame) > 0
    assert np.isfinite(grid.frame["iteration_time_s"]).all()
    assert {name for name, n in asked.items() if n == 0} == unread
    for pieces in seen:   # unbuilt: NaN on every plan; the others: a value on every plan
        for name in blocks.Pieces._fields:
            values = getattr(pieces, name)
            assert (np.isnan(values).all() if name in unread
                    else np.isfinite(values).all()), name

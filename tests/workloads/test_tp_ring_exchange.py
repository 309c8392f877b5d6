"""TransformerEngine's ring-exchange all-gathers under ``tp_comm_overlap: pipelined``
(ddlsim/workloads/decoder/tp_overlap.py): TE's ``split_overlap_ag`` (``aggregate`` off) starts
the first GEMM chunk on the rank's own input while that chunk is sent on, so no all-gather
chunk waits on the compute stream before its GEMM; the pipelined reduce-scatter keeps its
last chunk after the GEMM."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.workloads.trace import Collective

GPT = {"model": "gpt3-13b",
       "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True},
       "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 2048},
       "system": {"preset": "dgx-h100", "nodes": 1}}
CP = {"model": "llama2-13b",
      "parallel": {"tensor_model_parallel_size": 4, "sequence_parallel": True,
                   "context_parallel_size": 2},
      "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 4096},
      "system": {"preset": "dgx-h100", "nodes": 1}}


def _tp_ops(base: dict, mode: str) -> list[tuple[str, str, str]]:
    """(stream, op, name) of every TP collective of stage 0's blocks under ``mode``."""
    cfg = build_config(base, [f"parallel.tp_comm_overlap={mode}"])
    wl = ddlsim.build_workload(cfg)
    return [(op.stream, op.payload.op, op.payload.name)
            for block in wl.classes[0].program.blocks.values() for op in block.flat.ops
            if isinstance(op.payload, Collective) and op.payload.group == "tp"]


@pytest.mark.parametrize("base", [GPT, CP], ids=["1d", "context-parallel"])
def test_no_all_gather_chunk_waits_before_its_gemm(base):
    ops = _tp_ops(base, "pipelined")
    gathers = [o for o in ops if o[1] == "all_gather"]
    assert gathers, "the plan has sequence-parallel all-gathers"
    assert not [o for o in gathers if o[2].endswith(".chunk")]
    # every ring exchange runs beside its GEMM on the tp stream
    assert all(stream == "tp" for stream, _, name in gathers if "ag" in name)
    # the forward's pipelined reduce-scatters keep one of their 4 chunks after the GEMM
    chunks = [o for o in ops if o[1] == "reduce_scatter" and o[2].endswith(".chunk")]
    assert chunks and all(stream == "compute" for stream, _, _ in chunks)


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



def test_userbuffers_gemms_run_in_chunks():
    """TE runs a GEMM fed by a ring exchange as TP launches on M/TP rows each, and a GEMM
    followed by a pipelined reduce-scatter as 4 launches on M/4 rows each; bulk GEMMs whole.
    By hand, a forward MLP block at TP 8 on 2,048 tokens: fc1 (2048, N, K) -> 8 × (256, N, K),
    fc2 (2048, h, K') -> 4 × (512, h, K'); the memory kernels untouched, the FLOPs the same."""
    from ddlsim.workloads.decoder import tp_overlap as T
    from ddlsim.workloads.trace import Compute, Kernel
    ew = Kernel("memory", bytes=1e6)
    fc1, fc2 = Kernel("gemm", (2048, 1280, 5120)), Kernel("gemm", (2048, 5120, 640))
    op = Compute("fwd.mlp", 1e12, kernels=(ew, fc1, ew, fc2))
    ag = Collective("fwd.mlp.ag", "all_gather", "tp", 1e6)
    rs = Collective("fwd.mlp.rs", "reduce_scatter", "tp", 1e6)
    out = T.chunked(op, "pipelined", 8, [(ag, 0)], [(rs, T.RS_SPLITS)])
    assert [k.shape for k in out.kernels if k.kind == "gemm"] == (
        [(256, 1280, 5120)] * 8 + [(512, 5120, 640)] * 4)
    assert [k for k in out.kernels if k.kind == "memory"] == [ew, ew]
    assert out.flops == op.flops
    assert T.chunked(op, "bulk", 8, [], [(rs, 0)]) is op
    # bulk posts (0 chunks) leave the backward's last GEMM whole
    back = T.chunked(op, "pipelined", 8, [(ag, 0)], [(rs, 0)])
    assert [k.shape for k in back.kernels if k.kind == "gemm"][-1] == fc2.shape


def test_chunked_gemms_reach_the_trace():
    cfg = build_config(GPT, ["parallel.tp_comm_overlap=pipelined"])
    wl = ddlsim.build_workload(cfg)
    fwd = [op.payload for block in wl.classes[0].program.blocks.values()
           for op in block.flat.ops if op.payload.name == "fwd.mlp"]
    assert fwd
    rows = {k.shape[0] for k in fwd[0].kernels if k.kind == "gemm"}
    assert rows == {2048 / 8, 2048 / 4}      # seq 2,048, mbs 1: fc1 over TP 8, fc2 over 4

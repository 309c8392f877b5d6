"""``overlap_param_gather`` with model chunks (the interleaved schedule), as Megatron-Core
r0.8.0 runs it (ddlsim/workloads/decoder/param_gather.py, "Model chunks").

At ``baf94af3c6`` the distributed optimizer orders its all-gather handles by model chunk
(``optimizer/distrib_optimizer.py`` lines 1348-1376), each forward pre-hook waits for its own
bucket only and dispatches the next (lines 1454-1475), and no per-chunk sync is called without
``--delay-param-gather`` (``training/training.py`` lines 1005-1009; ``arguments.py`` line 1431,
off by default). So chunk 0's first forward waits for chunk 0's parameters alone; the other
chunks' gather follows on the same stream and must have arrived when the last chunk's first
forward starts. The byte counts below are derived by hand from the 70B row of
benchmarks/validate_megatron_h100.py (h 8192, 84 layers, V 131072, TP 8, PP 2, one layer per
virtual stage: 42 chunks a stage, DP 48).
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective, Wait

from benchscripts import load_script

vm = load_script("validate_megatron_h100")
ROWS = {r["model"]: r for r in vm.rows()}

H, V, TP = 8192, 131072, 8
#: the first bucket, exposed in the update block: max(40e6, 1e6·DP) parameters in bf16
#: (Megatron-Core distributed_data_parallel.py; ddlsim/workloads/decoder/dpsync.py)
FIRST_BUCKET_BYTES = 48e6 * 2


def _program(row: str, stage: int = 0):
    cfg = ddlsim.load_config(vm.config(ROWS[row]))
    return build_workload(cfg).classes[stage].program


def _gathers(block) -> dict[str, float]:
    return {o.payload.name: o.payload.bytes for o in block.ops
            if isinstance(o.payload, Collective) and o.payload.name.startswith("params.")}


def test_first_forward_waits_for_chunk_zero_only():
    """Stage 0's ``F0.pg`` gathers chunk 0 (the input embedding, V·h/TP + 4096·h learned
    positions, and one layer) less the first bucket; the other 41 layers follow after it."""
    prog = _program("70B")
    gathers = _gathers(prog.blocks["F0.pg"])
    stage_bytes = sum(gathers.values()) + FIRST_BUCKET_BYTES
    layer_bytes = (stage_bytes - 2 * (V * H / TP + 4096 * H)) / 42
    chunk0 = 2 * (V * H / TP + 4096 * H) + layer_bytes
    assert gathers["params.all_gather.overlapped"] == pytest.approx(chunk0 - FIRST_BUCKET_BYTES)
    assert gathers["params.all_gather.later_chunks"] == pytest.approx(41 * layer_bytes)
    # a layer of the 70B on one of 8 TP ranks: ~12h²/8 bf16 weights (+ biases, norms)
    assert layer_bytes == pytest.approx(2 * 12 * H * H / TP, rel=0.01)


def test_later_gather_is_issued_after_the_first_wait():
    """On the ``dp`` stream the later chunks' gather comes after chunk 0's wait, so it
    starts once chunk 0's has finished (one bucket at a time, as Megatron dispatches)."""
    ops = _program("70B").blocks["F0.pg"].ops
    names = [o.payload.name for o in ops]
    assert names.index("params.gather.wait") < names.index("params.all_gather.later_chunks")
    assert next(o for o in ops if o.payload.name == "params.all_gather.later_chunks").stream \
        == "dp"


@pytest.mark.parametrize("stage", [0, 1])
def test_last_chunk_first_forward_waits_for_the_later_gather(stage):
    """Every stage's first forward of chunk 41 (and only that step) runs ``F41.pg``, whose
    first op joins the ``dp`` stream; the other micro-batches of chunk 41 run ``F41``."""
    prog = _program("70B", stage)
    block = prog.blocks["F41.pg"]
    assert isinstance(block.ops[0].payload, Wait) and block.ops[0].payload.stream == "dp"
    assert [o.payload for o in block.ops[1:]] == [o.payload for o in prog.blocks["F41"].ops]
    steps = [s for s in prog.steps if s.block.startswith("F41")]
    assert [s.block for s in steps if s.microbatch == 0] == ["F41.pg"]
    assert all(s.block == "F41" for s in steps if s.microbatch > 0)


def test_one_chunk_keeps_the_whole_gather_beside_the_first_forward():
    """PP 1 (32B): one chunk, so the whole stage less the first bucket is gathered beside
    ``F0`` and nothing is left for later (unchanged by the chunk rule)."""
    prog = _program("32B")
    gathers = _gathers(prog.blocks["F0.pg"])
    assert set(gathers) == {"params.all_gather.overlapped"}
    assert not any(name.endswith(".pg") and name != "F0.pg" for name in prog.blocks)

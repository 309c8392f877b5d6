"""FSDP2's passes as torch's ``fully_shard`` code makes them (ddlsim/workloads/decoder/
fsdp2_passes.py): the casts and copies of each unshard, the ``chunk_cat`` and the copies of
each reduce, at one rank as at several, and no unsharded gradient accumulation.

The figures are derived by hand from the code's bytes per element (bf16 parameters, fp32
shards and reductions: 6 per cast, 4 per bf16 copy, 6 per chunk_cat, 8 per fp32 copy, 12 per
fp32 add) and the model's parameter counts.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective, Compute

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
#: Llama 3.1 8B's block and its edges (embedding + output head + final norm), parameters
BLOCK = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096
EDGES = 128256 * 4096 * 2 + 4096
LAYERS = 4


def _cfg(*sets: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(str(EXAMPLE), [f"model.num_hidden_layers={LAYERS}", *sets])


def _one_rank(*sets: str):
    """The H200 step of benchmarks/kineto_vs_ddlsim.py, 4 layers: FSDP2 on one GPU."""
    return _cfg("parallel.data_parallel_size=1", "train.global_batch_size=1",
                "system.devices_per_node=1", *sets)


def _ops(cfg, block: str) -> list:
    prog = build_workload(cfg).classes[0].program
    return list(prog.blocks[block].flat.ops)


def _bytes(ops: list, name: str) -> float:
    return sum(o.payload.bytes * o.repeat for o in ops
               if isinstance(o.payload, Compute) and o.payload.name == name)


def _gathers(cfg) -> tuple[float, float]:
    """(parameters unsharded in the forward, in the backward) under the stack's layout: every
    block and both edge units forward; the backward re-gathers the blocks and the embedding,
    the [norm, output] unit kept (torchtitan 07c00d9, ddlsim's fsdp_edges 'head')."""
    emb = 128256 * 4096
    return LAYERS * BLOCK + EDGES, LAYERS * BLOCK + emb


def test_one_rank_builds_the_passes_and_no_collective():
    cfg = _one_rank()
    fwd, bwd = _ops(cfg, "F0"), _ops(cfg, "B0")
    assert not any(isinstance(o.payload, Collective) and o.payload.group in ("dp", "dp_cp")
                   for o in fwd + bwd)
    gf, gb = _gathers(cfg)
    # wait_for_unshard at world size 1: the cast (read fp32, write bf16), then the copy
    assert _bytes(fwd, "zero3.cast") == pytest.approx(6 * gf, rel=1e-12)
    assert _bytes(fwd, "zero3.copy_out") == pytest.approx(4 * gf, rel=1e-12)
    assert _bytes(bwd, "zero3.cast") == pytest.approx(6 * gb, rel=1e-12)
    assert _bytes(bwd, "zero3.copy_out") == pytest.approx(4 * gb, rel=1e-12)
    # foreach_reduce: chunk_cat bf16 -> fp32, then reduce_output.copy_ (fp32), one micro-batch
    total = LAYERS * BLOCK + EDGES
    assert _bytes(bwd, "zero3.chunk_cat") == pytest.approx(6 * total, rel=1e-12)
    assert _bytes(bwd, "zero3.after_reduce") == pytest.approx(8 * total, rel=1e-12)
    assert {o.stream for o in bwd if getattr(o.payload, "name", "") == "zero3.chunk_cat"} \
        == {"compute"}


def test_one_rank_costs_time():
    """The passes are in the step: FSDP2 on one rank is slower than the same model without
    ZeRO-3 by at least their bytes at the device's streaming bandwidth (~8 ms on an H100)."""
    fsdp = ddlsim.predict(_one_rank(), check_fit=False).iteration_time_s
    plain = ddlsim.predict(_one_rank("parallel.zero_stage=0"), check_fit=False).iteration_time_s
    assert fsdp - plain > 5e-3


def test_no_unsharded_accumulation_under_fsdp2():
    """FSDP2 reduce-scatters every micro-batch's gradients: autograd's gradient is written
    once, no pass adds it into an unsharded buffer (the layers', the head's, the
    embedding's)."""
    for cfg in (_one_rank(), _cfg()):
        bwd = _ops(cfg, "B0")
        assert sum(_bytes(bwd, n) for n in ("bwd.grad_accumulate",
                                            "bwd.grad_accumulate.embedding")) == 0.0
    # the embedding's backward is its lookup gradient only: zeros + rows, no hook's add
    emb = [o.payload for o in _ops(_one_rank(), "B0")
           if getattr(o.payload, "name", "") == "bwd.embedding"]
    rows, h, tokens = 128256, 4096, 8192
    assert emb[0].bytes == pytest.approx(rows * h * 2 + 2 * tokens * h * (2 + 4), rel=1e-12)


def test_several_ranks_and_micro_batches():
    """FSDP over 8 ranks, 2 micro-batches: the shard's cast and copy-in (10 bytes a parameter
    of the shard) on the copy-in stream before each all-gather, the copy-out of the gathered
    parameters (4), chunk_cat (6 of the unsharded gradients), and from the second
    micro-batch the add into the sharded fp32 gradient (12 of the shard), half of it on each
    micro-batch's block."""
    cfg = _cfg("train.global_batch_size=16")
    fwd, bwd = _ops(cfg, "F0"), _ops(cfg, "B0")
    gf, gb = _gathers(cfg)
    assert _bytes(fwd, "zero3.copy_in") == pytest.approx(10 * gf / 8, rel=1e-12)
    assert _bytes(fwd, "zero3.copy_out") == pytest.approx(4 * gf, rel=1e-12)
    assert _bytes(fwd, "zero3.cast") == 0.0
    total = LAYERS * BLOCK + EDGES
    assert _bytes(bwd, "zero3.chunk_cat") == pytest.approx(6 * total, rel=1e-12)
    assert _bytes(bwd, "zero3.after_reduce") == pytest.approx(12 * total / 8 / 2, rel=1e-12)
    copy_in = [i for i, o in enumerate(fwd) if getattr(o.payload, "name", "") == "zero3.copy_in"]
    assert copy_in and all(fwd[i].stream == "fsdp_copy_in" for i in copy_in)
    # each all-gather waits for its copy-in
    gathers = [o for o in fwd if isinstance(o.payload, Collective)
               and o.payload.op == "all_gather" and o.payload.group == "dp"]
    assert all(any(d in copy_in for d in o.deps) for o in gathers)


def test_chunk_cat_runs_at_its_measured_rate():
    """chunk_cat's kernel takes the device's measured class (0.405 of the datasheet on the
    H100/H200 presets: the H200 trace's 1.945 TB/s of 4.8), not the streaming 0.90."""
    from ddlsim.simulator.kernels import kernel_device, kernel_time
    cfg = _one_rank("system.preset=dgx-h200")
    dev = kernel_device(cfg.system)
    op = next(o.payload for o in _ops(cfg, "B0")
              if getattr(o.payload, "name", "") == "zero3.chunk_cat")
    (k,) = op.kernels
    assert kernel_time(k, dev) == pytest.approx(k.bytes / (0.405 * 4.8e12), rel=1e-9)


def test_pipelined_fsdp_keeps_its_accumulation():
    """Under pipelining FSDP2's gradient sync is off until the stage's last backward: the
    micro-batches' gradients are accumulated unsharded (the pass stays), and the stage's
    chunk_cat reads the fp32 accumulated gradients (8 bytes a parameter)."""
    cfg = _cfg("parallel.pipeline_model_parallel_size=2", "parallel.data_parallel_size=4",
               "train.global_batch_size=8")
    prog = build_workload(cfg).classes[0].program
    acc = sum(o.payload.bytes for b in prog.blocks.values() for o in b.flat.ops
              if getattr(o.payload, "name", "") == "bwd.grad_accumulate")
    assert acc > 0
    cat = [o.payload for o in prog.blocks["update"].flat.ops
           if getattr(o.payload, "name", "") == "zero3.chunk_cat"]
    assert cat and cat[0].bytes == pytest.approx(8 * BLOCK, rel=1e-12)


def test_other_stacks_at_one_rank_unchanged():
    """DeepSpeed's ZeRO-3 at one rank builds no ZeRO-3 units (its code is not FSDP2's); the
    other FSDP2 stack gets the passes."""
    cfg = _one_rank("system.software=torchtitan-2024")     # FSDP2 too: its passes
    assert "zero3.chunk_cat" in {getattr(o.payload, "name", "") for o in _ops(cfg, "B0")}
    cfg = _one_rank("system.software=deepspeed")
    names = {getattr(o.payload, "name", "") for o in _ops(cfg, "B0")}
    assert not any(n.startswith("zero3.") for n in names)

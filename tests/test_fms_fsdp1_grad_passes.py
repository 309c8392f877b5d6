"""FSDP1's passes over each unit's gradients (``zero3_implementation: torch_fsdp``, the
``fms-fsdp-2024`` stack; ddlsim/workloads/decoder/fsdp1_passes.py), derived by hand from torch's
``FullyShardedDataParallel`` code: autograd's ``cat`` of the views' gradients into the flat
gradient (bf16: read 2, write 2 per parameter) on the compute stream, the pre-division
``div_`` of the unsharded gradient (4 per parameter) before the reduce-scatter, and after it
the post-division (4) and the cast to fp32 (6) of the shard, both on FSDP1's post-backward
stream."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.decoder.fsdp1_passes import grad_passes, predivide_factor
from ddlsim.workloads.trace import Compute, Wait

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
#: Llama 3.1 8B's block and FSDP1's root unit (embedding, output head, final norm)
BLOCK = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096
ROOT = 128256 * 4096 * 2 + 4096
LAYERS = 4


def _backward(software: str, dp: int, replicas: int = 1) -> list:
    sets = [f"model.num_hidden_layers={LAYERS}", f"system.software={software}",
            "train.recompute=none", f"parallel.data_parallel_size={dp}",
            f"parallel.data_parallel_replicate_size={replicas}",
            f"train.global_batch_size={dp}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config(str(EXAMPLE), sets)
    return list(build_workload(cfg).classes[0].program.blocks["B0"].flat.ops)


def _bytes(ops: list, name: str) -> float:
    return sum(o.payload.bytes * o.repeat for o in ops
               if isinstance(o.payload, Compute) and o.payload.name == name)


def test_predivide_factor_as_torch_computes_it():
    # default_hooks.DefaultState._get_gradient_predivide_factor
    assert [predivide_factor(w) for w in (1, 2, 4, 8, 16, 128)] == [1, 2, 2, 4, 4, 16]


def test_grad_passes_by_hand():
    p = 1e6
    # 128 ranks: pre-divide by 16, post-divide by 8; bf16 reduce, fp32 shard
    assert grad_passes(p, 128, 128, 2, 2, 1) == (4 * p, 4 * p, (4 + 6) * p / 128)
    # an fp32 reduce casts first (2 + 4) and divides in fp32 (8); no cast of the shard after
    assert grad_passes(p, 8, 8, 2, 4, 1) == (4 * p, (6 + 8) * p, 8 * p / 8)
    # one rank: nothing to divide, the cast of the whole gradient to fp32
    assert grad_passes(p, 1, 1, 2, 2, 1) == (4 * p, 0.0, 6 * p)
    # a second micro-batch adds half of the fp32 accumulation (3 x 4 B) a step
    assert grad_passes(p, 8, 8, 2, 2, 2)[2] == pytest.approx((4 + 6 + 6) * p / 8)


def test_fms_fsdp_backward_carries_fsdp1s_passes():
    ops = _backward("fms-fsdp-2024", 8)      # W = 8: pre-divide by 4, post-divide by 2
    total = LAYERS * BLOCK + ROOT
    assert _bytes(ops, "zero3.grad_cat") == pytest.approx(4 * total, rel=1e-12)
    assert {o.stream for o in ops if getattr(o.payload, "name", "") == "zero3.grad_cat"} \
        == {"compute"}
    assert _bytes(ops, "zero3.reduce_passes") == pytest.approx(4 * total, rel=1e-12)
    assert _bytes(ops, "zero3.after_reduce") == pytest.approx(10 * total / 8, rel=1e-12)
    # on FSDP1's post-backward stream, apart from the gathers, which the compute stream waits
    # for at the backward's end (_post_backward_final_callback)
    assert {o.stream for o in ops if getattr(o.payload, "name", "") in
            ("zero3.reduce_passes", "zero3.after_reduce")} == {"fsdp_post_backward"}
    last = ops[-1].payload
    assert isinstance(last, Wait) and last.stream == "fsdp_post_backward"
    # FSDP2 (torchtitan) has its own passes and none of these
    ops2 = _backward("torchtitan-2025", 8)
    assert not _bytes(ops2, "zero3.grad_cat") and not _bytes(ops2, "zero3.reduce_passes")


def test_hsdp_divides_by_the_whole_data_parallel_world():
    # shards of 2 ranks, 2 replicas: W = 4, pre-divide by 2 and post-divide by 2 (a shard
    # group's 2 alone would pre-divide by 2 and post-divide by nothing)
    ops = _backward("fms-fsdp-2024", 4, replicas=2)
    total = LAYERS * BLOCK + ROOT
    assert _bytes(ops, "zero3.reduce_passes") == pytest.approx(4 * total, rel=1e-12)
    assert _bytes(ops, "zero3.after_reduce") == pytest.approx(10 * total / 2, rel=1e-12)

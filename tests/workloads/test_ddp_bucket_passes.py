"""Megatron-Core 2024's DDP passes over the gradient buffer (ddlsim/workloads/decoder/
dpsync.py, software.yaml ``ddp.bucket_passes`` / ``ddp.grad_zero_passes``): the NaN check's
norm (read) and the 1/DP scaling (read + write) of every bucket, and the buffer's ``zero_()``
(write): 4 passes over the gradient bytes an iteration, on the compute stream. Bytes by hand;
a stack that names none (Megatron-LM 2021) runs none; the search tier charges the same.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels import kernel_device, kernel_time
from ddlsim.workloads.decoder.dpsync import bucket_passes, ddp_pass_times
from ddlsim.workloads.trace import Collective, Compute

from passchecks import assert_each_run_precedes

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _cfg(stack: str, zero: int) -> dict:
    return {"model": {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 32768, "max_position_embeddings": 2048},
            "parallel": {"data_parallel_size": 8, "zero_stage": zero, "overlap_grad_reduce": True},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def _ops(stack: str, zero: int = 1) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(_cfg(stack, zero)))
    prog = w.classes[0].program
    return [op for step in prog.steps for op in prog.blocks[step.block].flat.ops]


def test_stack_entries():
    assert bucket_passes("megatron-core-2024") == 3
    assert bucket_passes("megatron-core-2024", "grad_zero_passes") == 1
    assert bucket_passes("megatron-lm-2021") == 0


def test_four_passes_over_every_reduced_gradient_byte():
    """bf16 training on Megatron-Core 2024: fp32 gradient buffers, reduced in fp32, so the
    buffer is the bytes reduce-scattered; 4 passes over them: with overlapped buckets, 3 over
    each bucket before its reduce-scatter (one kernel a pass and bucket) and the zero_() in
    the update block; without, all 4 in the update block."""
    ops = _ops("megatron-core-2024")
    reduced = sum(o.payload.bytes * o.repeat for o in ops if isinstance(o.payload, Collective)
                  and o.payload.name == "grad.reduce_scatter")
    (zero,) = [o.payload for o in ops if isinstance(o.payload, Compute)
               and o.payload.name == "grad.ddp_passes"]
    runs = [o for o in ops if isinstance(o.payload, Compute)
            and o.payload.name == "grad.bucket_passes"]
    assert reduced > 0 and zero.bytes == pytest.approx(reduced)
    assert sum(o.payload.bytes * o.repeat for o in runs) == pytest.approx(3 * reduced)
    # before the run's reduce-scatter, one kernel a pass and bucket
    assert_each_run_precedes(ops, runs, "grad.reduce_scatter", 3)


def test_without_overlap_all_four_in_the_update_block():
    data = _cfg("megatron-core-2024", 1)
    data["parallel"]["overlap_grad_reduce"] = False
    w = ddlsim.build_workload(ddlsim.load_config(data))
    prog = w.classes[0].program
    ops = [op for step in prog.steps for op in prog.blocks[step.block].flat.ops]
    reduced = sum(o.payload.bytes * o.repeat for o in ops if isinstance(o.payload, Collective)
                  and o.payload.name == "grad.reduce_scatter")
    (passes,) = [o.payload for o in ops if isinstance(o.payload, Compute)
                 and o.payload.name == "grad.ddp_passes"]
    assert passes.bytes == pytest.approx(4 * reduced)
    assert not [o for o in ops if o.payload.name == "grad.bucket_passes"]


def test_the_search_tiers_form_is_the_ops():
    cfg = ddlsim.load_config(_cfg("megatron-core-2024", 1))
    dev = kernel_device(cfg.system)
    seconds, kernels = ddp_pass_times("megatron-core-2024", dev, 3e9)
    assert kernels == 4
    assert seconds == pytest.approx(4 * kernel_time(
        ddlsim.workloads.trace.Kernel("memory", bytes=3e9, dtype="fp32"), dev), rel=1e-12)


def test_a_stack_without_them_runs_none():
    names = {o.payload.name for o in _ops("megatron-lm-2021", zero=0)}   # 2021: no ZeRO
    assert "grad.ddp_passes" not in names
    assert ddp_pass_times("megatron-lm-2021", None, 3e9)[1] == 0

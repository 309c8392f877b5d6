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
    buffer is the bytes reduce-scattered; the op moves 4 times them, in 4 kernels."""
    ops = _ops("megatron-core-2024")
    reduced = sum(o.payload.bytes * o.repeat for o in ops if isinstance(o.payload, Collective)
                  and o.payload.name == "grad.reduce_scatter")
    (passes,) = [o.payload for o in ops if isinstance(o.payload, Compute)
                 and o.payload.name == "grad.ddp_passes"]
    assert reduced > 0 and passes.bytes == pytest.approx(4 * reduced)
    assert [k.bytes for k in passes.kernels] == pytest.approx([reduced] * 4)


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

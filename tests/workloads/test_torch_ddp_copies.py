"""torch DDP's copies between the gradients and its buckets, as torchtitan-2024 runs them
(software.yaml torchtitan-2024 ``ddp.bucket_passes`` / ``ddp.grad_copy_passes``;
ddlsim/workloads/decoder/dpsync.py): with ``gradient_as_bucket_view=False`` the Reducer
writes each gradient, scaled by 1/DP, into its bucket before the bucket's all-reduce (read +
write) and copies the reduced bucket back into the gradient at the backward's end (read +
write): 4 passes over the all-reduced bytes an iteration. torchtitan wraps DDP only at
dp > 1, so a one-rank plan runs none. Bytes by hand; the search tier charges the same.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels import kernel_device, kernel_time
from ddlsim.workloads.decoder.dpsync import bucket_passes, ddp_pass_times, whole_gradient_passes
from ddlsim.workloads.trace import Collective, Compute, Kernel

from passchecks import assert_each_run_precedes

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

STACK = "torchtitan-2024"


def _cfg(dp: int) -> dict:
    return {"model": {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 32768, "max_position_embeddings": 2048},
            "parallel": {"data_parallel_size": dp, "zero_stage": 0},
            "train": {"micro_batch_size": 1, "global_batch_size": 2 * dp, "seq_length": 2048,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": STACK}}}


def _ops(dp: int) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(_cfg(dp)))
    prog = w.classes[0].program
    return [op for step in prog.steps for op in prog.blocks[step.block].flat.ops]


def _computes(ops: list, name: str) -> list:
    return [o for o in ops if isinstance(o.payload, Compute) and o.payload.name == name]


def test_stack_entries():
    assert bucket_passes(STACK) == 2
    assert bucket_passes(STACK, "grad_copy_passes") == 2
    assert bucket_passes(STACK, "grad_zero_passes") == 0
    assert whole_gradient_passes(STACK) == 2
    assert whole_gradient_passes("megatron-core-2024") == 1     # its zero_() alone


def test_two_passes_before_each_bucket_and_two_after_the_all_reduce():
    ops = _ops(8)
    reduced = sum(o.payload.bytes * o.repeat for o in ops if isinstance(o.payload, Collective)
                  and o.payload.name == "grad.all_reduce")
    runs = _computes(ops, "grad.bucket_passes")
    (back,) = _computes(ops, "grad.ddp_passes")
    assert reduced > 0 and runs
    assert sum(o.payload.bytes * o.repeat for o in runs) == pytest.approx(2 * reduced)
    assert back.payload.bytes == pytest.approx(2 * reduced)
    # the copy into the bucket before its all-reduce, a kernel a pass
    assert_each_run_precedes(ops, runs, "grad.all_reduce", 2)


def test_one_rank_runs_no_ddp():
    """torchtitan 9dec370 parallelize_llama.py: apply_ddp only when dp_replicate > 1."""
    ops = _ops(1)
    assert not _computes(ops, "grad.bucket_passes") + _computes(ops, "grad.ddp_passes")


def test_the_search_tiers_form_is_the_ops():
    """dpsync.ddp_pass_times, the search tier's form: the update block's 2 copy-back passes
    over the gradient and, where the buckets were not issued during the backward, their 2
    copy-in passes: one memory kernel a pass, each timed as the trace's kernels are."""
    cfg = ddlsim.load_config(_cfg(8))
    dev = kernel_device(cfg.system)
    one = kernel_time(Kernel("memory", bytes=3e9, dtype="fp32"), dev)
    seconds, kernels = ddp_pass_times(STACK, dev, 3e9, 0.0)
    assert (kernels, seconds) == (2, pytest.approx(2 * one, rel=1e-12))
    seconds, kernels = ddp_pass_times(STACK, dev, 3e9)
    assert (kernels, seconds) == (4, pytest.approx(4 * one, rel=1e-12))


@pytest.mark.parametrize("stack", ["torchtitan-2024", "torchtitan-2025"])
def test_torchtitan_buckets_are_its_bucket_cap_mb(stack):
    """torchtitan's replicate(bucket_cap_mb=100): 100 MiB buckets unless the plan sets
    parallel.grad_bucket_size; a stack naming no cap keeps DDP's 25 MiB."""
    from ddlsim.workloads.decoder.dpsync import bucket_cap_mb, grad_bucket_bytes
    data = _cfg(8)
    data["system"]["software"] = {"stack": stack}
    cfg = ddlsim.load_config(data)
    assert bucket_cap_mb(stack) == 100
    assert grad_bucket_bytes(cfg, 8, 4) == 100 * 2**20
    data["parallel"]["grad_bucket_size"] = 5 * 2**20
    assert grad_bucket_bytes(ddlsim.load_config(data), 8, 4) == 5 * 2**20
    assert bucket_cap_mb("deepspeed") is None

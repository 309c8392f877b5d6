"""The host's waits in Megatron-Core 2024's step (ddlsim/workloads/decoder/host_sync.py,
software.yaml ``host_syncs``): per micro-batch after the loss, per gradient bucket, and twice
per step around the optimizer. Each costs ``wakes · SYNC_WAKE_S + issue_ops · h`` of device
idle time (h: the device's eager host time per op); checked by hand on a serial plan in both
engines, counted in the trace, and the search tier's form against the ops.
"""

from __future__ import annotations

import math

import pytest

import ddlsim
from ddlsim.simulator.kernels import kernel_device
from ddlsim.workloads.decoder import host_sync
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.host_sync import HostSync, host_sync_times, stack_host_syncs
from ddlsim.workloads.decoder.moe_host import SYNC_WAKE_S
from ddlsim.workloads.trace import Compute

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: the dgx-h100 preset's eager host time per op: eager_op_s 2 µs + host_launch_s 3.8 µs
H = 5.8e-6


def _cfg(dp: int = 1, zero: int = 0, mbs_per_step: int = 2, preset: str = "dgx-h100",
         stack: str = "megatron-core-2024") -> dict:
    return {"model": {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                      "vocab_size": 32768, "max_position_embeddings": 2048},
            "parallel": {"data_parallel_size": dp, "zero_stage": zero,
                         "overlap_grad_reduce": dp > 1 and zero < 3},
            "train": {"micro_batch_size": 1, "global_batch_size": mbs_per_step * dp,
                      "seq_length": 2048, "dtype": "bf16"},
            "system": {"preset": preset, "nodes": 1, "software": {"stack": stack}}}


def _ops(data: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(data))
    prog = w.classes[0].program
    return [op for step in prog.steps for op in prog.blocks[step.block].flat.ops]


def test_the_stacks_entries():
    syncs = stack_host_syncs("megatron-core-2024")
    assert syncs == {"loss": HostSync(2, 16), "bucket": HostSync(1, 1),
                     "grad_norm": HostSync(1, 2), "loss_scale": HostSync(1, 2)}
    assert stack_host_syncs("megatron-lm-2021") == {}


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_a_serial_step_pays_each_wait_by_hand(engine, monkeypatch):
    """DP 1, PP 1, two micro-batches: nothing overlaps the compute stream, so each wait adds
    its wakes and its issue to the step: 2 × (2 wakes + 16 ops) after the losses, then
    (1 wake + 2 ops) before and after the optimizer."""
    cfg = ddlsim.load_config(_cfg())
    with_waits = ddlsim.predict(cfg, engine=engine).iteration_time_s
    monkeypatch.setattr(host_sync, "stack_host_syncs", lambda stack: {})
    without = ddlsim.predict(cfg, engine=engine).iteration_time_s
    by_hand = 2 * (2 * SYNC_WAKE_S + 16 * H) + 2 * (SYNC_WAKE_S + 2 * H)
    assert with_waits - without == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize("overlap", [True, False])
def test_one_bucket_wait_per_gradient_bucket(overlap):
    """DP 8, ZeRO-1: Megatron-Core's bucket is max(40e6, 1e6·8) fp32 gradients (160 MB); the
    rank's gradient bytes in such buckets, one wait each, before the bucket's reduce-scatter
    (overlapped: after each run of backward layers), or one bucket in the update block (not
    overlapped: Megatron-Core buckets nothing)."""
    data = _cfg(dp=8, zero=1)
    data["parallel"]["overlap_grad_reduce"] = overlap
    cfg = ddlsim.load_config(data)
    grad_bytes = StageBuilder.from_config(cfg, cfg.model.shape()).stage_params(0) * 4
    ops = _ops(data)
    waits = [o for o in ops if o.payload.name == "bucket.sync"]
    assert {o.stream for o in waits} == {"compute"}
    assert sum(o.repeat for o in waits) == (math.ceil(grad_bytes / 160e6) if overlap else 1)
    for o in waits:
        after = next(x for x in ops[ops.index(o):] if x.stream == "dp" or x.payload.name
                     == "optimizer")
        assert after.payload.name == ("grad.reduce_scatter" if overlap else "optimizer")
    names = [o.payload.name for o in ops]
    assert names.count("loss.sync") == 2 and names.count("grad_norm.sync") == 1


def test_the_search_tiers_form_is_the_ops():
    cfg = ddlsim.load_config(_cfg(dp=8, zero=1))
    dev = kernel_device(cfg.system)
    got = host_sync_times("megatron-core-2024", dev.launch, cfg.system.device.launch, 3.0)
    assert got == pytest.approx(3 * (SYNC_WAKE_S + H) + 2 * (SYNC_WAKE_S + 2 * H), rel=1e-12)


@pytest.mark.parametrize("data", [_cfg(preset="cpu-10gbe"), _cfg(stack="megatron-lm-2021"),
                                  _cfg(dp=8, zero=3, stack="deepspeed")],
                         ids=["no host model", "a stack without waits", "ZeRO-3"])
def test_no_waits(data):
    assert not [o for o in _ops(data) if isinstance(o.payload, Compute)
                and o.payload.name in {f"{site}.{part}" for site in host_sync.SITES
                                       for part in ("sync", "issue")}]


def test_a_runs_passes_and_waits_are_the_search_tiers_form():
    """The overlapped run's ops (its buckets' passes, then their waits) timed one by one as
    the engine does equal :func:`~ddlsim.workloads.decoder.dpsync.bucket_run_times`."""
    from ddlsim.simulator.kernels import op_time
    from ddlsim.workloads.decoder.dpsync import bucket_run_times
    data = _cfg(dp=8, zero=1)
    cfg = ddlsim.load_config(data)
    dev = kernel_device(cfg.system)
    ops = _ops(data)
    i = next(k for k, o in enumerate(ops) if o.payload.name == "grad.bucket_passes")
    rs = next(o for o in ops[i:] if o.payload.name == "grad.reduce_scatter")
    run = [o for o in ops[i:ops.index(rs)] if isinstance(o.payload, Compute)]
    timed = sum((o.payload.seconds if o.payload.seconds is not None
                 else op_time(o.payload, dev)) * o.repeat for o in run)
    assert timed == pytest.approx(bucket_run_times(
        "megatron-core-2024", dev, cfg.system.device.launch, rs.payload.bytes, rs.repeat),
        rel=1e-12)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("pp", [1, 2])
def test_the_waits_move_both_tiers_alike(pp, monkeypatch):
    """What the waits (and the passes beside them) add to an overlapped DP plan: the same in
    the search tier as in the exact engine."""
    from ddlsim.config import build_config
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    data = {"model": "gpt3-760m",
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 2,
                       "software": {"stack": "megatron-core-2024"}}}
    axes = {"parallel.tensor_model_parallel_size": [2],
            "parallel.pipeline_model_parallel_size": [pp],
            "parallel.virtual_pipeline_model_parallel_size": [None],
            "parallel.sequence_parallel": [True], "parallel.zero_stage": [1],
            "train.micro_batch_size": [1], "train.recompute": ["selective"]}

    def both() -> tuple[float, float]:
        frame = evaluate_grid(data, None, [], axes, Constraints(must_fit=False)).frame
        cfg = build_config(data, plan_overrides(frame.iloc[0], [c for c in frame.columns
                                                               if "." in c]))
        return (float(frame["iteration_time_s"].iloc[0]),
                ddlsim.predict(cfg, check_fit=False).iteration_time_s)
    on = both()
    monkeypatch.setattr(host_sync, "stack_host_syncs", lambda stack: {})
    off = both()
    assert on[0] - off[0] > 0
    assert on[0] - off[0] == pytest.approx(on[1] - off[1], rel=1e-6)
    assert on[0] == pytest.approx(on[1], rel=1e-9)

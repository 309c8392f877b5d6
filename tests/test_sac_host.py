"""The host time of torch's op-level selective checkpointing in eager mode
(ddlsim/workloads/decoder/sac.py, "Host time"; ddlsim/simulator/kernels/host.py, "Host work
beyond the launches"). Each figure is derived by hand from the measured constants, which
benchmarks/sac_host_cost.py reads from the H200 trace
benchmarks/data/device_h200_2026-11-30/run4/llama_s2048/llama_step_trace.json.gz: 66 ATen ops per
block forward through SAC's dispatch mode at 34.8 µs each, 90 per recompute at 16.3 µs each."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels.host import NO_LAUNCH, Launch, stream_time
from ddlsim.workloads.decoder import sac
from ddlsim.workloads.trace import Compute, Kernel

US = 1e-6
ROOT = Path(__file__).resolve().parents[1]
FORWARD = 66 * 34.8 * US            # one block's forward, the trace's reading
RECOMPUTE = 90 * 16.3 * US          # one block's recompute


def _config(seq=2048, recompute="selective", compile=False, cp=1):
    software = {"stack": "torchtitan-2025", "kernels": {"attention": "cudnn"}}
    if compile:
        software["compile"] = True
    parallel = {"zero_stage": 3, "data_parallel_size": 1}
    if cp > 1:
        parallel["context_parallel_size"] = cp
    return ddlsim.load_config({
        "model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8}, "parallel": parallel,
        "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": seq,
                  "dtype": "bf16", "recompute": recompute},
        "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": cp,
                   "software": software}})


def _computes(cfg) -> dict[str, list[Compute]]:
    """Every compute op of rank class 0's blocks, by name."""
    out: dict[str, list[Compute]] = {}
    for block in ddlsim.build_workload(cfg).classes[0].program.blocks.values():
        for op in block.flat.ops:
            if isinstance(op.payload, Compute):
                out.setdefault(op.payload.name, []).append(op.payload)
    return out


def test_the_constants_are_the_traces_reading():
    spec = importlib.util.spec_from_file_location("sac_host_cost",
                                                  ROOT / "benchmarks" / "sac_host_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tops = mod.load_tree(mod.TRACES[0])
    main = next(ev for ev in tops.values() if any(e["name"] == "_NoopSaveInputs" for e in ev))
    autograd = next(ev for ev in tops.values() if ev is not main and any(
        e["name"].startswith("autograd::engine::evaluate_function") for e in ev))
    blocks, recompute = mod.forward_blocks(main), mod.recompute_passes(autograd)
    base = mod.root_means(main, blocks)
    assert len(blocks) == len(recompute) == 8
    assert {mod.count(b, "PythonDispatchMode") for b in blocks} == {sac.FORWARD_OPS}
    assert {mod.count(r, "PythonDispatchMode") for r in recompute} == {sac.RECOMPUTE_OPS}
    assert round(mod.extra_per_op(blocks, base), 7) == pytest.approx(sac.FORWARD_OP_S)
    assert round(mod.extra_per_op(recompute, base), 7) == pytest.approx(sac.RECOMPUTE_OP_S)


def test_the_recompute_op_carries_the_blocks_recompute_policy_time():
    (op,) = set(_computes(_config())["recompute.sac"])
    assert op.host_s == pytest.approx(RECOMPUTE, rel=1e-12)


def test_the_forward_ops_share_the_blocks_forward_policy_time():
    ops = _computes(_config())
    attn, mlp, ew = (set(ops[f"fwd.{n}"]).pop() for n in ("attn", "mlp", "elementwise"))
    # kernels: attn 4 GEMMs + cuDNN attention + 2 memory; mlp 3 GEMMs; elementwise 26 memory
    # (the complex RoPE's 3 per tensor). ATen ops: 4 per GEMM (28), 9 with the attention
    # kernel, the other 66 - 37 = 29 over the 28 memory kernels
    per_memory = 29 / 28
    assert mlp.host_s == pytest.approx(FORWARD * 12 / 66, rel=1e-12)
    assert attn.host_s == pytest.approx(FORWARD * (16 + 9 + 2 * per_memory) / 66, rel=1e-12)
    assert ew.host_s == pytest.approx(FORWARD * 26 * per_memory / 66, rel=1e-12)
    assert attn.host_s + mlp.host_s + ew.host_s == pytest.approx(FORWARD, rel=1e-12)
    # the ops outside the checkpointed blocks run no policy
    assert all(op.host_s == 0 for name in ("logits", "loss", "final_norm", "optimizer")
               for op in ops.get(name, ()))


@pytest.mark.parametrize("kwargs", [{"compile": True}, {"recompute": "none"},
                                    {"recompute": "full"}])
def test_compiled_blocks_and_other_recomputation_pay_no_policy_time(kwargs):
    ops = _computes(_config(**kwargs))
    assert all(op.host_s == 0 for group in ops.values() for op in group)


def test_a_context_parallel_layer_from_the_partitioner_shares_the_same_total():
    ops = [op for block in ddlsim.build_workload(_config(8192, cp=2)).classes[0]
           .program.blocks.values() if block.phase == "forward"
           for op in block.flat.ops if isinstance(op.payload, Compute)]
    layer = sum(op.payload.host_s * op.repeat for op in ops)
    assert layer == pytest.approx(8 * FORWARD, rel=1e-12)


def test_the_op_pays_its_host_work_before_its_launches():
    launch = Launch(host_s=10 * US, gap_s=1 * US)
    assert stream_time(1000 * US, 4, launch, 500 * US) == pytest.approx(1004 * US)
    assert stream_time(100 * US, 4, launch, 500 * US) == pytest.approx(540 * US)
    assert stream_time(100 * US, 0, launch, 500 * US) == pytest.approx(500 * US)
    assert stream_time(100 * US, 4, NO_LAUNCH, 500 * US) == 100 * US   # no host model
    from ddlsim.simulator.kernels import kernel_device, op_time
    dev = kernel_device(_config().system)
    k = Kernel("memory", bytes=1e3)
    plain, charged = Compute("a", 0.0, kernels=(k,)), Compute("a", 0.0, kernels=(k,),
                                                              host_s=1e-3)
    assert op_time(charged, dev) == pytest.approx(dev.launch.host_s + 1e-3, rel=1e-12)
    assert op_time(plain, dev) < 1e-4


def test_a_host_bound_step_slows_and_a_device_bound_one_hides_it(monkeypatch):
    got = {seq: ddlsim.predict(_config(seq)).iteration_time_s for seq in (2048, 8192)}
    assert ddlsim.predict(_config(2048), engine="des").iteration_time_s == \
        pytest.approx(got[2048], rel=1e-12)
    monkeypatch.setattr(sac, "FORWARD_OP_S", 0.0)
    monkeypatch.setattr(sac, "RECOMPUTE_OP_S", 0.0)
    without = {seq: ddlsim.predict(_config(seq)).iteration_time_s for seq in (2048, 8192)}
    # seq 2048: element-wise ops and the recompute become host-bound (≥ 10 ms over 8 layers);
    # seq 8192: every op's device time exceeds its host time, nothing changes
    assert got[2048] - without[2048] > 10e-3
    assert got[8192] == without[8192]


@pytest.mark.parametrize("bad", [-1e-6, math.inf, math.nan])
def test_a_bad_host_time_is_refused(bad):
    with pytest.raises(ValueError, match=r"compute 'x': host_s must be finite and >= 0"):
        Compute("x", 0.0, host_s=bad)

"""The host time of torch's op-level selective checkpointing in eager mode
(ddlsim/workloads/decoder/sac.py, "Host time"; ddlsim/simulator/kernels/host.py, "Host work
beyond the launches"). Each figure is derived by hand from the measured constants, which
benchmarks/sac_host_cost.py reads from the H200 trace
benchmarks/data/device_h200_2026-11-30/run4/llama_s2048/llama_step_trace.json.gz: 66 ATen ops per
block forward through SAC's dispatch mode at 34.8 µs each, 90 per recompute at 16.3 µs each.

Under FSDP2 on a GPU (these configs) the policy is part of the block's host work on the
``host`` stream (ddlsim/workloads/decoder/eager_host.py): each op's share joins the host op
before it, beside the op's own measured units; where that stream is not laid (layers built
as one loop op, as the partitioner's under context parallelism) the op keeps it as its
``host_s``."""

from __future__ import annotations

import math

import pytest

import ddlsim
from benchscripts import load_script  # puts benchmarks/ on sys.path: the script imports torchbench
from ddlsim.simulator.kernels.host import NO_LAUNCH, Launch, stream_time
from ddlsim.workloads.decoder import eager_host, sac
from ddlsim.workloads.trace import Compute, Kernel, Op

US = 1e-6
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


def _tiny(cfg) -> float:
    """The eager host time per tiny op ``h`` the block's units are charged at."""
    launch = cfg.system.device.launch
    return launch.eager_op_s + launch.host_launch_s


def _policy(cfg, name: str) -> float:
    """The SAC policy's seconds in the host op before layer op ``name`` (its one figure over
    the blocks): the host op's seconds less the op's own units (eager_host.HOST_UNITS)."""
    (host,) = {op.seconds for op in _computes(cfg)[f"{name}.host"]}
    return host - (eager_host.block_host_s(name, _tiny(cfg)) or 0.0)


def test_the_constants_are_the_traces_reading():
    mod = load_script("sac_host_cost")
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


def test_the_recompute_runs_its_policy_on_the_host_before_it():
    # The policy's Python runs on the host before the recompute's kernels are launched, in the
    # host chain of the block's other ops (eager_host): the host op carries the policy (90 ops
    # × 16.3 µs) and the forward's units the recompute re-runs (eager_host.SPANS); the device
    # op carries none of it (it did before, as its host_s, beside a host that ran ahead of it)
    cfg = _config()
    units = sum(eager_host.HOST_UNITS["fwd", k] for k in ("attn", "mlp", "elementwise"))
    assert _policy(cfg, "recompute.sac") == pytest.approx(RECOMPUTE, rel=1e-9)
    (host,) = {op.seconds for op in _computes(cfg)["recompute.sac.host"]}
    assert host == pytest.approx(RECOMPUTE + units * _tiny(cfg), rel=1e-12)
    assert {op.host_s for op in _computes(cfg)["recompute.sac"]} == {0.0}
    for block in ddlsim.build_workload(cfg).classes[0].program.blocks.values():
        ops = block.flat.ops
        for op in ops:
            if op.payload.name == "recompute.sac":
                assert [ops[d].payload.name for d in op.deps if ops[d].stream == "host"] == \
                    ["recompute.sac.host"]


def test_forward_host_spreads_the_policy_by_aten_ops():
    # A Llama block's forward by hand: attn 4 GEMMs + one attention kernel + 2 memory kernels,
    # mlp 3 GEMMs, elementwise 25 memory kernels. ATen ops: 4 per GEMM (28), 9 with the
    # attention kernel, the other 66 - 37 = 29 over the 27 memory kernels
    from types import SimpleNamespace
    sw = SimpleNamespace(selective_recompute="every_second_mm", host_dispatch="eager")
    gemm, flash, mem = Kernel("gemm", (1, 1, 1)), Kernel("flash"), Kernel("memory", bytes=1.0)
    ops = [Compute("fwd.attn", 1.0, kernels=(gemm,) * 3 + (mem, mem, flash, gemm)),
           Compute("fwd.mlp", 1.0, kernels=(gemm,) * 3),
           Compute("fwd.elementwise", 0.0, 1.0, kernels=(mem,) * 25)]
    attn, mlp, ew = sac.forward_host(ops, sw, "selective")
    per_memory = 29 / 27
    assert mlp.host_s == pytest.approx(FORWARD * 12 / 66, rel=1e-12)
    assert attn.host_s == pytest.approx(FORWARD * (16 + 9 + 2 * per_memory) / 66, rel=1e-12)
    assert ew.host_s == pytest.approx(FORWARD * 25 * per_memory / 66, rel=1e-12)
    assert sac.forward_host(ops, sw, "full") == ops


def test_the_forward_ops_share_the_blocks_policy_on_the_host():
    # each layer op's share (forward_host) joins its host op, beside the op's own units; the
    # three shares are the block's 66 × 34.8 µs, and the device ops keep none of it
    cfg = _config()
    ops = _computes(cfg)
    shares = [_policy(cfg, f"fwd.{n}") for n in ("attn", "mlp", "elementwise")]
    assert sum(shares) == pytest.approx(FORWARD, rel=1e-9)
    assert shares[1] == pytest.approx(FORWARD * 12 / 66, rel=1e-9)    # 3 GEMMs × 4 ATen ops
    assert all(op.host_s == 0 for name in ("fwd.attn", "fwd.mlp", "fwd.elementwise")
               for op in ops[name])
    # the ops outside the checkpointed blocks run no policy
    assert all(op.host_s == 0 for name in ("logits", "loss", "final_norm", "optimizer")
               for op in ops.get(name, ()))


@pytest.mark.parametrize("kwargs", [{"recompute": "none"}, {"recompute": "full"}])
def test_other_recomputation_pays_no_policy_time(kwargs):
    # the layer ops' host ops hold their measured units alone
    cfg = _config(**kwargs)
    names = [n for n in _computes(cfg) if n.endswith(".host") and not n.startswith("fsdp2.")]
    assert "fwd.attn.host" in names
    for name in names:
        assert _policy(cfg, name.removesuffix(".host")) == pytest.approx(0.0, abs=1e-15)
    assert all(op.host_s == 0 for group in _computes(cfg).values() for op in group)


def test_compiled_blocks_pay_no_policy_time():
    # one graph call a block: no per-op Python, neither the policy nor the ops' units
    ops = _computes(_config(compile=True))
    assert all(op.host_s == 0 for group in ops.values() for op in group)
    assert not [n for n in ops if n.endswith(".host") and not n.startswith("fsdp2.")]


def test_a_context_parallel_layer_from_the_partitioner_shares_the_same_total():
    # the partitioner's layers are one Loop op, which the host stream is not laid into
    # (eager_host): their ops keep the policy as their own host_s
    ops = [op for block in ddlsim.build_workload(_config(8192, cp=2)).classes[0]
           .program.blocks.values() if block.phase == "forward"
           for op in block.flat.ops if isinstance(op.payload, Compute)]
    layer = sum(op.payload.host_s * op.repeat for op in ops)
    assert layer == pytest.approx(8 * FORWARD, rel=1e-12)


def test_issued_by_host_moves_an_ops_host_work_onto_the_host():
    # an op's host_s joins its host op (with its units, where it has some) and leaves the op;
    # an op with neither gets no host op
    unit = 1e-5
    items = [Compute("fwd.mlp", 1.0, host_s=2e-4), Op(Compute("x", 1.0, host_s=3e-4), deps=(0,)),
             Op(Compute("y", 1.0), deps=(1,))]
    out, at = eager_host.issued_by_host(items, unit)
    assert [(o.payload.name, o.stream) for o in out] == [
        ("fwd.mlp.host", "host"), ("fwd.mlp", "compute"), ("x.host", "host"),
        ("x", "compute"), ("y", "compute")]
    assert out[0].payload.seconds == pytest.approx(eager_host.HOST_UNITS["fwd", "mlp"] * unit
                                                   + 2e-4)
    assert out[2].payload.seconds == pytest.approx(3e-4)
    assert all(o.payload.host_s == 0 for o in out)
    assert out[3].deps == (1, 2) and out[4].deps == (3,) and dict(at) == {0: 1, 1: 3, 2: 4}


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
    first = _policy(_config(8192), "fwd.attn")     # the first layer op's share of the policy
    assert first > 0.5e-3      # 4 GEMMs, the attention and 2 memory kernels: ~0.94 ms
    monkeypatch.setattr(sac, "FORWARD_OP_S", 0.0)
    monkeypatch.setattr(sac, "RECOMPUTE_OP_S", 0.0)
    without = {seq: ddlsim.predict(_config(seq)).iteration_time_s for seq in (2048, 8192)}
    # seq 2048: the host's chain outlasts the kernels, the policy lengthens it (≥ 10 ms over
    # 8 layers); seq 8192: the host's lead hides the policy but for the first op's share,
    # paid before the device has anything to run (it was hidden op by op before the host
    # stream carried it: each op's device time exceeded its host time)
    assert got[2048] - without[2048] > 10e-3
    assert got[8192] - without[8192] == pytest.approx(first, rel=1e-6)


@pytest.mark.parametrize("bad", [-1e-6, math.inf, math.nan])
def test_a_bad_host_time_is_refused(bad):
    with pytest.raises(ValueError, match=r"compute 'x': host_s must be finite and >= 0"):
        Compute("x", 0.0, host_s=bad)

"""ddlsim/workloads/resnet/host.py: the host time of an eager ResNet step per layer op, measured
(issue 29 cause 1). The table is what benchmarks/resnet_host_trace.py reads from the H200's
Kineto traces; the trace lays it on a host stream that runs ahead of the device, so a small
batch is host-bound and a large one is not slowed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels.host import launch_costs
from ddlsim.workloads.resnet import build
from ddlsim.workloads.resnet.host import HOST_UNITS, issued_by_host, layer_host_s
from ddlsim.workloads.trace import Collective, Compute, Kernel, Op

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import resnet_host_trace  # noqa: E402


def _cfg(batch: int, dtype: str = "fp16", dp: int = 1, software: dict | None = None) -> dict:
    """validate_device_h200's ResNet-50 row: DLE's step on one dgx-h200 GPU."""
    system = {"preset": "dgx-h200", "nodes": 1, "devices_per_node": dp}
    if software:
        system["software"] = software
    return {"model": {"preset": "resnet50", "weight_decay": "all", "zero_grad": "zero",
                      "memory_format": "channels_last", "input_pipeline": "none",
                      "grad_scaler": dtype == "fp16"},
            "parallel": {"data_parallel_size": dp},
            "train": {"micro_batch_size": batch, "global_batch_size": batch * dp,
                      "seq_length": 1, "dtype": dtype, "optimizer": "sgd"},
            "system": system}


def _h(cfg) -> float:
    return launch_costs(cfg.system.device.launch, "eager").host_s


def _blocks(cfg):
    return build.build_resnet(cfg).classes[0].program.blocks


@pytest.fixture(scope="module")
def measured() -> dict:
    return resnet_host_trace.mean_units()


def test_the_table_is_what_the_traces_read(measured):
    assert set(HOST_UNITS) <= set(measured)
    for key, units in HOST_UNITS.items():
        assert units == pytest.approx(measured[key], abs=0.006), key


def test_the_tiny_op_of_each_trace():
    got = [resnet_host_trace.tiny_op_us(p) for p in resnet_host_trace.TRACES]
    assert got == [pytest.approx(11.3, abs=0.05), pytest.approx(12.2, abs=0.05)]


def test_each_trace_groups_into_ddlsims_ops():
    """Per pass, one op per ddlsim layer op: 53 convolutions and batch norms, 49 ReLUs, 16
    residual adds, one pool each, the fc layer with the loss; every launch counted once."""
    for path in resnet_host_trace.TRACES:
        table = resnet_host_trace.kind_table(path)
        for pss in ("fwd", "bwd"):
            counts = {k: table[(pss, k)]["count"] for k in
                      ("conv", "cast", "bn", "relu", "add", "maxpool", "avgpool", "fc")}
            assert counts == {"conv": 53, "cast": 53, "bn": 53, "relu": 49, "add": 16,
                              "maxpool": 1, "avgpool": 1, "fc": 1}
        assert table[("update", "zero_grad")]["launches"] == 161
        assert table[("update", "optimizer")]["launches"] == 13     # torch 2.11's foreach SGD


def test_host_ops_before_each_layer_op():
    cfg = ddlsim.load_config(_cfg(32))
    ops = _blocks(cfg)["F"].ops
    names = [op.name for op in ops]
    at = names.index("fwd.conv1")
    host = ops[at - 1]
    assert (host.name, host.stream) == ("fwd.conv1.host", "host")
    assert host.payload.seconds == pytest.approx((5.34 + 1.77) * _h(cfg))   # conv + its cast
    assert at - 1 in ops[at].deps
    relu = ops[names.index("fwd.layer1.0.relu1.host")]
    assert relu.payload.seconds == pytest.approx(1.91 * _h(cfg))
    assert relu.deps == ()                      # the host runs ahead: it waits for nothing


def test_backward_and_update_host_ops():
    cfg = ddlsim.load_config(_cfg(32))
    blocks = _blocks(cfg)
    bwd = {op.name: op for op in blocks["B.sync"].ops}
    assert bwd["bwd.fc.host"].payload.seconds == pytest.approx(125.06 * _h(cfg))
    assert bwd["bwd.conv1.host"].payload.seconds == pytest.approx((14.86 + 3.75) * _h(cfg))
    upd = {op.name: op for op in blocks["update"].ops}
    assert upd["grad_scaler.host"].payload.seconds == pytest.approx(59.37 * _h(cfg))
    assert upd["zero_grad"].payload.host_s == pytest.approx((227.05 - 161) * _h(cfg))
    assert "optimizer.host" not in upd          # ddlsim's per-tensor SGD launches more


def test_no_cast_without_autocast():
    cfg = ddlsim.load_config(_cfg(32, dtype="tf32"))
    ops = {op.name: op for op in _blocks(cfg)["F"].ops}
    assert ops["fwd.conv1.host"].payload.seconds == pytest.approx(5.34 * _h(cfg))
    assert layer_host_s("fwd", "conv", 2, 1.0) == pytest.approx(5.34 - 2)
    assert layer_host_s("fwd", "conv", 2, 1.0, autocast=True) == pytest.approx(5.34 + 1.77 - 2)
    assert layer_host_s("fwd", "unknown", 2, 1.0) == 0.0


def test_compiled_dispatch_runs_no_per_op_host_work():
    cfg = ddlsim.load_config(_cfg(32, software={"kernels": {"host_dispatch": "compiled"}}))
    blocks = _blocks(cfg)
    assert not any(op.stream == "host" for b in blocks.values() for op in b.ops)
    assert {op.name: op for op in blocks["update"].ops}["zero_grad"].payload.host_s == 0.0


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_a_small_batch_is_host_bound(engine):
    """Batch 32: the step lasts at least the host's work (before: 11.2 ms, the kernels' launches
    alone); the H200 measured 25.4-30.9 ms."""
    cfg = ddlsim.load_config(_cfg(32))
    host = sum(op.payload.seconds for b in ("F", "B.sync", "update")
               for op in _blocks(cfg)[b].ops if op.stream == "host")
    step = ddlsim.predict(cfg, engine).iteration_time_s
    assert host > 0.015
    assert step >= host


@pytest.mark.parametrize("batch", [128, 256])
def test_a_device_bound_step_hardly_moves(batch, monkeypatch):
    """The host runs ahead of the device: at batch 256 the host ops add about 1 % (zero_grad's
    per-parameter host work, issued after the GradScaler's wait with the device idle); at 128,
    with the H200's measured launch figures (7.2 us a kernel on the host), the host's lead
    drains and binds part of the step, +17 % (measured: 26.8 ms at 128, 14 % above half of
    256's 47.0 ms)."""
    cfg = ddlsim.load_config(_cfg(batch))
    with_host = ddlsim.predict(cfg).iteration_time_s
    monkeypatch.setattr(build, "_host_seconds", lambda cfg: {})
    monkeypatch.setattr(build, "layer_host_s", lambda *a, **k: 0.0)
    without = ddlsim.predict(cfg).iteration_time_s
    assert with_host >= without
    assert with_host / without - 1 < (0.015 if batch == 256 else 0.20)


def test_data_parallel_backward_keeps_its_buckets():
    cfg = ddlsim.load_config(_cfg(64, dp=2))
    ops = _blocks(cfg)["B.sync"].ops
    for i, op in enumerate(ops):
        assert all(d < i for d in op.deps)
        if isinstance(op.payload, Collective):
            assert ops[op.deps[0]].stream == "compute"    # a bucket after its last layer
    a = ddlsim.predict(cfg, "analytical").iteration_time_s
    d = ddlsim.predict(cfg, "des").iteration_time_s
    assert a == pytest.approx(d, rel=0.02)


def test_issued_by_host_reindexes_dependencies():
    c = Compute("x", 0.0, kind="elementwise", kernels=(Kernel("memory", bytes=8.0),))
    coll = Collective("g", "all_reduce", "dp", 8.0)
    ops = (Op(c), Op(coll, stream="dp", deps=(0,)), Op(Compute("y", 0.0), deps=(1,)))
    out = issued_by_host(ops, {"x": 1e-5, "y": 2e-5})
    assert [(o.name, o.stream, o.deps) for o in out] == [
        ("x.host", "host", ()), ("x", "compute", (0,)), ("g", "dp", (1,)),
        ("y.host", "host", ()), ("y", "compute", (2, 3))]
    assert out[0].payload.seconds == 1e-5

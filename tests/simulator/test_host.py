"""Host and launch time per kernel (ddlsim/simulator/kernels/host.py, docs/compute.md): each
figure derived by hand from the presets' ``device.launch`` facts, which cite A. Gray, "Getting
Started with CUDA Graphs" (NVIDIA, 2019): a 2.9 µs kernel runs at 3.8 µs per kernel launched
back to back on a stream and 3.4 µs in a graph; and pytorch/pytorch#41383: ~2 µs of host
time per eager op from Python."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config_system import LaunchSpec
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels import kernel_device, op_time
from ddlsim.simulator.kernels.host import (NO_LAUNCH, Launch, launch_costs, stream_time,
                                           stream_times)
from ddlsim.workloads.trace import Compute, Kernel

US = 1e-6
FACTS = LaunchSpec(host_launch_s=3.8 * US, eager_op_s=2 * US, stream_gap_s=0.9 * US,
                   graph_gap_s=0.5 * US)


def _system(host_dispatch: str | None = None, preset: str = "dgx-h100", dtype: str = "bf16"):
    software = {"stack": "megatron-core-2024"}
    if host_dispatch:
        software["kernels"] = {"host_dispatch": host_dispatch}
    cfg = {"model": "gpt3-760m",
           "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                     "dtype": dtype},
           "system": {"preset": preset, "nodes": 1, "software": software}}
    return ddlsim.load_config(cfg)


@pytest.mark.parametrize("mode, host, gap", [("eager", 5.8, 0.9), ("compiled", 3.8, 0.9),
                                             ("cuda_graphs", 0.0, 0.5)])
def test_each_mode_pays_its_part_of_the_launch_path(mode, host, gap):
    got = launch_costs(FACTS, mode)
    assert got.host_s == pytest.approx(host * US) and got.gap_s == pytest.approx(gap * US)


def test_the_blogs_kernel_comes_out_at_its_measured_rate():
    # 20 kernels of 2.9 µs: compiled (C++ launches) 3.8 µs each, in a graph 3.4 µs each
    for mode, per_kernel in (("compiled", 3.8), ("cuda_graphs", 3.4)):
        t = stream_time(20 * 2.9 * US, 20, launch_costs(FACTS, mode))
        assert t / 20 == pytest.approx(per_kernel * US, rel=1e-12)


def test_device_bound_and_host_bound_ops():
    launch = Launch(host_s=10 * US, gap_s=1 * US)
    assert stream_time(1000 * US, 4, launch) == pytest.approx(1004 * US)   # device-bound
    assert stream_time(8 * US, 4, launch) == pytest.approx(40 * US)        # host-bound
    assert stream_time(5 * US, 0, launch) == 5 * US                        # nothing launched
    assert stream_time(5 * US, 3, NO_LAUNCH) == 5 * US                     # no facts
    arr = stream_times([1000 * US, 8 * US, 5 * US], [4, 4, 0], launch)
    assert list(arr) == pytest.approx([1004 * US, 40 * US, 5 * US])


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="eager, compiled, cuda_graphs"):
        launch_costs(FACTS, "jit")


def test_op_time_applies_the_rule_to_an_ops_kernels():
    # 100 memory kernels of 33.5 kB on an H100 (3.35 TB/s × 0.90): 11.1 ns each on the device
    # eager: host-bound, 100 × 5.8 µs; CUDA graphs: 100 × (11.1 ns + 0.5 µs)
    op = Compute("ew", 0.0, 100 * 33.5e3, kind="elementwise",
                 kernels=tuple(Kernel("memory", bytes=33.5e3) for _ in range(100)))
    each = 33.5e3 / (3.35e12 * 0.90)
    eager = op_time(op, kernel_device(_system("eager").system))
    graphs = op_time(op, kernel_device(_system("cuda_graphs").system))
    assert eager == pytest.approx(100 * 5.8 * US, rel=1e-12)
    assert graphs == pytest.approx(100 * (each + 0.5 * US), rel=1e-12)


def test_an_op_without_kernels_is_one_launch_and_an_empty_op_none():
    dev = kernel_device(_system("eager").system)
    tiny = Compute("loss", 0.0, 1e3, kind="elementwise")
    assert op_time(tiny, dev) == pytest.approx(5.8 * US, rel=1e-12)
    assert op_time(Compute("nothing", 0.0, 0.0, kind="elementwise"), dev) == 0.0


def test_every_cuda_preset_has_launch_facts_and_the_cpu_preset_none():
    for preset in ("dgx-a100", "dgx-h100", "dgx1-v100", "dgx2-v100"):
        system = _system(preset=preset, dtype="fp16").system
        assert kernel_device(system).launch.host_s > 0, preset
    cpu = ddlsim.load_config({"model": "gpt3-760m", "train": {
        "micro_batch_size": 1, "global_batch_size": 10, "seq_length": 1024},
        "system": {"preset": "cpu-10gbe"}}).system
    assert kernel_device(cpu).launch == NO_LAUNCH


def test_graphs_make_a_small_model_faster_and_eager_never_faster():
    times = {m: ddlsim.predict(_system(m)).iteration_time_s
             for m in ("eager", "compiled", "cuda_graphs")}
    assert times["eager"] > times["compiled"] > times["cuda_graphs"]


def test_a_bad_dispatch_mode_names_the_field_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        _system("graphs")
    msg = str(err.value)
    assert "host_dispatch" in msg and "'graphs'" in msg and "cuda_graphs" in msg

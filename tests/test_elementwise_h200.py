"""The H200's measured element-wise kernel rates (ddlsim/data/systems.yaml, dgx-h200's
``elementwise_efficiency``): torch's fused norm kernels and torchtitan's complex RoPE carry
classes of their own (simulator/kernels/elementwise.py: fused_norm_class; rotary.py: rope_classes), which
dgx-h200 times at the rates measured on that GPU; the microbenchmark rows the figures cite
give them back; another device without the classes runs the kernels at its streaming rate."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.kernels import kernel_device
from ddlsim.simulator.kernels.elementwise import ELEMENTWISE_CLASSES
from ddlsim.workloads.decoder.layerkernels import layer_kernels

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ROOT = Path(__file__).parents[1]
MEMORY_CSV = ROOT / "benchmarks/data/device_h200_2026-11-30/run1/kernels/memory.csv"
EXAMPLE = ROOT / "examples" / "llama3-8b-fsdp2-h100.yaml"
NEW = ("fused_rmsnorm", "fused_rmsnorm_backward", "fused_layernorm", "fused_layernorm_backward",
       "rope_upcast", "rope_complex_mul")


def _cfg(system: str, **kernels):
    """torchtitan's Llama 3.1 8B on one GPU of ``system``, PyTorch 2.11's fused RMSNorm."""
    return ddlsim.load_config(str(EXAMPLE), [
        f"system.preset={system}", "system.nodes=1", "system.devices_per_node=1",
        "parallel.data_parallel_size=1", "train.seq_length=8192",
        "system.software={stack: torchtitan-2025, kernels: " + str(
            {"fused_layernorm": True, **kernels}).replace("'", "") + "}"])


def test_the_new_classes_are_registered_and_only_dgx_h200_has_them():
    assert set(NEW) <= set(ELEMENTWISE_CLASSES)
    h200 = kernel_device(_cfg("dgx-h200").system)
    h100 = kernel_device(_cfg("dgx-h100").system)
    for c in NEW:
        assert h200.pass_Bps(c) < h200.memory_Bps
        assert h100.pass_Bps(c) == h100.memory_Bps


def _row(kernel: str, hidden: str = "4096") -> dict:
    """memory.csv's row of ``kernel`` (rows of Llama 3.1 8B's width, 4,096, where it has
    several)."""
    rows = [r for r in csv.DictReader(MEMORY_CSV.open()) if r["kernel"] == kernel]
    return next(r for r in rows if r["hidden"] in (hidden, ""))


@pytest.mark.parametrize("cls, kernels, bytes_per_element", [
    ("fused_rmsnorm", ["rmsnorm_fwd"], [4]),        # torch's fused rms_norm: read, write (2d)
    ("fused_layernorm", ["layernorm_fwd"], [4]),
    ("fused_layernorm_backward", ["layernorm_bwd"], [10]),   # two kernels: 3d, then 2d
    ("norm", ["rmsnorm_composite_fwd"], [36]),      # the composite RMSNorm's 8 kernels
    ("activation", ["gelu_tanh"], [4]),
    ("softmax", ["softmax_fwd", "scale_mask_fill"], [4, 8]),   # the class's two rows together
    ("softmax_backward", ["softmax_bwd"], [12]),    # grad * output 3d, the kernel 3d
])
def test_the_microbenchmarked_classes_are_their_rows(cls, kernels, bytes_per_element):
    # ddlsim's bytes over the measured seconds
    rows = [_row(k) for k in kernels]
    rate = (sum(b * float(r["elements"]) for b, r in zip(bytes_per_element, rows))
            / sum(float(r["seconds"]) for r in rows))
    assert kernel_device(_cfg("dgx-h200").system).pass_Bps(cls) == pytest.approx(rate, rel=2e-3)


def test_torchtitans_layer_kernels_carry_the_classes():
    cfg = _cfg("dgx-h200")
    k = layer_kernels(cfg.model.shape(), cfg.software, 1, 8192, 1, False, "bf16")
    variants = [x.variant for x in k["ew"]]
    assert variants[:2] == ["fused_rmsnorm"] * 2
    # the complex RoPE per q and k: upcast, complex multiply, cast back (streaming)
    assert variants[-6:] == ["rope_upcast", "rope_complex_mul", ""] * 2
    bwd = [x.variant for x in k["bwd.ew"]]
    assert bwd[:4] == ["fused_rmsnorm_backward"] * 4          # two kernels per norm
    assert bwd[-8:] == ["rope_upcast", "", "rope_complex_mul", ""] * 2   # conj unclassed


@pytest.mark.parametrize("sets", [{"compile": True}, {"fused_rope": True}])
def test_inductors_and_fused_kernels_carry_none(sets):
    cfg = _cfg("dgx-h200", **sets)
    k = layer_kernels(cfg.model.shape(), cfg.software, 1, 8192, 1, False, "bf16")
    got = {x.variant for x in k["ew"] + k["bwd.ew"]}
    if "compile" in sets:
        assert not got & {"fused_rmsnorm", "fused_rmsnorm_backward"}
    else:
        assert not got & {"rope_upcast", "rope_complex_mul"}


def test_transformer_engines_norms_carry_none():
    # ZeRO-1: Megatron-Core's FSDP2 refuses the stack's gradient accumulation fusion
    cfg = ddlsim.load_config(str(EXAMPLE), ["system.software={stack: megatron-core-2025}",
                                            "parallel.zero_stage=1"])
    k = layer_kernels(cfg.model.shape(), cfg.software, 1, 4096, 1, False, "bf16")
    assert not {x.variant for x in k["ew"] + k["bwd.ew"]} & set(NEW)

"""A search grid's distinct kernels timed in one call (issue 27's speed target; task H3,
2026-11-30): :func:`ddlsim.simulator.kernels.device.kernel_times` times the GEMMs of one
dtype, variant and accumulation with one array call of the GEMM model, where
:func:`~ddlsim.simulator.kernels.device.kernel_time` took a few dozen numpy operations on one
value per kernel; the search's stage pieces fill the kernel model's memo with them before
lowering (:func:`ddlsim.search.blocks._time_kernels`). The specification is the kernel
model one kernel at a time: the same float, of the same type, for every kernel on every
bundled system."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.config import SystemConfig
from ddlsim.configload import resolve_section
from ddlsim.presets import list_presets
from ddlsim.search import blocks
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.spec import Constraints
from ddlsim.simulator.kernels import device
from ddlsim.simulator.kernels.device import kernel_device, kernel_time, kernel_times
from ddlsim.simulator.kernels.fp8recipe import FP8_GEMM_KERNELS
from ddlsim.workloads.payloads import Kernel

SYSTEMS = sorted(list_presets("system")["system"])


def _kernels(rng: np.random.Generator, dtypes: list[str]) -> list[Kernel]:
    """GEMMs of many shapes (one row to a few waves of tiles, batched), dtypes, FP8 kernel
    variants, bytes of their own and accumulations, with attention and memory kernels
    between them."""
    out = []
    variants = ["", *FP8_GEMM_KERNELS]
    for _ in range(400):
        pick = rng.random()
        dtype = str(rng.choice(dtypes))
        if pick < 0.1:
            out.append(Kernel("memory", bytes=float(rng.integers(1, 1 << 30)), dtype=dtype))
        elif pick < 0.2:
            out.append(Kernel("flash", (2048.0, 2048.0, 128.0), batch=32.0,
                              flops=float(rng.integers(1, 1 << 40)),
                              bytes=float(rng.integers(1, 1 << 28)), dtype=dtype))
        else:
            shape = tuple(float(x) for x in rng.choice([1, 7, 64, 100, 128, 1000, 2048, 3072,
                                                        8192, 12288, 50257], 3))
            out.append(Kernel("gemm", shape, batch=float(rng.choice([1, 1, 1, 2, 48, 96])),
                              dtype=dtype,
                              variant=str(rng.choice(variants)) if dtype == "fp8" else "",
                              bytes=float(rng.integers(1, 1 << 30)) if rng.random() < 0.2
                              else 0.0,
                              accumulate_bytes=float(rng.choice([0.0, 0.0, 4.0]))))
    return out


@pytest.mark.filterwarnings("ignore:system.device .* has no matmul ceiling measured with")
@pytest.mark.parametrize("system", SYSTEMS)
def test_kernels_timed_at_once_as_one_by_one(system):
    dev = kernel_device(SystemConfig.model_validate(
        resolve_section("system", {"preset": system, "nodes": 1})))
    kernels = _kernels(np.random.default_rng(SYSTEMS.index(system)),
                       sorted({*dev.peak, "fp8", "bf16"}))
    got = kernel_times(kernels, dev)
    want = [kernel_time(k, dev) for k in kernels]
    assert [type(x) for x in got] == [type(x) for x in want]
    assert np.array_equal(np.array(got).view(np.int64),
                          np.array(want, dtype=float).view(np.int64))   # bit for bit


def test_a_grids_kernels_are_timed_in_one_call_before_lowering(monkeypatch):
    calls: list[int] = []
    one_by_one: list[int] = []
    real, single = device.kernel_times, device.kernel_time

    def counted(kernels, dev):
        calls.append(len(kernels))
        return real(kernels, dev)

    def alone(k, dev, efficiency=None):
        one_by_one.append(k.kind)
        return single(k, dev, efficiency)
    monkeypatch.setattr(blocks, "kernel_times", counted)
    monkeypatch.setattr(device, "kernel_time", alone)
    base = {"model": "gpt3-1.3b", "parallel": {}, "system": {"preset": "dgx-a100", "nodes": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}}
    evaluate_grid(base, None, [], {"parallel.tensor_model_parallel_size": [1, 2, 4],
                                   "train.recompute": ["none", "full"]},
                  Constraints(must_fit=False))
    assert len(calls) == 1 and calls[0] > 10
    # no GEMM is timed one by one (the attention and memory kernels are)
    assert "gemm" not in one_by_one and one_by_one

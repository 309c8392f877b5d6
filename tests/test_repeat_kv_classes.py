"""K/V's repeat to the query heads (simulator/kernels/repeat_kv.py) as two kernels with their
own classes: the forward's broadcast copy (``repeat_kv``) and the backward's sum of the
repeated gradient (``repeat_kv_backward``: autograd's ``expand`` backward, ``sum_to_size``).
dgx-h200 times each at the rate its kernels ran in the H200 step's Kineto trace; a device
without the classes streams both."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from benchscripts import load_script
from ddlsim.simulator.kernels import kernel_device, kernel_time
from ddlsim.simulator.kernels.elementwise import ELEMENTWISE_CLASSES
from ddlsim.simulator.kernels.repeat_kv import repeat_kv_kernels
from ddlsim.workloads.decoder.layerkernels import layer_kernels

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLE = Path(__file__).parents[1] / "examples" / "llama3-8b-fsdp2-h100.yaml"
CLASSES = ("repeat_kv", "repeat_kv_backward")
# Llama 3.1 8B on one rank at 8,192 tokens: 32 query heads, 8 K/V heads, d 128, bf16
TOKENS, A, G, D, DT = 8192, 32, 8, 128, 2
ONE = TOKENS * (A + G) * D * DT        # read g heads, write a (or back): 83,886,080 B


def _cfg(system: str, **kernels):
    """torchtitan's Llama 3.1 8B on one GPU of ``system`` (torchtitan-2025 repeats K/V)."""
    return ddlsim.load_config(str(EXAMPLE), [
        f"system.preset={system}", "system.nodes=1", "system.devices_per_node=1",
        "parallel.data_parallel_size=1", "train.seq_length=8192",
        "system.software={stack: torchtitan-2025, kernels: " + str(kernels).replace("'", "")
        + "}"])


def _layer(cfg) -> dict:
    return layer_kernels(cfg.model.shape(), cfg.software, 1, 8192, 1, False, "bf16")


@pytest.mark.parametrize("backward, cls", [(False, "repeat_kv"), (True, "repeat_kv_backward")])
def test_eager_forward_and_backward_are_two_kernels_each_of_their_class(backward, cls):
    got = repeat_kv_kernels(TOKENS, A, G, D, DT, "bf16", False, backward)
    assert [(k.kind, k.bytes, k.variant) for k in got] == [("memory", ONE, cls)] * 2


def test_compiled_kernels_stay_unclassed():
    for backward in (False, True):
        got = repeat_kv_kernels(TOKENS, A, G, D, DT, "bf16", True, backward)
        assert [(k.bytes, k.variant) for k in got] == [(TOKENS * 2 * A * D * DT, "")]


def test_the_layer_runs_the_copy_forward_and_the_reduce_backward():
    k = _layer(_cfg("dgx-h200"))
    classes = lambda part: [x.variant for x in k[part] if x.variant in CLASSES]  # noqa: E731
    assert classes("attn.qkv") == classes("repeat_kv") == classes("recompute") == \
        ["repeat_kv"] * 2
    assert classes("bwd.attn.proj") == classes("bwd.repeat_kv") == ["repeat_kv_backward"] * 2
    assert "repeat_kv" not in [x.variant for x in k["bwd.attn"]]


def test_only_dgx_h200_has_the_classes():
    assert set(CLASSES) <= set(ELEMENTWISE_CLASSES)
    h200, h100 = (kernel_device(_cfg(s).system) for s in ("dgx-h200", "dgx-h100"))
    fwd, bwd = (repeat_kv_kernels(TOKENS, A, G, D, DT, "bf16", False, b) for b in (False, True))
    # dgx-h200: 0.222 and 0.396 of 4.8 TB/s (systems.yaml); the reduce is the faster one
    assert kernel_time(fwd[0], h200) == pytest.approx(ONE / (0.222 * 4.8e12))
    assert kernel_time(bwd[0], h200) == pytest.approx(ONE / (0.396 * 4.8e12))
    assert kernel_time(fwd[0], h100) == kernel_time(bwd[0], h100) == ONE / h100.memory_Bps


def test_the_h200_rates_are_the_traces_kernels_at_ddlsims_bytes():
    kv = load_script("kineto_vs_ddlsim")
    events = kv.load_events(str(kv.TRACE))
    rows = {(r["phase"], r["op"]): r for r in
            kv.ew_op_table(kv.device_kernels(events), kv.layer_windows(events), kv.load_config())
            if r["op"] == "repeat_kv"}
    assert {n for n in (r["n"] for r in rows.values())} == {16}      # 8 blocks, K and V

    def rate(*phases):
        return 16 * ONE * len(phases) / (1e-3 * sum(rows[(p, "repeat_kv")]["ms"]
                                                    for p in phases))
    dev = kernel_device(_cfg("dgx-h200").system)
    # the copies of the forward and of the recomputation together, as one class
    assert dev.pass_Bps("repeat_kv") == pytest.approx(rate("forward", "recomputed"), rel=2e-3)
    assert dev.pass_Bps("repeat_kv_backward") == pytest.approx(rate("backward"), rel=2e-3)

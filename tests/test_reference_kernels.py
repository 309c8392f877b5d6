"""The reference trainer's element-wise kernel classes: the bytes its microbenchmark counts are
ddlsim's own recipes (derived here by hand), the classes the cost model gives a GeLU and the
optimizer, and the optimizer step timed at its class's bandwidth (ddlsim/reference/kernels.py,
ddlsim/simulator/kernels/elementwise.py)."""

import pytest

from ddlsim.reference.gpt2 import GPTShape
from ddlsim.reference.kernels import CLASS_KERNELS, class_kernels, class_rates, efficiencies
from ddlsim.simulator.kernels.elementwise import activation_classes

TINY = GPTShape(layers=1, hidden=16, heads=2, vocab=32, seq=8, batch=2)


def test_counted_bytes_are_ddlsims_recipes():
    got = class_kernels(TINY)
    assert tuple(got) == CLASS_KERNELS
    x = 2 * 8 * 16                       # T·h
    # unfused LayerNorm in fp32: statistics (read 4), normalise (read, write 8), affine (8)
    assert got["norm"][1] == 20 * x
    assert got["norm_backward"][1] == 40 * x
    # the GeLU kernel alone on T·4h (the bias add before it is a plain pass): read, write
    assert got["activation"][1] == 8 * 4 * x
    assert got["activation_backward"][1] == 16 * 4 * x
    # fused Adam 28 B and the gradient norm's read, 4 B, per parameter of the padded buffer
    assert got["optimizer"][1] == 32 * TINY.padded
    # the unfused softmax in fp32 over the b·a·s² scores: scale, mask, softmax (read + write
    # 4 each); backward: softmax's (read P and dP, write dS: 12), the mask's and the scale's
    scores = 2 * 2 * 8 * 8
    assert got["softmax"][1] == 24 * scores
    assert got["softmax_backward"][1] == 28 * scores


def test_softmax_passes_run_at_their_class_bandwidth():
    # a device that measured the softmax's classes times its kernels at them, forward and
    # backward apart; one that did not, at its score-pass (else streaming) bandwidth as before
    from dataclasses import replace

    from ddlsim.simulator.kernels import kernel_time
    from ddlsim.simulator.kernels.attention import attention_kernels
    from ddlsim.simulator.kernels.device import KernelDevice
    dev = KernelDevice({"fp32": 1e12}, 1e10, None, {}, {}, scores_Bps=5e9)
    fwd, bwd = (attention_kernels("unfused", 2, 2, 8, 4, 4, True, back, "fp32",
                                  softmax_fp32=True) for back in (False, True))
    for kernels in (fwd, bwd):
        softmax = [k for k in kernels if k.variant.startswith("softmax")]
        assert len(softmax) == 3
        assert [kernel_time(k, dev) for k in softmax] == [k.bytes / 5e9 for k in softmax]
    classed = replace(dev, elementwise_Bps=(("softmax", 2e9), ("softmax_backward", 8e9)))
    assert [kernel_time(k, classed) for k in fwd if k.variant == "softmax"] == \
        [k.bytes / 2e9 for k in fwd if k.variant == "softmax"]
    assert [kernel_time(k, classed) for k in bwd if k.variant == "softmax_backward"] == \
        [k.bytes / 8e9 for k in bwd if k.variant == "softmax_backward"]
    # dropout stays at the score-pass bandwidth
    (drop,) = [k for k in fwd if k.kind == "memory" and k.variant == "scores"]
    assert kernel_time(drop, classed) == drop.bytes / 5e9


def test_rates_and_efficiencies():
    rates = class_rates(class_kernels(TINY), {name: 1 for name in CLASS_KERNELS})
    assert set(rates) == set(CLASS_KERNELS) and all(r > 0 for r in rates.values())
    assert efficiencies({"norm": 3e9, "optimizer": 1.5e10}, 1e10) == \
        {"norm": 0.3, "optimizer": 1.5}
    with pytest.raises(ValueError, match="stream_Bps must be > 0, got 0"):
        efficiencies(rates, 0.0)


def test_activation_classes():
    # a GeLU with its bias unfused: the bias add stays a plain pass, the GeLU is classed
    assert activation_classes(False, False, False, 2) == ["", "activation"]
    assert activation_classes(False, True, False, 1) == ["activation"]
    # Megatron-Core's fused SwiGLU keeps its class; an unfused SwiGLU and compile have none
    assert activation_classes(True, True, False, 1) == ["gated"]
    assert activation_classes(True, False, False, 2) == ["", ""]
    assert activation_classes(False, False, True, 2) == ["", ""]


def _optimizer_seconds(sets):
    """Device seconds of the example's optimizer step (its launch left out)."""
    from dataclasses import replace
    from pathlib import Path

    import ddlsim
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device, op_time
    from ddlsim.simulator.kernels.host import NO_LAUNCH
    from ddlsim.workloads.trace import Compute
    example = Path(__file__).parents[1] / "examples" / "wiki-gpt2-9ranks-reduce_scatter.yaml"
    cfg = ddlsim.load_config(str(example), list(sets))
    ops = [op.payload for b in build_workload(cfg).classes[0].program.blocks.values()
           for op in b.flat.ops if isinstance(op.payload, Compute)
           and op.payload.kind == "optimizer"]
    assert ops and not ops[0].kernels
    return op_time(ops[0], replace(kernel_device(cfg.system), launch=NO_LAUNCH))


def test_optimizer_step_runs_at_its_class_bandwidth():
    # the step is memory-bound: its bytes over the class's bandwidth, else the streaming one
    plain = _optimizer_seconds([])
    half = _optimizer_seconds(["system.device.elementwise_efficiency.optimizer=0.5"])
    fast = _optimizer_seconds(["system.device.elementwise_efficiency.optimizer=2"])
    assert half == pytest.approx(2 * plain, rel=1e-12)
    assert fast == pytest.approx(plain / 2, rel=1e-12)


def test_class_efficiency_above_ten_is_refused():
    from pathlib import Path

    import ddlsim
    from ddlsim.errors import ConfigError
    example = Path(__file__).parents[1] / "examples" / "wiki-gpt2-9ranks-reduce_scatter.yaml"
    with pytest.raises(ConfigError, match="elementwise_efficiency"):
        ddlsim.load_config(str(example), ["system.device.elementwise_efficiency.optimizer=11"])


def test_each_rate_takes_the_statistic_of_the_part_it_is_compared_in():
    from ddlsim.reference.interleaved import element_rates
    from ddlsim.reference.kernels import system_rates
    names = ["gradients", *(f"class.{c}" for c in CLASS_KERNELS)]
    # two ranks, three rounds: rank 1 twice as fast; "min" of the times is the highest rate
    doc = {"rates_by_round": [{n: [1e9, 3e9, 2e9] for n in names},
                              {n: [2e9, 6e9, 4e9] for n in names}]}
    assert element_rates(doc, "min")["gradients"] == pytest.approx(4.5e9)   # median(3, 6)
    assert element_rates(doc, "median")["gradients"] == pytest.approx(3e9)  # median(2, 4)
    stream, eff = system_rates(doc, "min", "median")
    assert stream == pytest.approx(4.5e9)
    # the forward and backward's classes with "min", the optimizer step with "median"
    assert eff["norm"] == 1.0 and eff["optimizer"] == pytest.approx(3 / 4.5, abs=1e-4)

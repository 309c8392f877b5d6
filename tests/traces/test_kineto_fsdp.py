"""Kineto traces without module events, placed by FSDP2's per-block ranges (issue 30): a
hand-made one-block step whose every op's label is known, and the H200 step of the repository
(``benchmarks/data/device_h200_2026-11-30/run1/llama``, taken without ``with_stack``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlsim.errors import ConfigError
from ddlsim.traces.kineto import parse_kineto, read_kineto
from ddlsim.traces.kineto_labels import Label
from ddlsim.traces.replay import predict_measured

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "data" / "device_h200_2026-11-30" / "run1" / "llama"
H200_TRACE = RUN / "llama_step_trace.json.gz"
H200_CONFIG = Path(__file__).parent / "data" / "llama8_h200_selective_op.yaml"
BWD = "autograd::engine::evaluate_function: "


class Step:
    """Events of one thread laid end to end: each ``op`` lasts ``dur`` µs after the last."""

    def __init__(self):
        self.events: list[dict] = []
        self.t = 0.0

    def range(self, name: str, dur: float = 1.0) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": self.t,
                            "dur": dur, "tid": 1, "args": {}})
        self.t += dur

    def op(self, name: str, dur: float, seq: int | None = None, inner=()) -> None:
        """An outermost op, with ``inner`` ``(name, seq)`` ops nested in its first µs …"""
        args = {} if seq is None else {"Sequence number": seq}
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": self.t,
                            "dur": dur, "tid": 1, "args": args})
        for i, (n, s) in enumerate(inner):
            self.events.append({"ph": "X", "cat": "cpu_op", "name": n, "ts": self.t + i + 0.5,
                                "dur": 0.5, "tid": 1,
                                "args": {} if s is None else {"Sequence number": s}})
        self.t += dur


def one_block() -> dict:
    """The root's and block 0's unshard, the embedding, torchtitan's Llama block (seq 10-25),
    the head, the loss; a backward of w2's node recomputing the block's first GEMM, wq's
    node, the reduce; the optimizer. Durations are distinct powers of two times 1 µs, in
    groups, so each label's sum is known."""
    s = Step()
    s.range("FSDP::root_pre_forward")
    s.range("FSDP::pre_forward")                       # the root unit's unshard: one cast
    s.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::to", "ts": s.t - 0.8,
                     "dur": 0.5, "tid": 1, "args": {"Sequence number": 9}})
    s.op("aten::embedding", 2, 9)
    s.range("FSDP::pre_forward (layers.0)", 3)         # block 0's unshard: a cast
    s.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::to", "ts": s.t - 2.5,
                     "dur": 2, "tid": 1, "args": {"Sequence number": 10}})
    block = [("aten::rms_norm", 1), ("aten::linear", 10), ("aten::linear", 10),
             ("aten::linear", 10), ("aten::mul", 4), ("aten::scaled_dot_product_attention", 20),
             ("aten::transpose", 4), ("aten::linear", 10), ("aten::add", 1),
             ("aten::rms_norm", 1), ("aten::linear", 30), ("aten::silu", 8),
             ("aten::linear", 30), ("aten::mul", 8), ("aten::linear", 30), ("aten::add", 1)]
    for i, (name, dur) in enumerate(block):
        s.op(name, dur, 10 + i)
    s.range("FSDP::post_forward (layers.0)")
    s.op("aten::rms_norm", 64, 30)
    s.op("aten::linear", 128, 31)
    s.op("aten::cross_entropy_loss", 256, 32)
    s.op(BWD + "MmBackward0", 100, 24, [("MmBackward0", 24), ("aten::linear", 501)])
    s.op(BWD + "MmBackward0", 200, 11, [("MmBackward0", 11), ("aten::mm", None)])
    s.range("FSDP::post_backward_reduce (layers.0)", 3)
    s.events.append({"ph": "X", "cat": "cpu_op", "name": "fsdp::chunk_cat", "ts": s.t - 2.5,
                     "dur": 2, "tid": 1, "args": {}})
    s.range("Optimizer.step#AdamW.step", 512)
    return {"traceEvents": s.events}


def test_ops_are_placed_by_fsdp2_ranges_and_op_names():
    m = parse_kineto(one_block())
    assert m.placement == "fsdp2-ranges" and m.layers == 1 and m.microbatches == 1
    assert m.unlabelled_s == 0.0 and m.compute_s == pytest.approx(m.window_s, rel=1e-12)
    got = {k: round(v * 1e6, 6) for k, v in m.seconds.items()}
    # each op is charged its span and the idle time before it (the ranges' µs around the
    # FSDP2 casts go to the op after them); µs by hand from one_block()
    assert got == {
        Label("forward", "unshard"): 0.5 + 0.5 + 2,      # the two casts, the range's head
        Label("forward", "embedding"): 0.3 + 2,          # the root range's tail, the lookup
        Label("forward", "elementwise", True): 0.5 + 1 + 1 + 1 + 1,  # the range's tail, norms,
        # residual adds; the post_forward range's µs pass to the final norm (at its end)
        Label("forward", "attn", True): 10 + 10 + 10 + 4 + 4 + 10,   # wq wk wv, RoPE, wo
        Label("forward", "attn_core", True): 20,
        Label("forward", "mlp", True): 30 + 8 + 30 + 8 + 30,         # w1 silu w3 mul w2
        Label("forward", "final_norm"): 1 + 64,
        Label("forward", "logits"): 128,
        Label("forward", "loss"): 256,
        Label("backward", "mlp", True): 100,             # w2's node (its recompute inside)
        Label("backward", "attn", True): 200,            # wq's node
        Label("backward", "reduce"): 0.5 + 2,
        Label("optimizer", "step"): 0.5 + 512,
    }


def test_device_kernels_of_a_recomputation_and_of_fsdp2_passes_have_their_own_labels():
    doc = one_block()
    ops = {(e["name"], e["args"].get("Sequence number")): e for e in doc["traceEvents"]
           if e["cat"] == "cpu_op"}
    kernels = [(("aten::linear", 501), "recompute"), (("aten::mm", None), "attn"),
               (("fsdp::chunk_cat", None), "reduce"), (("aten::to", 10), "unshard")]
    for i, (key, _) in enumerate(kernels):
        ops[key]["args"]["External id"] = 100 + i
        doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": 10 * i,
                                   "dur": 5, "args": {"External id": 100 + i}})
    m = parse_kineto(doc)
    assert {k.part for k in m.seconds} == {part for _, part in kernels}
    # kernels at 0, 10, 20, 30 µs, 5 µs each: each after the first also takes 5 µs of idle
    assert m.seconds[Label("backward", "recompute", True)] == pytest.approx(5e-6)
    assert m.seconds[Label("backward", "attn", True)] == pytest.approx(10e-6)
    assert m.seconds[Label("backward", "reduce")] == pytest.approx(10e-6)
    assert m.seconds[Label("forward", "unshard")] == pytest.approx(10e-6)


def test_neither_modules_nor_fsdp2_ranges_is_refused():
    doc = one_block()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("FSDP")]
    with pytest.raises(ConfigError, match=r"no module events .* and no FSDP2 per-block ranges "
                                          r"\(FSDP::pre_forward \(layers.N\)\)"):
        parse_kineto(doc, source="t.json")


@pytest.fixture(scope="module")
def h200():
    return read_kineto(H200_TRACE)


def test_the_h200_step_without_module_events_is_imported(h200):
    assert h200.placement == "fsdp2-ranges" and h200.layers == 8 and h200.microbatches == 1
    assert h200.unlabelled_s == 0.0 and h200.communication_s == 0.0
    assert h200.compute_s == pytest.approx(h200.window_s, rel=1e-12)
    parts = {(k.phase, k.part) for k in h200.seconds}
    for phase in ("forward", "backward"):
        for part in ("attn", "attn_core", "mlp", "elementwise", "logits", "loss", "unshard"):
            assert (phase, part) in parts
    assert {("backward", "recompute"), ("backward", "reduce"), ("optimizer", "step")} <= parts
    # the blocks' GEMMs outweigh their norms and residual adds
    assert h200.seconds[Label("forward", "mlp", True)] > \
        10 * h200.seconds[Label("forward", "elementwise", True)]


def test_the_h200_step_is_re_predicted_within_5_percent_of_its_measured_median(h200):
    median = json.loads((RUN / "llama_step.json").read_text())
    step_s = next(v["step_s"] for v in median["variants"] if v["variant"] == "selective_op")
    r = predict_measured(H200_CONFIG, h200)
    assert r.binding.unbound == {}
    assert abs(r.profiled.iteration_time_s / step_s - 1) < 0.05
    assert abs(r.profiled_error) < 0.05

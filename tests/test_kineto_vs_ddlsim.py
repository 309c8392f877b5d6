"""benchmarks/kineto_vs_ddlsim.py: a hand-made Kineto trace of one layer (FSDP2's unshard,
the seven forward GEMMs, the recomputation, a backward node's two GEMMs, the reduce) placed
kernel by kernel, and the H200 trace of the repository read as the brief counted it."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

kv = load_script("kineto_vs_ddlsim")

CAST = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>"
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
FWD, BWD = 1, 2


class Trace:
    """Builds Kineto events: host ops with their kernels, one ``External id`` each."""

    def __init__(self):
        self.events: list[dict] = []
        self.ext = 0

    def range(self, name: str, ts: float, dur: float, tid: int = FWD) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts,
                            "dur": dur, "tid": tid, "args": {}})

    def op(self, chain: list, ts: float, tid: int, kernel: str | None = None,
           k_ts: float = 0.0, k_dur: float = 0.0, cat: str = "kernel") -> None:
        """``chain``: (name, sequence number or None), outermost first, nested in time; the
        innermost launches ``kernel``."""
        for depth, (name, seq) in enumerate(chain):
            self.ext += 1
            args = {"External id": self.ext} | ({"Sequence number": seq} if seq else {})
            self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": ts + depth,
                                "dur": 10 - 2 * depth, "tid": tid, "args": args})
        if kernel:
            self.events.append({"ph": "X", "cat": cat, "name": kernel, "ts": k_ts,
                                "dur": k_dur, "args": {"External id": self.ext}})


def one_layer() -> Trace:
    """Layer 0: unshard (a cast, a copy), wq…w2 (seq 11…17), the head; in the backward the
    unshard again, w2's node (seq 17) recomputing wk wo w3 before its two GEMMs, a silu
    backward, then the reduce (chunk_cat, copy); the optimizer."""
    t = Trace()
    t.range("FSDP::pre_forward (layers.0)", 0, 15)
    t.op([("aten::to", None), ("aten::copy_", None)], 1, FWD, CAST, 100, 6)
    t.op([("aten::copy_", None)], 4, FWD, "Memcpy DtoD (Device -> Device)", 104, 4, "gpu_memcpy")
    for i in range(7):
        t.op([("aten::linear", 50 + i), ("aten::mm", 11 + i), ("PythonDispatchMode", None),
              ("aten::mm", None)], 20 + 20 * i, FWD, GEMM, 110 + 10 * i, 10 + i)
    t.op([("aten::silu", None)], 170, FWD, "void silu_kernel", 200, 3)
    t.range("FSDP::post_forward (layers.0)", 180, 5)
    t.op([("aten::linear", None), ("aten::mm", 30)], 200, FWD, GEMM, 210, 40)
    t.op([("aten::cross_entropy_loss", None), ("aten::_log_softmax", None)], 220, FWD,
         "cunn_SoftMaxForward", 250, 20)
    t.range("FSDP::pre_backward (layers.0)", 1000, 15, BWD)
    t.op([("aten::to", None)], 1001, BWD, CAST, 1100, 8)       # overlaps the GEMM below
    node = ("autograd::engine::evaluate_function: MmBackward0", 17)
    for i in range(3):
        t.op([node, ("MmBackward0", None), ("aten::linear", None), ("aten::mm", None),
              ("PythonDispatchMode", None), ("aten::mm", None)], 1020 + 20 * i, BWD, GEMM,
             1104 + 10 * i, 10)
    t.op([node, ("MmBackward0", None), ("aten::mm", None)], 1100, BWD, GEMM, 1140, 12)
    t.op([node, ("MmBackward0", None), ("aten::mm", None)], 1120, BWD, GEMM, 1152, 14)
    t.op([("autograd::engine::evaluate_function: SiluBackward0", 9),
          ("aten::silu_backward", None)], 1140, BWD, "void silu_backward_kernel", 1170, 5)
    t.range("FSDP::post_backward_reduce (layers.0)", 1300, 100, BWD)
    t.op([("fsdp::chunk_cat", None), ("aten::_chunk_cat", None)], 1301, BWD,
         "void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>", 1200, 30)
    t.op([("aten::copy_", None)], 1340, BWD, "Memcpy DtoD (Device -> Device)", 1230, 10,
         "gpu_memcpy")
    t.range("Optimizer.step#AdamW.step", 2000, 50)
    t.op([("aten::_fused_adamw_", None)], 2001, FWD, "multi_tensor_apply_kernel", 2100, 25)
    return t


@pytest.fixture(scope="module")
def placed():
    t = one_layer()
    ks = kv.device_kernels(t.events)
    windows = kv.layer_windows(t.events)
    return ks, windows


def test_each_kernel_lands_in_its_row(placed):
    ks, windows = placed
    rows = [kv.classify(k, kv.layer_of(k, windows)) for k in ks]
    assert rows == [
        "FSDP2 parameter cast fp32->bf16", "FSDP2 unshard copy", *["GEMM forward"] * 7,
        "element-wise forward", "output head GEMM", "cross-entropy",
        "FSDP2 parameter cast fp32->bf16", *["GEMM recomputed"] * 3, *["GEMM backward"] * 2,
        "element-wise backward", "FSDP2 chunk_cat bf16->fp32", "FSDP2 reduce copies",
        "optimizer"]


def test_gemms_named_by_call_order_and_sequence_number(placed):
    ks, windows = placed
    assert kv.name_gemms(ks, windows) == [
        *[("forward", 0, w, "-") for w in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")],
        ("forward", None, "output", "-"),
        *[("recomputed", 0, w, "-") for w in ("wk", "wo", "w3")],
        ("backward", 0, "w2", "wgrad"), ("backward", 0, "w2", "dgrad")]


def test_busy_shares_split_overlap_and_add_up_to_the_union(placed):
    ks, _ = placed
    shares = kv.busy_shares(ks)
    cast = next(i for i, k in enumerate(ks) if k.start_us == 1100)
    # the backward cast (1100-1108) overlaps the first recomputed GEMM (1104-1114) for 4 µs
    assert shares[cast] == pytest.approx(4 + 4 / 2)
    union = 0.0
    end = -math.inf
    for k in sorted(ks, key=lambda k: k.start_us):
        union += max(0.0, k.start_us + k.dur_us - max(k.start_us, end))
        end = max(end, k.start_us + k.dur_us)
    assert sum(shares) == pytest.approx(union)
    assert sum(shares) < sum(k.dur_us for k in ks)


def test_shapes_and_nearest_burst():
    dims = {"wk": (4096, 1024)}
    assert kv.gemm_shape("wk", "-", dims, 8192) == (8192, 1024, 4096)
    assert kv.gemm_shape("wk", "dgrad", dims, 8192) == (8192, 4096, 1024)
    assert kv.gemm_shape("wk", "wgrad", dims, 8192) == (4096, 1024, 8192)
    rows = [{"m": "1024", "n": "8192", "k": "4096", "batch": "1", "dtype": "fp16", "tflops": "600"},
            {"m": "8192", "n": "1024", "k": "4096", "batch": "1", "dtype": "bf16", "tflops": "650"},
            {"m": "8192", "n": "1024", "k": "4096", "batch": "1", "dtype": "fp8", "tflops": "1300"},
            {"m": "8192", "n": "8192", "k": "8192", "batch": "1", "dtype": "bf16", "tflops": "700"}]
    # both orders of (M, N) are as near: bf16 wins the tie, fp8 rows never count
    assert kv.nearest_burst((8192, 1024, 4096), rows)["tflops"] == "650"
    assert kv.nearest_burst((1024, 8192, 4000), rows[:1] + rows[3:])["tflops"] == "600"


def test_trace_without_events_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"schemaVersion": 1}))
    with pytest.raises(ValueError, match="no 'traceEvents' list"):
        kv.load_events(bad)
    good = tmp_path / "t.json.gz"
    with gzip.open(good, "wt") as fh:
        json.dump({"traceEvents": one_layer().events}, fh)
    assert len(kv.device_kernels(kv.load_events(good))) == 22


def test_ddlsim_rows_add_up_to_its_step_breakdown():
    kb = load_script("kernel_breakdown")
    cfg = kv.load_config([])
    rows, gemms = kv.ddlsim_rows(cfg)
    out, _ = kb.step_breakdown(cfg)
    assert sum(rows.values()) == pytest.approx(sum(out.values()), rel=1e-12)
    gemm_rows = sum(v for r, v in rows.items() if "GEMM" in r)
    assert gemm_rows == pytest.approx(out["GEMM"] + out["output head GEMM"], rel=1e-12)
    # per layer 7 forward, 3 recomputed, 14 backward; the head 1 + 2
    assert len(gemms) == 8 * 24 + 3
    # ddlsim's FSDP2 passes at one rank (fsdp2_passes.py) fill the FSDP2 rows, each its ops'
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device, kernel_time, op_time
    prog, dev = build_workload(cfg).classes[0].program, kernel_device(cfg.system)

    def device_time(p):       # a row holds kernels' time (the launch gaps have their own)
        return sum(kernel_time(k, dev) for k in p.kernels) if p.kernels else op_time(p, dev)
    for name, row in kv.FSDP2_OPS.items():
        t = sum(device_time(o.payload) * o.repeat for st in prog.steps
                for o in prog.blocks[st.block].flat.ops
                if getattr(o.payload, "name", "") == name)
        assert t > 0 and rows[row] == pytest.approx(t, rel=1e-12), name


def test_the_h200_step_as_counted():
    """The repository's trace: 195 GEMMs named 8 x 24 + 3, each matched to ddlsim's list,
    and the totals the brief quotes (kernel sum 287.8 ms, GEMMs 161.1 ms)."""
    events = kv.load_events(kv.TRACE)
    ks, windows = kv.device_kernels(events), kv.layer_windows(events)
    assert sum(k.dur_us for k in ks) / 1e3 == pytest.approx(287.76, abs=0.01)
    names = kv.name_gemms(ks, windows)
    assert len(names) == 195 and not [n for n in names if n[2] in ("?",) or "mm" in n[2]]
    table = kv.gemm_table(ks, windows, kv.load_config([]), kv.ddlsim_rows(kv.load_config([]))[1],
                          [])
    assert all(g["matched"] == f"{g['n']}/{g['n']}" for g in table)
    assert sum(g["seconds"] for g in table) * 1e3 == pytest.approx(161.1, abs=0.05)
    rows = {r["row"]: r for r in kv.class_table(ks, windows, kv.ddlsim_rows(
        kv.load_config([]))[0])}
    assert rows["FSDP2 chunk_cat bf16->fp32"]["n"] == 9
    assert rows["attention"]["measured_ms"] == pytest.approx(32.03, abs=0.01)


def test_ddlsim_predicts_the_traced_step_as_validate_device_h200_does():
    """The config is validate_device_h200's of the traced row (dgx-h200, PyTorch 2.11's
    kernels), and ``--set`` applies after it: dgx-h100 gives another device and step."""
    vd = load_script("validate_device_h200")
    row = kv.traced_row()
    assert (row["layers"], row["seq"], row["batch"]) == (8, 8192, 1)
    assert row["measured_s"] == pytest.approx(0.2982, abs=1e-4)
    cfg = kv.load_config()
    assert cfg.system.name == vd.SYSTEM == "dgx-h200"
    assert cfg.train.recompute == "selective"
    assert {k: cfg.software.kernels[k] for k in vd.TORCH_2_11} == vd.TORCH_2_11
    h100 = kv.load_config(["system.preset=dgx-h100"])
    assert h100.system.name == "dgx-h100"
    assert h100.software.kernels["attention"] == "cudnn"     # the step's own settings kept
    assert sum(kv.ddlsim_rows(h100)[0].values()) > sum(kv.ddlsim_rows(cfg)[0].values())


def test_a_set_the_config_lacks_is_refused(capsys):
    assert kv.main(["--set", "system.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert "system.bogus=1" in err and "unknown key 'bogus'" in err


def test_the_traced_recomputation_stops_early():
    """llama_step.py's checkpoint stops early (validate_device_h200's LLAMA_STEP): the trace
    recomputes one residual add per block, not two, and so does ddlsim's op list."""
    from ddlsim.simulator.kernels import kernel_device, kernel_time
    from ddlsim.workloads.trace import Kernel
    events = kv.load_events(kv.TRACE)
    ks, windows = kv.device_kernels(events), kv.layer_windows(events)
    adds = [k for k in ks if kv.classify(k, kv.layer_of(k, windows)) == "element-wise recomputed"
            and kv.op_label(k) == "aten::add"]
    assert len(adds) == 8
    cfg = kv.load_config()
    assert cfg.software.kernels["activation_checkpoint"] == "non_reentrant_early_stop"
    rows, _ = kv.ddlsim_rows(cfg)
    add = kernel_time(Kernel("memory", bytes=3 * 2 * 8192 * 4096), kernel_device(cfg.system))
    assert rows["element-wise forward"] - rows["element-wise recomputed"] == \
        pytest.approx(8 * add, rel=1e-9)


def test_element_wise_rows_split_by_op():
    """ew_op_table parts the three element-wise rows, measured and ddlsim's, by op: each
    measured kernel of a block gets an op (none is "other"), ddlsim's parts add up to its
    rows, and torch launches as many kernels per op as ddlsim lists: the norms' backward two
    each (grad input, gamma: fused_norm_backward two_kernels), the complex rotary embedding
    three per tensor each way and the backward's conj of the frequencies (rope_form
    complex)."""
    events = kv.load_events(kv.TRACE)
    ks, windows = kv.device_kernels(events), kv.layer_windows(events)
    cfg = kv.load_config()
    table = kv.ew_op_table(ks, windows, cfg)
    rows = {r["row"]: r for r in kv.class_table(ks, windows, kv.ddlsim_rows(cfg)[0])}
    assert not [r for r in table if r["op"] == "other"]
    for phase in ("forward", "recomputed", "backward"):
        sub = [r for r in table if r["phase"] == phase]
        row = rows[f"element-wise {phase}"]
        assert sum(r["n"] for r in sub) == row["n"]
        assert sum(r["ms"] for r in sub) == pytest.approx(row["measured_ms"], rel=1e-9)
        assert sum(r["ddlsim_ms"] for r in sub) == pytest.approx(row["ddlsim_ms"], rel=1e-9)
    counts = {(r["phase"], r["op"]): (r["n"], r["ddlsim_n"]) for r in table}
    assert [k for k, (n, dn) in counts.items() if n != dn] == []
    assert counts[("backward", "norm")] == (32, 32)
    assert counts[("backward", "rope")] == (64, 64)

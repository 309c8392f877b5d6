"""A measured training step, kernel by kernel, against ddlsim's op list of the same step
(issues 29/30).

The measured step is the PyTorch profiler (Kineto) trace that ``benchmarks/device/llama_step.py``
wrote of one ``selective_op`` step on one H200 (``benchmarks/data/device_h200_2026-11-30/run1``,
README there): torchtitan's Llama 3.1 8B with 8 of its 32 blocks, sequence 8192, micro-batch 1,
FSDP2 forced on one GPU (bf16 parameters, fp32 reduce), torchtitan's op-level selective
activation checkpointing, fused AdamW. :mod:`kineto_kernels` places each device kernel by the
host ops that launched it (its row, the GEMMs' weights and gradients, busy shares); here ddlsim's
op list of the same step (:func:`load_config`) fills the same rows (:func:`ddlsim_rows`), and each
named GEMM, whose shape follows from its name and the model, is matched to a kernel of ddlsim's
list with the same phase and shape (:func:`gemm_table`).

It prints, per row, the measured kernels' summed and busy-share milliseconds beside ddlsim's;
the measured rows without GEMMs by launching op; the blocks' element-wise kernels by op (norm,
residual, activation, RoPE, K/V's repeat, input-gradient sums: :func:`ew_op_table`), measured
and ddlsim's, with the measured kernels' rate at ddlsim's bytes; FSDP2's passes timed by their
bytes at ddlsim's memory rate (:func:`fsdp2_passes`, beside ddlsim's own in the rows); and per
GEMM the measured rate beside ddlsim's ``kernel_time`` of that shape and the isolated burst rate
of the nearest shape in ``run1/kernels/gemm.csv`` (same GPU and session). Nothing is fitted.

ddlsim's config is the one ``validate_device_h200.py`` predicts the traced step with
(:func:`load_config`: its ``config`` of its row of ``run1/llama/llama_step.json``'s
``selective_op`` variant): ``dgx-h200`` on one GPU, the ``torchtitan-2025`` stack with the
kernels PyTorch 2.11 runs (``TORCH_2_11`` there). ``--set K=V`` applies after it, as the CLI's
``--set`` does (``--set system.preset=dgx-h100`` predicts the step on an H100); a key the
config does not have is refused by ddlsim's config check, naming it.

Run: ``python benchmarks/kineto_vs_ddlsim.py [--trace PATH] [--gemm-csv PATH] [--set K=V]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from kineto_kernels import (EW_OPS, ROWS, DeviceKernel, busy_shares, classify, device_kernels,
                            ew_op, layer_of, layer_windows, load_events, name_gemms, op_label)
from validate_device_h200 import RUNS, config as run_config, llama_rows

RUN = RUNS / "run1"
TRACE = RUN / "llama" / "llama_step_trace.json.gz"
GEMM_CSV = RUN / "kernels" / "gemm.csv"
#: the traced step: ``llama_step.py`` traces its ``selective_op`` variant (README of ``RUNS``),
#: as validate_device_h200's row (file relative to ``RUNS``, variant)
TRACED = ("run1/llama/llama_step.json", "selective_op")


#: ddlsim's FSDP2 passes (``ddlsim/workloads/decoder/fsdp2_passes.py``) by the row of the
#: kernels they stand for
FSDP2_OPS = {"zero3.cast": "FSDP2 parameter cast fp32->bf16",
             "zero3.copy_out": "FSDP2 unshard copy",
             "zero3.chunk_cat": "FSDP2 chunk_cat bf16->fp32",
             "zero3.after_reduce": "FSDP2 reduce copies"}


def gemm_shape(weight: str, grad: str, model: dict, tokens: float) -> tuple[float, float, float]:
    """``(M, N, K)`` of a named GEMM as ddlsim writes them: forward ``(tokens, out, in)``,
    input gradient ``(tokens, in, out)``, weight gradient ``(in, out, tokens)``."""
    d_in, d_out = model[weight]
    if grad == "dgrad":
        return (tokens, d_in, d_out)
    if grad == "wgrad":
        return (d_in, d_out, tokens)
    return (tokens, d_out, d_in)


def model_dims(shape) -> dict[str, tuple[float, float]]:
    """(in, out) features of each weight of a Llama block and the head, from ddlsim's
    model shape (``hidden``, ``q_width``, ``kv_width``, ``ffn``, ``vocab``)."""
    h = shape.hidden
    return {"wq": (h, shape.q_width), "wk": (h, shape.kv_width), "wv": (h, shape.kv_width),
            "wo": (shape.q_width, h), "w1": (h, shape.ffn), "w3": (h, shape.ffn),
            "w2": (shape.ffn, h), "output": (h, shape.vocab)}


def nearest_burst(shape: tuple, rows: list[dict]) -> dict | None:
    """The 16-bit row of ``gemm.csv`` nearest ``shape`` = (M, N, K): the least
    ``|ln K/k| + |ln M/m| + |ln N/n|`` over both orders of (M, N), bf16 before fp16 on a tie."""
    def dist(r):
        m, n, k = float(r["m"]), float(r["n"]), float(r["k"])
        M, N, K = shape
        mn = min(abs(math.log(M / m)) + abs(math.log(N / n)),
                 abs(math.log(M / n)) + abs(math.log(N / m)))
        return (round(mn + abs(math.log(K / k)), 9), r["dtype"] != "bf16")
    ok = [r for r in rows if r["dtype"] in ("bf16", "fp16") and r["batch"] == "1"
          and _finite(r["tflops"])]
    return min(ok, key=dist) if ok else None


def _finite(x: str) -> bool:
    try:
        return math.isfinite(float(x))
    except ValueError:
        return False


def traced_row() -> dict:
    """validate_device_h200's row of the traced step (:data:`TRACED`): its model, batch,
    sequence, checkpointing and measured median step (``measured_s``)."""
    for row in llama_rows():
        if (row["file"], row["variant"]) == TRACED:
            return row
    raise ValueError(f"no {TRACED[1]!r} variant in {RUNS / TRACED[0]}: the traced step's "
                     "measurement is missing")


def load_config(extra_sets: list[str] | tuple[str, ...] = ()):
    """ddlsim's config of the traced step as validate_device_h200 predicts it, then
    ``extra_sets`` (``K=V``, the CLI's ``--set``); ConfigError naming a key the config lacks
    or a value it refuses."""
    import ddlsim
    return ddlsim.load_config(run_config(traced_row()), list(extra_sets))


def _ddlsim_row(op_name: str, kernel) -> str:
    """The row of :data:`ROWS` a kernel of ddlsim's op ``op_name`` counts in (``kernel`` None:
    the op, which has none)."""
    if op_name in ("logits", "bwd.logits"):
        return "output head GEMM"
    if op_name in ("loss", "bwd.loss"):
        return "cross-entropy"
    if "final_norm" in op_name:
        return "final norm"
    if op_name in FSDP2_OPS:
        return FSDP2_OPS[op_name]
    if "embedding" in op_name:
        return "embedding"
    if op_name == "optimizer":
        return "optimizer"
    if kernel is not None and kernel.kind == "flash":
        return "attention"
    if kernel is not None and kernel.kind == "gemm":
        return f"GEMM {_phase(op_name)}"
    return f"element-wise {_phase(op_name)}"


def _phase(op_name: str) -> str:
    """``recomputed``, ``backward`` or ``forward``: the phase of ddlsim's op ``op_name``."""
    return "recomputed" if op_name.startswith("recompute") else \
        "backward" if op_name.startswith("bwd") else "forward"


def ddlsim_rows(cfg) -> tuple[Counter, list[tuple[str, tuple, float]]]:
    """ddlsim's seconds of one step by row (``launch gaps and host``: each op's time beyond
    its kernels', :func:`~ddlsim.simulator.kernels.op_time`) and its GEMM kernels as
    ``(phase, shape, seconds)``."""
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device, kernel_time, op_time
    from ddlsim.workloads.trace import Compute
    workload = build_workload(cfg)
    dev, prog = kernel_device(cfg.system), workload.classes[0].program
    rows: Counter = Counter()
    gemms: list = []
    for step in prog.steps:
        for op in prog.blocks[step.block].flat.ops:
            p = op.payload
            if not isinstance(p, Compute) or p.seconds is not None or p.contention:
                continue
            total = op_time(p, dev) * op.repeat
            device = 0.0
            for kern in p.kernels or ():
                t = kernel_time(kern, dev) * op.repeat
                rows[_ddlsim_row(p.name, kern)] += t
                device += t
                if kern.kind == "gemm":
                    gemms += [(_phase(p.name), tuple(kern.shape), t / op.repeat)] * op.repeat
            if not p.kernels:
                rows[_ddlsim_row(p.name, None)] += total
            else:
                rows["launch gaps and host"] += total - device
    return rows, gemms


def gemm_table(kernels, windows, cfg, dd_gemms, burst_rows) -> list[dict]:
    """One record per (phase, weight, grad): the measured GEMMs' mean µs and TFLOP/s,
    ddlsim's µs for the same shape from its op list, the burst rate of the nearest
    ``gemm.csv`` shape."""
    dims = model_dims(cfg.model.shape())
    tokens = cfg.train.micro_batch_size * cfg.train.seq_length
    pool: dict = defaultdict(list)
    for phase, shp, t in dd_gemms:
        pool[(phase, tuple(float(x) for x in shp))].append(t)
    groups: dict = defaultdict(list)
    gemms = [k for k in kernels if k.is_gemm]
    for k, (phase, layer, weight, grad) in zip(gemms, name_gemms(kernels, windows)):
        phase_key = "head" if weight == "output" else phase
        groups[(phase_key, weight, grad)].append(k.dur_us * 1e-6)
    out = []
    for (phase, weight, grad), secs in groups.items():
        shp = gemm_shape(weight, grad, dims, tokens) if weight in dims else None
        flops = 2 * math.prod(shp) if shp else math.nan
        dd_phase = "backward" if phase == "head" and grad != "-" else \
            "forward" if phase == "head" else phase
        dd = pool.get((dd_phase, tuple(float(x) for x in shp)), []) if shp else []
        dd_s = [dd.pop() for _ in secs if dd]
        burst = nearest_burst(shp, burst_rows) if shp and burst_rows else None
        mean = sum(secs) / len(secs)
        out.append({"phase": phase, "weight": weight, "grad": grad, "n": len(secs),
                    "MxNxK": "x".join(f"{x:.0f}" for x in shp) if shp else "?",
                    "measured_us": mean * 1e6, "measured_TFLOPs": flops / mean / 1e12,
                    "ddlsim_us": (sum(dd_s) / len(dd_s) * 1e6) if dd_s else math.nan,
                    "ddlsim_TFLOPs": flops / (sum(dd_s) / len(dd_s)) / 1e12 if dd_s else math.nan,
                    "matched": f"{len(dd_s)}/{len(secs)}",
                    "burst_shape": "x".join(burst[c] for c in "mnk") if burst else "-",
                    "burst_TFLOPs": float(burst["tflops"]) if burst else math.nan,
                    "flops": flops * len(secs), "seconds": sum(secs)})
    return out


def class_table(kernels: list[DeviceKernel], windows, dd_rows: Counter) -> list[dict]:
    """One record per row of :data:`ROWS` (and ddlsim's ``launch gaps and host``): measured
    kernels, their summed and busy-share milliseconds, ddlsim's milliseconds."""
    shares = busy_shares(kernels)
    n: Counter = Counter()
    total: Counter = Counter()
    busy: Counter = Counter()
    for k, sh in zip(kernels, shares):
        row = classify(k, layer_of(k, windows))
        n[row] += 1
        total[row] += k.dur_us * 1e-3
        busy[row] += sh * 1e-3
    return [{"row": r, "n": n[r], "measured_ms": total[r], "busy_ms": busy[r],
             "ddlsim_ms": dd_rows.get(r, 0.0) * 1e3}
            for r in (*ROWS, "launch gaps and host") if n[r] or dd_rows.get(r)]


def op_breakdown(kernels: list[DeviceKernel], windows) -> list[dict]:
    """The measured non-GEMM, non-attention rows split by launching op (:func:`op_label`) and
    kernel (its name up to the first ``<`` or ``(``), largest first."""
    acc: dict = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        row = classify(k, layer_of(k, windows))
        if row.startswith(("GEMM", "output head", "attention")):
            continue
        kern = re.split(r"[<(]", k.name.replace("void ", "").replace("at::native::", ""))[0]
        key = (row, op_label(k), kern.strip())
        acc[key][0] += 1
        acc[key][1] += k.dur_us * 1e-3
    return [{"row": r, "op": o, "kernel": kn, "n": v[0], "ms": v[1]}
            for (r, o, kn), v in sorted(acc.items(), key=lambda kv: (ROWS.index(kv[0][0]),
                                                                     -kv[1][1]))]


def ddlsim_ew_ops(cfg) -> dict[tuple[str, str], tuple[int, float, float]]:
    """ddlsim's element-wise kernels of the step's blocks by ``(phase, op)`` (phase
    ``forward`` or ``backward``, op of :data:`~kineto_kernels.EW_OPS`): ``(kernels, bytes,
    seconds)`` over all layers. The parts are the layer's own
    (:func:`~ddlsim.simulator.kernels.elementwise.layer_elementwise_parts` and its backward's;
    K/V's repeat and the input-gradient sums from
    :func:`~ddlsim.workloads.decoder.layerkernels.layer_kernels`), one tensor-parallel rank."""
    from ddlsim.simulator.kernels import kernel_device, kernel_time
    from ddlsim.simulator.kernels.elementwise import layer_elementwise_parts
    from ddlsim.simulator.kernels.elementwise_backward import layer_elementwise_backward_parts
    from ddlsim.config import DTYPE_BYTES
    from ddlsim.workloads.decoder.layerkernels import compute_dtype, layer_kernels
    shape, sw, dev = cfg.model.shape(), cfg.software, kernel_device(cfg.system)
    b, s, n = cfg.train.micro_batch_size, cfg.train.seq_length, shape.layers
    od = compute_dtype(cfg.train.dtype)      # the element-wise ops' dtype (bf16 under FP8)
    args = (shape, b, s, 1, False, DTYPE_BYTES[od], sw, od)
    lk = layer_kernels(shape, sw, b, s, 1, False, cfg.train.dtype)
    sums = tuple(k for part in ("bwd.mlp.fc1", "bwd.attn.qkv") for k in lk[part]
                 if k.kind == "memory")
    parts = {"forward": {**layer_elementwise_parts(*args), "repeat_kv": lk["repeat_kv"]},
             "backward": {**layer_elementwise_backward_parts(*args),
                          "repeat_kv": lk["bwd.repeat_kv"], "grad sums": sums}}
    parts["recomputed"] = _recomputed_parts(cfg, parts["forward"])
    return {(phase, op): (n * len(ks), n * sum(k.bytes for k in ks),
                          n * sum(kernel_time(k, dev) for k in ks))
            for phase, ops in parts.items() for op, ks in ops.items()}


def _recomputed_parts(cfg, forward: dict) -> dict[str, tuple]:
    """The memory kernels of ddlsim's ``recompute.sac`` op of one layer by op: each matched,
    in order, to the next equal kernel of the forward's parts (``forward``, in the layer's
    order; the recomputation keeps that order, less what the checkpoint does not rerun)."""
    from ddlsim.api import build_workload
    prog = build_workload(cfg).classes[0].program
    op = next(o.payload for st in prog.steps for o in prog.blocks[st.block].flat.ops
              if getattr(o.payload, "name", "") == "recompute.sac")
    labelled = [(name, k) for name, ks in forward.items() for k in ks]
    out: dict = defaultdict(tuple)
    i = 0
    for k in (k for k in op.kernels if k.kind == "memory"):
        while i < len(labelled) and labelled[i][1] != k:
            i += 1
        name = labelled[i][0] if i < len(labelled) else "other"
        out[name] += (k,)
        i += 1
    return dict(out)


def ew_op_table(kernels: list[DeviceKernel], windows, cfg) -> list[dict]:
    """Per ``(phase, op)`` of the blocks' element-wise kernels: the measured kernels (count,
    ms; the recomputed ones apart) beside ddlsim's (:func:`ddlsim_ew_ops`: count, GB, ms) and
    the measured kernels' rate at ddlsim's bytes (GB/s: where the bytes are torch's, the
    kernels' achieved bandwidth)."""
    acc: dict = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        row = classify(k, layer_of(k, windows))
        if row.startswith("element-wise"):
            acc[(row.removeprefix("element-wise "), ew_op(k))][0] += 1
            acc[(row.removeprefix("element-wise "), ew_op(k))][1] += k.dur_us * 1e-6
    dd = ddlsim_ew_ops(cfg)
    out = []
    for phase in ("forward", "recomputed", "backward"):
        for op in EW_OPS:
            n, t = acc.get((phase, op), (0, 0.0))
            dn, dbytes, dt = dd.get((phase, op), (0, 0.0, 0.0))
            if n or dn:
                out.append({"phase": phase, "op": op, "n": n, "ms": t * 1e3, "ddlsim_n": dn,
                            "ddlsim_GB": dbytes / 1e9, "ddlsim_ms": dt * 1e3,
                            "GBps_at_ddlsim_bytes": dbytes / t / 1e9 if t and dbytes
                            else math.nan})
    return out


def fsdp2_passes(cfg) -> dict[str, float]:
    """Seconds ddlsim's memory kernel (:func:`~ddlsim.simulator.kernels.kernel_time`) gives
    FSDP2's passes of this one-rank step, from their bytes: each unit (a block; the root's
    embedding, final norm and head) gathered twice (forward, and again for the backward:
    ``reshard_after_forward``), each gather a cast of the fp32 shard to bf16 (read 4, write 2
    bytes per parameter: the whole unit on one rank) and the copy of the gathered bf16
    parameters (read 2, write 2: the ``zero3_copy_out`` pass, ``ddlsim/workloads/decoder/
    fsdp.py``); each unit's gradients cast into the fp32 reduce-scatter input once
    (``chunk_cat``: read 2, write 4, that module's ``reduce_passes``) and, on one rank, the
    reduce-scatter a copy of that fp32 input (read 4, write 4): the bytes of ddlsim's own
    (:data:`FSDP2_OPS`), all at the streaming rate."""
    from ddlsim.simulator.kernels import kernel_device, kernel_time
    from ddlsim.workloads.trace import Kernel
    dev, shape = kernel_device(cfg.system), cfg.model.shape()
    units = [shape.dense_layer_params] * shape.layers
    units.append(shape.params - shape.layers * shape.dense_layer_params)
    per = {"FSDP2 parameter cast fp32->bf16": 2 * 6.0, "FSDP2 unshard copy": 2 * 4.0,
           "FSDP2 chunk_cat bf16->fp32": 6.0, "FSDP2 reduce copies": 8.0}
    return {row: sum(kernel_time(Kernel("memory", bytes=b * p), dev) for p in units)
            for row, b in per.items()}


def report(kernels: list[DeviceKernel], windows, cfg, burst_rows: list[dict],
           step_s: float | None = None) -> str:
    """The comparison as text: totals, rows, the element-wise breakdown, the GEMMs."""
    from ddlsim.simulator.kernels import kernel_device
    dev = kernel_device(cfg.system)
    dd_rows, dd_gemms = ddlsim_rows(cfg)
    rows = class_table(kernels, windows, dd_rows)
    start = min(k.start_us for k in kernels)
    span = max(k.start_us + k.dur_us for k in kernels) - start
    lines = [f"measured: {len(kernels)} device activities, kernel sum "
             f"{sum(k.dur_us for k in kernels) / 1e3:.1f} ms, busy "
             f"{sum(busy_shares(kernels)) / 1e3:.1f} ms, span {span / 1e3:.1f} ms"
             + (f", step {step_s * 1e3:.1f} ms (llama_step.json median)" if step_s else ""),
             f"ddlsim: {sum(dd_rows.values()) * 1e3:.1f} ms of compute "
             f"({cfg.system.name}, {cfg.software.name}; {_kernels_set(cfg)})", "",
             f"{'row':34s} {'n':>5s} {'measured':>9s} {'busy':>8s} {'ddlsim':>8s} "
             f"{'ddlsim-meas':>11s}  (ms)"]
    for r in rows:
        lines.append(f"{r['row']:34s} {r['n']:5d} {r['measured_ms']:9.2f} {r['busy_ms']:8.2f} "
                     f"{r['ddlsim_ms']:8.2f} {r['ddlsim_ms'] - r['measured_ms']:+11.2f}")
    lines += ["ddlsim's FSDP2 rows: its ops " + ", ".join(FSDP2_OPS) + " (workloads/decoder/"
              "fsdp2_passes.py)", "",
              "measured by op (rows without GEMMs and attention; >= 0.05 ms):"]
    for r in op_breakdown(kernels, windows):
        if r["ms"] >= 0.05:
            lines.append(f"  {r['row']:32s} {r['op'][:40]:40s} {r['kernel'][:44]:44s} "
                         f"{r['n']:4d} {r['ms']:7.2f}")
    lines += ["", "the blocks' element-wise ops by op (ew_op_table; GB/s meas: the measured "
              "kernels at ddlsim's bytes):",
              f"  {'phase':10s} {'op':10s} {'n':>4s} {'meas ms':>8s} {'ddlsim n':>8s} "
              f"{'GB':>6s} {'ddlsim ms':>9s} {'GB/s meas':>9s}"]
    for r in ew_op_table(kernels, windows, cfg):
        lines.append(f"  {r['phase']:10s} {r['op']:10s} {r['n']:4d} {r['ms']:8.2f} "
                     f"{r['ddlsim_n']:8d} {r['ddlsim_GB']:6.2f} {r['ddlsim_ms']:9.2f} "
                     f"{r['GBps_at_ddlsim_bytes']:9.0f}")
    measured = {r["row"]: r for r in rows}
    lines += ["", "FSDP2's passes by their bytes at ddlsim's memory rate (fsdp2_passes), ms:"]
    for row, t in fsdp2_passes(cfg).items():
        m = measured.get(row, {"measured_ms": 0.0, "busy_ms": 0.0})
        lines.append(f"  {row:32s} bytes-rule {t * 1e3:7.2f}  measured {m['measured_ms']:7.2f}"
                     f" (busy {m['busy_ms']:.2f})")
    table = gemm_table(kernels, windows, cfg, dd_gemms, burst_rows)
    lines += ["", f"GEMMs (mean over layers; TFLOP/s = 2MNK / time):",
              f"  {'phase':10s} {'weight':6s} {'grad':5s} {'n':>3s} {'MxNxK':>18s} "
              f"{'meas us':>8s} {'TFLOP/s':>7s} {'ddlsim us':>9s} {'TFLOP/s':>7s} "
              f"{'match':>5s}  nearest gemm.csv burst"]
    for g in table:
        lines.append(f"  {g['phase']:10s} {g['weight']:6s} {g['grad']:5s} {g['n']:3d} "
                     f"{g['MxNxK']:>18s} {g['measured_us']:8.1f} {g['measured_TFLOPs']:7.1f} "
                     f"{g['ddlsim_us']:9.1f} {g['ddlsim_TFLOPs']:7.1f} {g['matched']:>5s}  "
                     f"{g['burst_shape']} {g['burst_TFLOPs']:.1f}")
    flops, secs = sum(g["flops"] for g in table), sum(g["seconds"] for g in table)
    cap = dev.sustained.get("bf16", math.nan) * dev.peak["bf16"] if dev.sustained else math.nan
    lines.append(f"  all {sum(g['n'] for g in table)} GEMMs: {flops / 1e12:.1f} TFLOP in "
                 f"{secs * 1e3:.1f} ms = {flops / secs / 1e12:.1f} TFLOP/s; ddlsim's power-"
                 f"capped ceiling {cap / 1e12:.1f}, burst ceiling "
                 f"{dev.matmul['bf16'] * dev.peak['bf16'] / 1e12:.1f} TFLOP/s")
    return "\n".join(lines)


def _kernels_set(cfg) -> str:
    """The stack's kernels the config sets itself (``system.software.kernels``), as text."""
    sw = cfg.software
    own = sorted(k for k, src in sw.sources.items() if src.startswith("system.software"))
    return ", ".join(f"{k} {sw.kernels[k]}" for k in own if k in sw.kernels) or "its defaults"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--gemm-csv", default=str(GEMM_CSV))
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="ddlsim config settings K=V applied after the step's own "
                         "(validate_device_h200's config of the traced row)")
    args = ap.parse_args(argv)
    import warnings
    warnings.simplefilter("ignore")
    from ddlsim.errors import ConfigError
    try:
        cfg = load_config(args.sets)
    except ConfigError as exc:
        print(f"--set {' '.join(args.sets)}: {exc}", file=sys.stderr)
        return 2
    events = load_events(args.trace)
    kernels, windows = device_kernels(events), layer_windows(events)
    print(report(kernels, windows, cfg, _burst_rows(args.gemm_csv), traced_row()["measured_s"]))
    return 0


def _burst_rows(path: str) -> list[dict]:
    if not Path(path).exists():
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


if __name__ == "__main__":
    sys.exit(main())

"""ddlsim's kernel model beside a measured kernel sweep of one GPU, part by part (issues 29/30).

Run (on any machine; the sweep comes from a GPU):

    python benchmarks/device_compare.py --dir DIR --system dgx-h200 \\
        [--software torchtitan-2025] [--gemm-library cublas-13] [--rows]

``DIR`` holds what ``benchmarks/device/h100_kernels.py`` writes (``gemm.csv``,
``attention.csv``, ``memory.csv``, ``launch.csv``, ``sustained.csv``) and, where they were
run, ``launch.json`` (``benchmarks/device/launch_time.py``) and ``sync.json``
(``benchmarks/device/sync_wake.py``), in ``DIR`` or the folder above it; a part whose file is
missing is said to be missing.
Each measured time is set beside the time ddlsim's kernel model gives the same work on the
preset's device under the software stack's dispatch (the error is ddlsim / measured − 1,
positive where ddlsim is slower, as :func:`ddlsim.calibration.gemm_overhead.gemm_errors`):

* **GEMMs**, by origin (the validation runs' shapes, the grid, the layouts), layout and dtype:
  the shape model alone (``gemm_errors`` with the preset's ``gemm_overhead``, a burst, as
  ``benchmarks/device/fit_gemm_overhead.py`` reports it) and the kernel model of a step
  (:func:`~ddlsim.simulator.kernels.op_time`: the power limit's sustained cap and the launch;
  ``fp8_rowwise`` rows as FP8 GEMMs, the kernel model with PyTorch's CUTLASS row-wise kernel);
* **attention**: PyTorch's flash backend (FlashAttention-2: ddlsim's ``flash2``) and cuDNN's
  (``cudnn``), causal, forward and forward + backward (``attention_kernels``);
* **memory kernels**: each named kernel as the kernels ddlsim gives that op (the mapping of
  ``benchmarks/kernel_breakdown.py``: torch's norm kernels in class ``norm``, the composite
  RMSNorm's passes, an unfused SwiGLU, the unfused softmax's passes, dropout over the scores,
  an FP8 cast pass, the optimizer step), or "no counterpart";
* **sustained**: the square GEMMs held for seconds beside the preset's ``power_limits`` cap
  (the burst median beside the shape model);
* **launch**: ``launch.json``'s four facts beside the preset's ``device.launch``,
  ``sync.json`` beside ``SYNC_WAKE_S`` (ddlsim/workloads/decoder/moe_host.py), and the
  per-chunk copies of ``launch.csv`` beside one eager copy op.

Before its end it prints the signed error by kernel class (:func:`by_class`: GEMMs by dtype
and by whether the power limit's sustained cap or the shape model times them, attention by
backend, head dim and pass, the backward as forward + backward less the forward, memory
kernels by ddlsim's class), which says whether a class leans fast or slow. It ends with one
summary line per part (the GEMMs' from the kernel model; launch's from the four facts).
Nothing is fitted here; the output depends only on the files and the preset.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

from ddlsim.calibration.gemm_overhead import GemmPoint, gemm_errors
from ddlsim.simulator.kernels import attention_kernels, kernel_device, kernel_time, op_time
from ddlsim.simulator.kernels.elementwise import (activation_classes, activation_passes,
                                                  backward_kernels, norm_passes,
                                                  optimizer_bytes_per_param)
from ddlsim.simulator.kernels.gemm import gemm_quantisation
from ddlsim.simulator.kernels.softmax import softmax_passes
from ddlsim.software import resolve_software
from ddlsim.workloads.trace import Compute, Kernel

PARTS = ("gemm", "attention", "memory", "sustained", "launch")
#: the SDPA backend of h100_kernels.py's attention.csv -> ddlsim's fused attention kernel
#: (PyTorch's flash backend is FlashAttention-2; cudnn is cuDNN's fused attention)
ATTENTION_KERNEL = {"flash": "flash2", "cudnn": "cudnn"}
#: a gemm.csv dtype that is not ddlsim's -> (ddlsim's dtype, the FP8 GEMM kernel that runs it:
#: ``Kernel.variant``, fp8recipe.FP8_GEMM_KERNELS). ``torch._scaled_mm`` with one scale per row
#: of A and per column of B is PyTorch's CUTLASS row-wise kernel (torchao's rowwise recipe)
GEMM_DTYPES = {"fp8_rowwise": ("fp8", "cutlass_rowwise")}
#: launch.json's facts, as ``device.launch`` names them
LAUNCH_FACTS = ("host_launch_s", "eager_op_s", "stream_gap_s", "graph_gap_s")
BF16 = 2.0      # bytes per element of h100_kernels.py's memory kernels (bf16)
#: keys per row of h100_kernels.py's softmax scores (``bh, s = 64, 2048``: 64 × 2048 rows)
SCORE_ROW = 2048
#: the softmax dispatch of the sweep's PyTorch 2.11 (torchtitan-2025's softmax_dispatch)
SOFTMAX = "torch-2.10"


def load_system(system: str, software: str, gemm_library: str | None = None):
    """The :class:`~ddlsim.config.SystemConfig` of preset ``system`` under stack
    ``software`` (with its GEMM library replaced by ``gemm_library`` where given, to take the
    device's figures measured with the sweep's own library)."""
    from ddlsim.config import SystemConfig
    from ddlsim.presets import get_preset
    sw = software if gemm_library is None else {"stack": software,
                                                "kernels": {"gemm_library": gemm_library}}
    return SystemConfig.model_validate({**get_preset("system", system), "software": sw})


def read_rows(path: Path) -> list[dict] | None:
    """The rows of a CSV of h100_kernels.py, or None where the file is missing."""
    if not path.is_file():
        return None
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _finite(x: str) -> float | None:
    v = float(x) if x not in ("", None) else math.nan
    return v if math.isfinite(v) and v > 0 else None


def stats(err) -> dict:
    """Count, mean |error|, signed mean error and the worst (largest |error|) of ``err``."""
    err = np.asarray(err, dtype=float)
    if err.size == 0:
        return {"n": 0}
    return {"n": int(err.size), "mean_abs": float(np.abs(err).mean()),
            "signed": float(err.mean()), "worst": float(err[np.abs(err).argmax()])}


def stats_line(label: str, s: dict, width: int = 46) -> str:
    """One line of :func:`stats` ``s``."""
    if not s.get("n"):
        return f"{label:<{width}} nothing compared"
    return (f"{label:<{width}} n={s['n']:3d}  mean |error| {s['mean_abs']:6.1%}  signed "
            f"{s['signed']:+6.1%}  worst {s['worst']:+7.1%}")


# ---- GEMMs -----------------------------------------------------------------------------

def gemm_groups(rows: list[dict]) -> tuple[dict[tuple, list[GemmPoint]], int]:
    """gemm.csv's measured rows as :class:`GemmPoint` (in ddlsim's dtype, :data:`GEMM_DTYPES`)
    by (origin, layout, the sweep's dtype), sorted, and the count of rows it could not run."""
    groups: dict[tuple, list[GemmPoint]] = {}
    failed = 0
    for r in rows:
        sec = _finite(r["seconds"])
        if sec is None:                     # h100_kernels.py writes nan for a failed shape
            failed += 1
            continue
        b, m, n, k = (int(r[c]) for c in ("batch", "m", "n", "k"))
        key = (r["origin"], r["layout"], r["dtype"])
        dtype = GEMM_DTYPES.get(r["dtype"], (r["dtype"], ""))[0]
        groups.setdefault(key, []).append(
            GemmPoint("gemm.csv", "", dtype, b, m, n, k, sec, "measured"))
    return dict(sorted(groups.items())), failed


def gemm_kernel_s(p: GemmPoint, dev, variant: str = "") -> float:
    """Seconds of GEMM ``p`` run by kernel ``variant`` as one op of a step (:func:`op_time`:
    the shape model, the FP8 kernel's share of the ceiling, the power limit's sustained cap,
    the launch)."""
    k = Kernel("gemm", (p.m, p.n, p.k), p.batch, dtype=p.dtype, variant=variant)
    return op_time(Compute("gemm", p.flops, 0.0, kernels=(k,), dtype=p.dtype), dev)


def compare_gemms(rows: list[dict], dev, show_rows: bool) -> list[float]:
    """Print the GEMM groups' errors; returns the kernel model's error of every row."""
    groups, failed = gemm_groups(rows)
    print(f"GEMMs (gemm.csv; {failed} rows the sweep could not run left out)")
    out: list[float] = []
    for (origin, layout, dtype), pts in groups.items():
        shape = gemm_errors(pts, dev, dev.gemm_overhead)
        variant = GEMM_DTYPES.get(dtype, ("", ""))[1]
        step = np.array([gemm_kernel_s(p, dev, variant) / p.seconds - 1.0 for p in pts])
        print("  " + stats_line(f"{origin} {layout} {dtype}, shape", stats(shape)))
        print("  " + stats_line(f"{origin} {layout} {dtype}, kernel", stats(step)))
        if show_rows:
            for p, e in zip(pts, step):
                print(f"      {p.batch}x{p.m}x{p.n}x{p.k}  measured {p.seconds * 1e6:10.2f} us"
                      f"  ddlsim {p.seconds * (1 + e) * 1e6:10.2f} us  {e:+.1%}")
        out += list(step)
    return out


# ---- attention -------------------------------------------------------------------------

def attention_s(kind: str, b: int, heads: int, s: int, d: int, dev, backward: bool) -> float:
    """ddlsim's seconds of one causal bf16 attention core, forward (and ``backward``)."""
    total = 0.0
    for bwd in ((False, True) if backward else (False,)):
        ks = attention_kernels(kind, b, heads, s, d, BF16, dropout=False, backward=bwd)
        total += op_time(Compute("attn", sum(k.flops for k in ks), 0.0, kind="attention",
                                 kernels=ks), dev)
    return total


def compare_attention(rows: list[dict], dev) -> list[float]:
    """Print each attention row beside ddlsim's; returns the errors."""
    print("Attention (attention.csv: causal, bf16; error = ddlsim / measured - 1)")
    out: list[float] = []
    for r in rows:
        kind = ATTENTION_KERNEL.get(r["backend"])
        b, h, s, d = (int(r[c]) for c in ("b", "heads", "seq", "head_dim"))
        label = f"{r['backend']:<6} b{b} h{h} s{s} d{d}"
        if kind is None:
            print(f"  {label}  no counterpart (backend {r['backend']!r})")
            continue
        for col, bwd in (("fwd_s", False), ("fwd_bwd_s", True)):
            meas = _finite(r[col])
            if meas is None:
                print(f"  {label} {col:<9} not measured")
                continue
            pred = attention_s(kind, b, h, s, d, dev, bwd)
            out.append(pred / meas - 1.0)
            print(f"  {label} {col:<9} measured {meas * 1e3:8.3f} ms  ddlsim {kind} "
                  f"{pred * 1e3:8.3f} ms  {out[-1]:+.1%}")
    return out


# ---- memory kernels --------------------------------------------------------------------

def _passes(per: list[float], el: float, classes: list[str] | str = "") -> tuple:
    """Memory kernels of ``per`` bytes per element each over ``el`` elements, in ``classes``."""
    cls = classes if isinstance(classes, list) else [classes] * len(per)
    return tuple(Kernel("memory", bytes=p * el, variant=c) for p, c in zip(per, cls))


def _norm(fused: bool, norm: str, hidden: float, el: float, backward: bool = False) -> tuple:
    """torch's norm kernels as ddlsim gives them (class ``norm``: kernel_breakdown.py's
    mapping of nn.LayerNorm, nn.RMSNorm and the composite RMSNorm)."""
    ks = _passes(norm_passes(fused, norm, BF16, hidden), el, "norm")
    return backward_kernels(ks) if backward else ks


def _silu_mul(el: float) -> tuple:
    """An unfused SwiGLU (SiLU, then multiply), as ddlsim runs torchtitan's."""
    per = activation_passes(True, False, False, BF16)
    return _passes(per, el, activation_classes(True, False, False, len(per)))


def _adam_bytes(fused: bool) -> float:
    """Bytes per fp32 parameter of the Adam update alone: optimizer_bytes_per_param less
    step 3's gradient-norm read (4 B), which ``opt.step()`` alone does not do."""
    return optimizer_bytes_per_param("adam", fused, param_bytes=4, grad_bytes=4) - 4.0


#: h100_kernels.py's memory kernel -> (ddlsim's kernels given elements and hidden, or a
#: number: bytes per element of one optimizer roofline op; what ddlsim's op is)
MEMORY_COUNTERPARTS = {
    "copy": (lambda el, h, sm: _passes([2 * BF16], el), "a streaming pass (memory_efficiency)"),
    "add": (lambda el, h, sm: _passes([3 * BF16], el), "the residual add's pass"),
    "gelu_tanh": (lambda el, h, sm: _passes(activation_passes(False, False, False, BF16), el,
                                        "activation"), "a GeLU kernel (class activation)"),
    "layernorm_fwd": (lambda el, h, sm: _norm(True, "layernorm", h, el),
                      "torch's LayerNorm kernel (class norm)"),
    "layernorm_bwd": (lambda el, h, sm: _norm(True, "layernorm", h, el, True),
                      "its backward, twice the traffic (class norm_backward)"),
    "rmsnorm_fwd": (lambda el, h, sm: _norm(True, "rmsnorm", h, el),
                    "torch's fused RMSNorm kernel (class norm)"),
    "rmsnorm_composite_fwd": (lambda el, h, sm: _norm(False, "rmsnorm", h, el),
                              "the composite RMSNorm's 8 kernels (class norm)"),
    "mul_row_broadcast_fp32": (lambda el, h, sm: _passes([8.0], el, "norm"),
                               "the composite's normalising mul (class norm)"),
    "silu_mul_contiguous": (lambda el, h, sm: _silu_mul(el), "an unfused SwiGLU (SiLU, mul)"),
    "silu_mul_chunked": (lambda el, h, sm: _silu_mul(el),
                         "as silu_mul_contiguous: ddlsim does not tell strided halves apart"),
    "softmax_fwd": (lambda el, h, sm: _passes(softmax_passes(SCORE_ROW, BF16, sm, False), el,
                                              "softmax"),
                    "the softmax's kernel as the stack's PyTorch dispatches it (class softmax)"),
    "softmax_bwd": (lambda el, h, sm: _passes(softmax_passes(SCORE_ROW, BF16, sm, True), el,
                                              "softmax_backward"),
                    "grad * output, then the softmax's backward kernel"),
    "dropout_fwd": (lambda el, h, sm: _passes([2 * BF16 + 1], el, "scores"),
                    "dropout over the scores (score-pass bandwidth)"),
    "scale_mask_fill": (lambda el, h, sm: _passes([2 * BF16, 2 * BF16], el, "softmax"),
                        "two 16-bit passes of the unfused softmax (scale, mask)"),
    "fp8_cast": (lambda el, h, sm: _passes([BF16 + 1], el), "an FP8 cast pass (fp8recipe)"),
    "adamw_fused": (_adam_bytes(True), "fused Adam's update (28 B)"),
    "adamw_foreach": (_adam_bytes(False), "unfused Adam's 19 passes (76 B; AdamW's decay "
                                          "pass not in it)"),
}


def memory_s(name: str, elements: float, hidden: float, dev, softmax: str = SOFTMAX
             ) -> tuple[float, str] | None:
    """ddlsim's seconds of memory kernel ``name`` over ``elements`` (rows of ``hidden``) and
    what ddlsim's op is, or None where ddlsim has no counterpart; ``softmax``: the stack's
    ``softmax_dispatch``."""
    if name not in MEMORY_COUNTERPARTS:
        return None
    make, what = MEMORY_COUNTERPARTS[name]
    if not callable(make):                  # the optimizer step: one roofline op
        return op_time(Compute(name, 0.0, make * elements, kind="optimizer"), dev), what
    ks = make(elements, hidden, softmax)
    return op_time(Compute(name, 0.0, sum(k.bytes for k in ks), kind="elementwise",
                           kernels=ks), dev), what


def compare_memory(rows: list[dict], dev, softmax: str = SOFTMAX) -> list[float]:
    """Print each memory kernel beside ddlsim's (or "no counterpart"), the softmax's as the
    ``softmax`` dispatch runs it; returns the errors."""
    print("Memory kernels (memory.csv; bf16; error = ddlsim / measured - 1)")
    out: list[float] = []
    for r in rows:
        el, hidden = float(r["elements"]), float(r.get("hidden") or 0) or 1.0
        label = f"{r['kernel']:<24} {int(el):>11d} el" + (f" h{int(hidden)}" if r.get("hidden")
                                                           else "")
        meas, got = _finite(r["seconds"]), memory_s(r["kernel"], el, hidden, dev, softmax)
        if got is None:
            print(f"  {label:<44} no counterpart")
            continue
        if meas is None:
            print(f"  {label:<44} not measured")
            continue
        out.append(got[0] / meas - 1.0)
        print(f"  {label:<44} measured {meas * 1e6:10.2f} us ({float(r['GBps']):7.1f} GB/s)  "
              f"ddlsim {got[0] * 1e6:10.2f} us  {out[-1]:+7.1%}  {got[1]}")
    return out


# ---- sustained GEMMs -------------------------------------------------------------------

def sustained_pair(n: int, dtype: str, dev) -> tuple[float, float]:
    """ddlsim's seconds of an ``n³`` GEMM: the shape model alone (a burst, the MAMF ceiling)
    and the kernel model (capped at the power limit's sustained rate)."""
    p = GemmPoint("sustained.csv", "", dtype, 1, n, n, n, 1.0, "measured")
    burst = 1.0 + float(gemm_errors([p], dev, dev.gemm_overhead)[0])
    return burst, kernel_time(Kernel("gemm", (n, n, n), dtype=dtype), dev)


def compare_sustained(rows: list[dict], dev) -> list[float]:
    """Print each sustained row: measured burst and sustained TFLOP/s beside ddlsim's, and the
    sustained fraction of peak beside the preset's power_limits figure; returns the errors
    of the sustained times."""
    print("Sustained GEMMs (sustained.csv; n^3, TN; fraction = TFLOP/s / peak)")
    out: list[float] = []
    for r in rows:
        n, dtype = int(r["n"]), r["dtype"]
        burst, held = _finite(r["burst_seconds"]), _finite(r["sustained_seconds"])
        if burst is None or held is None:
            print(f"  {n}^3 {dtype}: not measured")
            continue
        flops, peak = 2.0 * n ** 3, dev.peak_flops(dtype)
        p_burst, p_held = sustained_pair(n, dtype, dev)
        out.append(p_held / held - 1.0)
        q = float(gemm_quantisation(n, n, 1, dev.sm_count, n)) if dev.sm_count else 1.0
        cap = dev.sustained_rate(dtype)
        print(f"  {n:>5}^3 {dtype:<4} burst {flops / burst / 1e12:7.1f} TFLOP/s (ddlsim "
              f"{flops / p_burst / 1e12:7.1f}, {p_burst / burst - 1:+.1%})  sustained "
              f"{flops / held / 1e12:7.1f} (ddlsim {flops / p_held / 1e12:7.1f}, "
              f"{out[-1]:+.1%}); fraction {flops / held / peak:.3f} (/q {q:.3f}: "
              f"{flops / held / peak / q:.3f}) vs power_limits "
              + (f"{cap:.3f}" if cap else "none") + f"  [{r.get('clocks', '')}]")
    return out


# ---- launch ----------------------------------------------------------------------------

def compare_launch(folder: Path, spec, dev) -> list[float]:
    """Print launch.json beside the preset's ``device.launch`` (``spec``), sync.json beside
    ``SYNC_WAKE_S``, and launch.csv's per-chunk copies beside one eager copy op; returns the
    errors of the four launch facts (preset / measured - 1)."""
    print("Launch and host (error = preset / measured - 1)")
    got, out = _json(folder / "launch.json"), []
    if got is None:
        print("  launch.json: missing")
    for fact in LAUNCH_FACTS if got is not None else ():
        have, meas = (None if spec is None else getattr(spec, fact)), got.get(fact)
        if have is None or not meas:
            print(f"  {fact:<14} measured {meas} s; preset {have}: not compared")
            continue
        out.append(have / meas - 1.0)
        print(f"  {fact:<14} measured {meas * 1e6:7.2f} us  preset {have * 1e6:7.2f} us  "
              f"{out[-1]:+.1%}")
    _sync_wake(_json(folder / "sync.json"))
    _copy_chunks(read_rows(folder / "launch.csv") or [], dev)
    return out


def _sync_wake(sync: dict | None) -> None:
    """sync.json's two probes beside ``SYNC_WAKE_S`` (each probe includes one launch and the
    tiny kernel: sync_wake.py)."""
    from ddlsim.workloads.decoder.moe_host import SYNC_WAKE_S
    for probe in ("event_s", "item_s") if sync is not None else ():
        print(f"  sync {probe:<9} measured {sync[probe] * 1e6:7.2f} us (with a launch and the "
              f"tiny kernel, timed alone {sync['tiny_kernel_s'] * 1e6:.2f} us)  SYNC_WAKE_S "
              f"{SYNC_WAKE_S * 1e6:.2f} us  {SYNC_WAKE_S / sync[probe] - 1:+.1%}")


def _copy_chunks(rows: list[dict], dev) -> None:
    """launch.csv's per-chunk copies beside one eager copy op of the chunk (its pass and
    launch, :func:`op_time`); its synchronisation row has no counterpart."""
    for r in rows:
        if r["kernel"] != "copy_chunks":
            print(f"  {r['kernel']:<22} {float(r['seconds']) * 1e6:8.2f} us: no counterpart")
            continue
        per, elements = float(r["seconds_per_chunk"]), int(r["elements"])   # fp16
        pred = op_time(Compute("copy", 0.0, 0.0, kind="elementwise",
                               kernels=_passes([2 * BF16], elements)), dev)
        print(f"  copy_chunks {r['chunks']:>5} x {elements:>7} el  measured {per * 1e6:7.2f}"
              f" us a chunk  ddlsim (one eager copy op) {pred * 1e6:7.2f} us  "
              f"{pred / per - 1:+.1%}")


def _json(path: Path) -> dict | None:
    """``path`` read as JSON, or else the file of that name one folder up (run_all.sh writes
    launch.json and sync.json beside the folder of h100_kernels.py's CSVs), or None."""
    for p in (path, path.parent.parent / path.name):
        if p.is_file():
            return json.loads(p.read_text())
    return None


# ---- signed error by class -------------------------------------------------------------

def gemm_class(p: GemmPoint, dev, variant: str = "") -> str:
    """``p``'s class: its dtype and what bounds ddlsim's time of it, the power limit's
    sustained cap (``at the cap``: a large GEMM, ``device.power_limits``) or the burst shape
    model below it (``below the cap``: fixed costs, quantisation, a skinny shape)."""
    rate = dev.sustained_rate(p.dtype)
    k = Kernel("gemm", (p.m, p.n, p.k), p.batch, dtype=p.dtype, variant=variant)
    capped = rate is not None and kernel_time(k, dev) <= p.flops / (dev.peak_flops(p.dtype)
                                                                    * rate) * (1 + 1e-9)
    return f"gemm {p.dtype} {'at the cap' if capped else 'below the cap'}"


def _gemm_by_class(rows: list[dict], dev) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for (_, _, dtype), pts in gemm_groups(rows)[0].items():
        variant = GEMM_DTYPES.get(dtype, ("", ""))[1]
        for p in pts:
            out.setdefault(gemm_class(p, dev, variant), []).append(
                gemm_kernel_s(p, dev, variant) / p.seconds - 1.0)
    return out


def _attention_by_class(rows: list[dict], dev) -> dict[str, list[float]]:
    """Errors by backend, head dim and pass: the forward, the backward (forward + backward
    less the forward, measured and predicted alike) and the two together."""
    out: dict[str, list[float]] = {}
    for r in rows:
        kind = ATTENTION_KERNEL.get(r["backend"])
        fwd, both = _finite(r["fwd_s"]), _finite(r["fwd_bwd_s"])
        if kind is None or fwd is None or both is None or both <= fwd:
            continue
        b, h, s, d = (int(r[c]) for c in ("b", "heads", "seq", "head_dim"))
        p_fwd, p_both = (attention_s(kind, b, h, s, d, dev, bwd) for bwd in (False, True))
        for name, pred, meas in (("fwd", p_fwd, fwd), ("bwd", p_both - p_fwd, both - fwd),
                                 ("fwd+bwd", p_both, both)):
            out.setdefault(f"attention {r['backend']} d{d} {name}", []).append(pred / meas - 1)
    return out


def memory_class(name: str) -> str:
    """The ddlsim kernel class(es) of memory kernel ``name``'s counterpart (``stream``: the
    plain streaming bandwidth; ``optimizer``: the optimizer's roofline op)."""
    make, _ = MEMORY_COUNTERPARTS[name]
    if not callable(make):
        return "optimizer"
    return "+".join(sorted({k.variant or "stream" for k in make(1.0, 1.0, SOFTMAX)}))


def _memory_by_class(rows: list[dict], dev, softmax: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        el, hidden = float(r["elements"]), float(r.get("hidden") or 0) or 1.0
        meas, got = _finite(r["seconds"]), memory_s(r["kernel"], el, hidden, dev, softmax)
        if meas is not None and got is not None:
            out.setdefault(f"memory {memory_class(r['kernel'])}", []).append(got[0] / meas - 1)
    return out


def by_class(folder: Path, dev, softmax: str = SOFTMAX) -> dict[str, dict]:
    """Print and return :func:`stats` of the errors by kernel class: GEMMs by dtype and by
    what bounds ddlsim's time (:func:`gemm_class`), attention by backend, head dim and pass,
    memory kernels by ddlsim's class (:func:`memory_class`). The signed mean says which way
    each class leans (negative: ddlsim faster than measured)."""
    parts = {"gemm": lambda rows: _gemm_by_class(rows, dev),
             "attention": lambda rows: _attention_by_class(rows, dev),
             "memory": lambda rows: _memory_by_class(rows, dev, softmax)}
    out: dict[str, dict] = {}
    print("Signed error by class (ddlsim / measured - 1; negative: ddlsim faster)")
    for part, run in parts.items():
        rows = read_rows(folder / f"{part}.csv")
        for label, errs in sorted((run(rows) if rows is not None else {}).items()):
            out[label] = stats(errs)
            print("  " + stats_line(label, out[label]))
    return out


# ---- main ------------------------------------------------------------------------------

def compare(folder: Path, system, show_rows: bool = False) -> dict[str, dict]:
    """Print every part of the sweep in ``folder`` beside ddlsim on ``system`` and one
    summary line per part; returns :func:`stats` of each part's errors."""
    dev, summary = kernel_device(system), {}
    ceilings = ", ".join(f"{d} {e:.3f}" for d, e in sorted(dev.matmul.items()))
    capped = ", ".join(f"{d} {e:.3f}" for d, e in sorted((dev.sustained or {}).items()))
    print(f"{folder} vs {system.name} ({system.device.name}); GEMM ceilings {ceilings}; "
          f"sustained cap {capped or 'none'}; per kernel host {dev.launch.host_s * 1e6:.2f} us, "
          f"gap {dev.launch.gap_s * 1e6:.2f} us")
    env = _json(folder / "env.json")
    if env is not None:
        print(f"measured on {env.get('gpu', env.get('device'))}, torch {env.get('torch')}, "
              f"{env.get('utc')}")
    parts = {"gemm": lambda rows: compare_gemms(rows, dev, show_rows),
             "attention": lambda rows: compare_attention(rows, dev),
             "memory": lambda rows: compare_memory(
                 rows, dev, resolve_software(system.software).softmax_dispatch),
             "sustained": lambda rows: compare_sustained(rows, dev)}
    for part, run in parts.items():
        rows = read_rows(folder / f"{part}.csv")
        print()
        if rows is None:
            print(f"{part}: {part}.csv missing")
            summary[part] = {"n": 0, "missing": True}
            continue
        summary[part] = stats(run(rows))
        if part == "memory":
            summary[part]["no_counterpart"] = sum(r["kernel"] not in MEMORY_COUNTERPARTS
                                                  for r in rows)
    print()
    summary["launch"] = stats(compare_launch(folder, system.device.launch, dev))
    print()
    summary["by_class"] = by_class(folder, dev,
                                   resolve_software(system.software).softmax_dispatch)
    print("\nSummary (ddlsim / measured - 1)")
    for part in PARTS:
        s = summary.get(part, {"n": 0})
        more = (f", {s['no_counterpart']} without a counterpart" if s.get("no_counterpart")
                else " (its file is missing)" if s.get("missing") else "")
        print(stats_line(part, s, 10) + more)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="the folder h100_kernels.py wrote")
    ap.add_argument("--system", default="dgx-h200")
    ap.add_argument("--software", default="torchtitan-2025")
    ap.add_argument("--gemm-library", default=None,
                    help="the GEMM library the sweep ran with (e.g. cublas-13), where the "
                         "device has figures for it (device.matmul_efficiency_by_library)")
    ap.add_argument("--rows", action="store_true", help="print every GEMM row too")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    if not folder.is_dir():
        ap.error(f"--dir {args.dir!r} is not a folder; expected the folder "
                 f"benchmarks/device/h100_kernels.py --out wrote")
    compare(folder, load_system(args.system, args.software, args.gemm_library), args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

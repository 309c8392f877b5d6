"""Where a step's compute time goes, kind by kind, and ddlsim's non-GEMM kernels against
published per-kernel measurements, with the fit of the element-wise kernel classes' achieved
bandwidth to them (issue 29, causes 1 and 4; docs/compute.md, "Non-GEMM kernels against
published kernel times").

1. **Published kernels** (``benchmarks/data/liger_h100_kernels.csv`` and
   ``liger_a100_kernels.csv``: the Liger-Kernel suite's rows for torch eager SwiGLU,
   ``nn.RMSNorm``, ``nn.LayerNorm`` and ReLU², Megatron-Core's fused SwiGLU, its unfused and
   fused cross-entropy, Hugging Face's composite fp32 RMSNorm, and on the A100 transformers'
   rotate-half RoPE, held out with no class): each measured median beside
   what ddlsim's kernel model gives the same kernels at the same shape, with their launches
   (:func:`ddlsim.simulator.kernels.op_time`, eager dispatch), without (``before``) and with
   the device's element-wise classes (``device.elementwise_efficiency``). ``H100 80GB HBM3``
   rows are timed on ``dgx-h100``'s device, ``H100 NVL`` rows on the same device with the
   NVL's datasheet bandwidth, 3.9 TB/s (NVIDIA H100 NVL product brief), ``A100-SXM4-80GB``
   rows on ``dgx-a100``'s.
2. **The fit** (``--fit``): each class's fraction of the datasheet bandwidth, by least squares
   on the log ratio over the rows marked ``fit`` (the composite RMSNorm, forward and backward,
   and Megatron-Core's fused SwiGLU, at x = 2048, 8192, 32768), per GPU family; the presets
   in ddlsim/data/systems.yaml carry these figures, and the other rows (``held-out``)
   validate them.
3. **Step breakdown** (``--step``): the compute of one rank's iteration split by kind (GEMMs,
   the output head, attention, element-wise forward and backward, their recomputation,
   cross-entropy, optimizer, copies, launch gaps and host time), for validation rows.

Run: ``python benchmarks/kernel_breakdown.py`` (all), ``--kernels``, ``--fit`` or ``--step``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = (HERE / "data" / "liger_h100_kernels.csv", HERE / "data" / "liger_a100_kernels.csv")
NVL_BANDWIDTH_Bps = 3.9e12      # NVIDIA H100 NVL product brief: 3.9 TB/s HBM3
#: GPU of a published row -> (system preset, datasheet bandwidth override or None, family)
GPUS = {"NVIDIA H100 80GB HBM3": ("dgx-h100", None, "H100"),
        "NVIDIA H100 NVL": ("dgx-h100", NVL_BANDWIDTH_Bps, "H100"),
        "NVIDIA A100-SXM4-80GB": ("dgx-a100", None, "A100")}
#: the scripts whose backward mode reruns the forward and ``out.sum()`` in each timed step
RERUN = ("megatron_swiglu", "megatron_rms_norm", "megatron_cross_entropy")


def published() -> list[dict]:
    """The rows of the published kernel tables (comment lines skipped)."""
    out = []
    for path in DATA:
        with open(path) as f:
            out += list(csv.DictReader(line for line in f if not line.startswith("#")))
    return out


def _device(gpu: str, efficiency: dict[str, float] | None = None):
    """The kernel model's device of a published row's GPU under an eager stack, with the
    element-wise classes ``efficiency`` (None: the preset's; ``{}``: none)."""
    import ddlsim
    from ddlsim.simulator.kernels import kernel_device
    preset, bandwidth, _ = GPUS[gpu]
    sets = ["system.software=torchtitan-2024", f"system.preset={preset}"]
    cfg = ddlsim.load_config(str(HERE.parent / "examples" / "llama3-8b-fsdp2-h100.yaml"), sets)
    spec = cfg.system.device
    if efficiency is None:
        efficiency = spec.elementwise_efficiency or {}
    spec = spec.model_copy(update={"elementwise_efficiency": efficiency or None}
                           | ({"memory_bandwidth_Bps": bandwidth} if bandwidth else {}))
    return kernel_device(cfg.system.model_copy(update={"device": spec}))


def row_kernels(row: dict, backward: bool) -> tuple:
    """The kernels ddlsim gives a published row's op, forward or ``backward`` (the norm's and
    the activation's as :func:`backward_kernels`, the cross-entropy's :func:`loss_passes`),
    with the class the kernel model gives that implementation: torch's norm kernels (the
    composite, ``nn.RMSNorm``, ``nn.LayerNorm``) ``norm``, Megatron-Core's fused SwiGLU
    ``gated``; torch's SwiGLU on the chunked halves none (ddlsim runs an unfused SwiGLU as
    torchtitan's, on two contiguous GEMM outputs, and cannot tell Megatron-Core's unfused
    ``glu`` from it), nor ReLU²; the cross-entropy's as the builder's (:func:`loss_kernels`:
    Megatron-Core's unfused ``loss``, ``loss_backward``; its fused one none)."""
    from ddlsim.simulator.kernels.elementwise import (activation_passes, backward_kernels,
                                                      loss_kernels, norm_passes)
    from ddlsim.workloads.trace import Kernel
    cfgx, x = json.loads(row["config"]), int(row["x_value"])
    name, prov = row["kernel_name"], row["provider"]
    if name == "rope":                      # its backward: the forward's passes again
        return _rope_kernels(cfgx, x)
    if name == "megatron_cross_entropy":
        n = cfgx["S"] * cfgx["B"] * x
        return loss_kernels(n, 2, prov == "megatron-fused", backward)
    cls = "norm"
    if name == "megatron_swiglu":
        per = activation_passes(True, False, prov == "megatron", 2)
        n, cls = cfgx["S"] * cfgx["B"] * x, "gated" if prov == "megatron" else ""
    elif name == "relu_squared":            # relu, then square: read and write each
        per, n, cls = [4.0, 4.0], cfgx["M"] * x, ""
    elif name == "megatron_rms_norm":       # nn.RMSNorm: torch's fused CUDA kernel (bf16)
        per, n = norm_passes(True, "rmsnorm", 2, x), cfgx["S"] * cfgx["B"] * x
    elif name == "layer_norm":              # nn.LayerNorm in fp32: torch's fused kernel
        per, n = norm_passes(True, "layernorm", 4, x), cfgx["M"] * x
    else:                                   # HF LlamaRMSNorm: the composite, fp32 weight
        per = norm_passes(False, "rmsnorm", 2, x)
        per[-1] = 2 + 4                     # bf16 times the fp32 weight: an fp32 output
        n = cfgx["M"] * x
    ks = tuple(Kernel("memory", bytes=p * n, variant=cls) for p in per)
    return backward_kernels(ks) if backward else ks


def _rope_kernels(cfgx: dict, x: int) -> tuple:
    """ddlsim's kernels of Liger's rope rows: transformers' ``apply_rotary_pos_emb`` is the
    rotate-half form (``rope_form: rotate_half``, :func:`rope_passes`) over q, then k, of one
    sequence of ``seq_len`` tokens (the ``T`` rows' x) at ``hidden_size`` (the ``H`` rows'
    x), unclassed; its backward the same passes (:func:`.elementwise_backward.
    rope_backward_bytes`)."""
    from ddlsim.simulator.kernels.rotary import rope_passes
    from ddlsim.workloads.trace import Kernel
    seq, hidden = cfgx.get("seq_len", x), cfgx.get("hidden_size", x)
    d = hidden // cfgx["num_q_heads"]
    return tuple(Kernel("memory", bytes=p * seq * heads * d)
                 for heads in (cfgx["num_q_heads"], cfgx["num_kv_heads"])
                 for p in rope_passes(False, "rotate_half", 2))


def _timed_ops(row: dict) -> list[tuple]:
    """The kernel lists a published row's timed step runs: forward; backward alone; or the
    forward then backward (``includes_forward``), with the rerun scripts' ``out.sum()`` (one
    read of the 16-bit output; the loss's per-token fp32 output)."""
    from ddlsim.workloads.trace import Kernel
    if row["mode"] == "forward":
        return [row_kernels(row, False)]
    if row["includes_forward"] != "1":
        return [row_kernels(row, True)]
    ops = [row_kernels(row, False), row_kernels(row, True)]
    if row["kernel_name"] in RERUN:
        cfgx, x = json.loads(row["config"]), int(row["x_value"])
        out = 4 * cfgx["S"] * cfgx["B"] if row["kernel_name"] == "megatron_cross_entropy" \
            else 2 * cfgx["S"] * cfgx["B"] * x
        ops.append((Kernel("memory", bytes=out),))
    return ops


def predicted_s(row: dict, dev) -> tuple[float, bool]:
    """ddlsim's seconds for a published row (:func:`_timed_ops`) and whether the host bounds
    it (the kernels' dispatch, ``n·host``, adds over 5 % to their device time and gaps)."""
    from ddlsim.simulator.kernels import kernel_time, op_time
    from ddlsim.workloads.trace import Compute
    total, device = 0.0, 0.0
    for ks in _timed_ops(row):
        total += op_time(Compute("k", 0.0, sum(k.bytes for k in ks), kind="elementwise",
                                 kernels=ks), dev)
        device += sum(kernel_time(k, dev) for k in ks) + len(ks) * dev.launch.gap_s
    return total, total > 1.05 * device


def fit(family: str) -> dict[str, float]:
    """The element-wise classes' fractions of the datasheet bandwidth fitted to the ``fit``
    rows of GPU ``family`` ("H100", "A100"): least squares on ``log(measured / predicted)``
    (scipy ``least_squares``, from 0.5, bounds (0.05, 1]), rounded to 3 digits."""
    import math

    from scipy.optimize import least_squares
    rows = [r for r in published() if r["use"] == "fit" and GPUS[r["gpu"]][2] == family]
    classes = sorted({k.variant for r in rows for ks in _timed_ops(r) for k in ks} - {""})

    def residuals(v):
        eff = dict(zip(classes, v))
        return [math.log(float(r["median_ms"]) * 1e-3 / predicted_s(r, _dev(r["gpu"], eff))[0])
                for r in rows]
    sol = least_squares(residuals, [0.5] * len(classes), bounds=(0.05, 1.0))
    return {c: round(float(v), 3) for c, v in zip(classes, sol.x)}


_DEVICES: dict = {}


def _dev(gpu: str, efficiency: dict[str, float] | None = None):
    """:func:`_device`, kept per GPU and classes (loading a config per row is slow)."""
    key = (gpu, None if efficiency is None else tuple(sorted(efficiency.items())))
    if key not in _DEVICES:
        _DEVICES[key] = _device(gpu, efficiency)
    return _DEVICES[key]


def kernel_table() -> list[dict]:
    """One record per published row: measured ms, and measured / ddlsim without the
    element-wise classes (``before``) and with the preset's (``after``)."""
    out = []
    for row in published():
        ms = float(row["median_ms"])
        before, _ = predicted_s(row, _dev(row["gpu"], {}))
        pred, host = predicted_s(row, _dev(row["gpu"]))
        out.append({"kernel": f"{row['kernel_name']} {row['provider']}", "mode": row["mode"],
                    "x": f"{row['x_name']}={row['x_value']}", "gpu": row["gpu"][7:],
                    "use": row["use"], "class": _classes(row), "measured_ms": ms,
                    "ddlsim_ms": round(pred * 1e3, 4),
                    "before": round(ms / (before * 1e3), 2),
                    "measured/ddlsim": round(ms / (pred * 1e3), 2),
                    "ddlsim bound": "host" if host else "device"})
    return out


def _classes(row: dict) -> str:
    """The element-wise classes of a published row's kernels, ``-`` for none."""
    return ",".join(sorted({k.variant for ks in _timed_ops(row) for k in ks} - {""})) or "-"


def summary(records: list[dict]) -> list[dict]:
    """Mean |error| of ddlsim's time (``1 - ddlsim/measured``) before and after, by GPU
    family and use, and by kernel, over the device-bound rows."""
    import pandas as pd
    df = pd.DataFrame(records)
    df = df[df["ddlsim bound"] == "device"].assign(
        family=lambda d: d.gpu.str.split().str[0].str.split("-").str[0],
        err_before=lambda d: (1 - 1 / d.before).abs() * 100,
        err_after=lambda d: (1 - 1 / d["measured/ddlsim"]).abs() * 100)
    out = []
    for keys, g in df.groupby(["family", "use", "kernel"], sort=True):
        out.append(dict(zip(["family", "use", "kernel"], keys), rows=len(g),
                        before=round(g.err_before.mean(), 1), after=round(g.err_after.mean(), 1)))
    for keys, g in df.groupby(["family", "use"], sort=True):
        out.append(dict(zip(["family", "use"], keys), kernel="all", rows=len(g),
                        before=round(g.err_before.mean(), 1), after=round(g.err_after.mean(), 1)))
        g = g[g["class"] != "-"]
        out.append(dict(zip(["family", "use"], keys), kernel="those with a class", rows=len(g),
                        before=round(g.err_before.mean(), 1), after=round(g.err_after.mean(), 1)))
    return out


def _kind(name: str, k) -> str:
    """The breakdown kind of kernel ``k`` of op ``name`` (``k`` None: an op without kernels):
    ZeRO-3's and FSDP's memory passes around their collectives (``zero3.*``: FSDP1's flat
    gradient ``cat`` and divisions, FSDP2's casts and copies) apart from the layers' own."""
    if name.startswith("zero3."):
        return "FSDP / ZeRO-3 memory passes (any stream)"
    if k is None:
        return "optimizer" if "optim" in name or name == "update" else \
            "copies and other (no kernels)"
    if k.kind == "flash" or "attn_core" in name or k.variant == "scores":
        return "attention"
    if k.kind == "gemm":
        return "output head GEMM" if "logits" in name else "GEMM"
    if "loss" in name:
        return "cross-entropy"
    if name.startswith("recompute"):
        return "element-wise (recomputed)"
    return "element-wise (bwd)" if name.startswith("bwd") else "element-wise (fwd)"


def step_breakdown(cfg) -> tuple[Counter, int]:
    """Seconds of one iteration's compute on the first rank class by kind, and its kernel
    count; ``launch gaps and host`` is each op's time beyond its kernels' (:func:`op_time`)."""
    from ddlsim.api import build_workload
    from ddlsim.simulator.costs import CostModel
    from ddlsim.simulator.kernels import kernel_device, kernel_time, op_time
    from ddlsim.workloads.trace import Compute
    workload = build_workload(cfg)
    dev, prog = kernel_device(cfg.system), workload.classes[0].program
    costs = CostModel(cfg.system, workload, cfg.parallel.collective_algorithm)
    out, kernels = Counter(), 0
    for step in prog.steps:
        for op in prog.blocks[step.block].flat.ops:
            p = op.payload
            if not isinstance(p, Compute) or p.seconds is not None:
                continue
            if p.contention is not None:
                # SMs held while its collectives run, or kept off the GEMMs for TE userbuffers'
                # kernels (set_sm_margin, no collective of its own): timed by the cost model, as
                # both engines do
                out["SM contention"] += costs.compute(p) * op.repeat
                continue
            total = op_time(p, dev) * op.repeat
            if not p.kernels:
                out[_kind(p.name if p.kind != "optimizer" else "optim", None)] += total
                continue
            device = 0.0
            for k in p.kernels:
                t = kernel_time(k, dev)
                out[_kind(p.name, k)] += t * op.repeat
                device += t * op.repeat
            out["launch gaps and host"] += total - device
            kernels += len(p.kernels) * op.repeat
    return out, kernels


def step_rows() -> list[tuple[str, dict, float]]:
    """(label, run config, published seconds) of the validation rows broken down."""
    sys.path.insert(0, str(HERE))
    import validate_h100 as vh
    import validate_torchtitan as vt
    out = []
    for row in vt.rows():
        if row["model"] == "llama-3.1-8b" and row["set"] == "2024" and row["table"] == "1" \
                and row["float8"] == "none":
            out.append((f"torchtitan 2024 8B {row['techniques']}", vt.config(row),
                        vt.published_time(row)))
    for row in vh.rows():
        if row["model"] in ("GPT3-5B", "LLAMA3-8B"):
            out.append((f"NeMo 24.07 {row['model']}", vh.config(row), vh.published_time(row)))
    return out


def _print(records: list[dict]) -> None:
    import pandas as pd
    print(pd.DataFrame(records).to_string(index=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", action="store_true", help="only the published-kernel table")
    ap.add_argument("--fit", action="store_true", help="only the fit of the kernel classes")
    ap.add_argument("--step", action="store_true", help="only the step breakdowns")
    args = ap.parse_args(argv)
    import warnings
    warnings.simplefilter("ignore")
    every = not (args.kernels or args.fit or args.step)
    if args.kernels or every:
        records = kernel_table()
        _print(records)
        print("\nmean |error| of ddlsim's kernel time, %, device-bound rows:")
        _print(summary(records))
    if args.fit or every:
        for family in ("H100", "A100"):
            print(f"{family}: elementwise_efficiency fitted {fit(family)}")
    if not (args.step or every):
        return 0
    import ddlsim
    for label, data, seconds in step_rows():
        out, n = step_breakdown(ddlsim.load_config(data))
        total = sum(out.values())
        print(f"\n{label}: compute {total:.3f} s of a published {seconds:.3f} s step, "
              f"{n} kernels")
        for kind, t in sorted(out.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:32s} {t * 1e3:9.1f} ms {100 * t / total:5.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

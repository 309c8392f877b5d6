"""Where a step's compute time goes, kind by kind, and ddlsim's non-GEMM kernels against
published per-kernel measurements (issue 29, causes 1 and 4; docs/compute.md, "Non-GEMM kernels
against published kernel times").

Two tables:

1. **Published kernels** (``benchmarks/data/liger_h100_kernels.csv``: the Liger-Kernel suite's
   H100 rows for torch eager SwiGLU and ``nn.RMSNorm``, Megatron-Core's TorchScript SwiGLU,
   its unfused and fused cross-entropy, and Hugging Face's composite fp32 RMSNorm): each
   measured median beside what ddlsim's kernel model gives the same kernels at the same shape,
   with their launches (:func:`ddlsim.simulator.kernels.op_time`, eager dispatch). The
   ``H100 80GB HBM3`` rows are timed on the ``dgx-h100`` device; the ``H100 NVL`` rows on the
   same device with the NVL's datasheet bandwidth, 3.9 TB/s (NVIDIA H100 NVL product brief),
   at the same ``memory_efficiency``.
2. **Step breakdown**: the compute of one rank's iteration split by kind (GEMMs, the output
   head, attention, element-wise forward and backward, their recomputation, cross-entropy,
   optimizer, copies, launch gaps and host time), for validation rows chosen by name.

Run: ``python benchmarks/kernel_breakdown.py`` (both tables), ``--kernels`` or ``--step``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "liger_h100_kernels.csv"
NVL_BANDWIDTH_Bps = 3.9e12      # NVIDIA H100 NVL product brief: 3.9 TB/s HBM3


def published() -> list[dict]:
    """The rows of the published kernel table (comment lines skipped)."""
    with open(DATA) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _device(gpu: str, stack: str = "torchtitan-2024"):
    """The kernel model's H100 under an eager stack; the NVL with its own bandwidth."""
    import ddlsim
    from ddlsim.simulator.kernels import kernel_device
    cfg = ddlsim.load_config(str(HERE.parent / "examples" / "llama3-8b-fsdp2-h100.yaml"),
                             [f"system.software={stack}"])
    dev = kernel_device(cfg.system)
    if "NVL" in gpu:
        eff = cfg.system.device.memory_efficiency or 1.0
        dev = replace(dev, memory_Bps=NVL_BANDWIDTH_Bps * eff)
    return dev


def row_kernels(row: dict, backward: bool) -> tuple[list[float], float]:
    """Bytes per element of each kernel ddlsim gives a published row's op, and the element
    count they apply to (``backward``: the op's backward, twice the forward's traffic for
    the norm and the activation, :func:`loss_passes` for the cross-entropy)."""
    from ddlsim.simulator.kernels.elementwise import (activation_passes, loss_passes,
                                                      norm_passes)
    cfgx, x = json.loads(row["config"]), int(row["x_value"])
    name, prov = row["kernel_name"], row["provider"]
    if name == "megatron_cross_entropy":
        return loss_passes(2, prov == "megatron-fused", backward), cfgx["S"] * cfgx["B"] * x
    if name == "megatron_swiglu":
        per = activation_passes(True, False, prov == "megatron", 2)
        n = cfgx["S"] * cfgx["B"] * x
    elif name == "megatron_rms_norm":       # nn.RMSNorm: torch's fused CUDA kernel (bf16)
        per, n = norm_passes(True, "rmsnorm", 2, x), cfgx["S"] * cfgx["B"] * x
    else:                                   # HF LlamaRMSNorm: the composite, fp32 weight
        per = norm_passes(False, "rmsnorm", 2, x)
        per[-1] = 2 + 4                     # bf16 times the fp32 weight: an fp32 output
        n = cfgx["M"] * x
    return ([2 * p for p in per] if backward else per), n


def predicted_s(row: dict, dev) -> tuple[float, bool]:
    """ddlsim's seconds for a published row (forward, backward, or both where the row's
    backward mode reran the forward: ``includes_forward``) and whether the host bounds it
    (the kernels' dispatch, ``n·host``, outlasts their device time and gaps)."""
    from ddlsim.simulator.kernels import kernel_time, op_time
    from ddlsim.workloads.trace import Compute, Kernel

    def op(backward: bool) -> tuple[float, float]:
        per, n = row_kernels(row, backward)
        ks = tuple(Kernel("memory", bytes=p * n) for p in per)
        t = op_time(Compute("k", 0.0, sum(k.bytes for k in ks), kind="elementwise",
                            kernels=ks), dev)
        return t, sum(kernel_time(k, dev) for k in ks) + len(ks) * dev.launch.gap_s
    passes = [False] if row["mode"] == "forward" else \
        [True] + ([False] if row["includes_forward"] == "1" else [])
    times = [op(b) for b in passes]
    return sum(t for t, _ in times), any(t > d * (1 + 1e-9) for t, d in times)


def kernel_table() -> list[dict]:
    """One record per published row: measured and predicted ms and their ratio."""
    devs = {}
    out = []
    for row in published():
        dev = devs.setdefault(row["gpu"], _device(row["gpu"]))
        ms = float(row["median_ms"])
        pred, host = predicted_s(row, dev)
        out.append({"kernel": f"{row['kernel_name']} {row['provider']}", "mode": row["mode"],
                    "x": f"{row['x_name']}={row['x_value']}", "gpu": row["gpu"][7:],
                    "measured_ms": ms, "ddlsim_ms": round(pred * 1e3, 4),
                    "measured/ddlsim": round(ms / (pred * 1e3), 2),
                    "ddlsim bound": "host" if host else "device"})
    return out


def _kind(name: str, k) -> str:
    """The breakdown kind of kernel ``k`` of op ``name`` (``k`` None: an op without kernels)."""
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
    from ddlsim.simulator.kernels import kernel_device, kernel_time, op_time
    from ddlsim.workloads.trace import Compute
    dev, prog = kernel_device(cfg.system), build_workload(cfg).classes[0].program
    out, kernels = Counter(), 0
    for step in prog.steps:
        for op in prog.blocks[step.block].flat.ops:
            p = op.payload
            if not isinstance(p, Compute) or p.seconds is not None:
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
    ap.add_argument("--step", action="store_true", help="only the step breakdowns")
    args = ap.parse_args(argv)
    import warnings
    warnings.simplefilter("ignore")
    if not args.step:
        _print(kernel_table())
    if args.kernels:
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

"""Predicted vs measured speedup of torchao's float8 rowwise recipe over bf16 on one linear
layer, by shape: the kernel-level check of ddlsim's FP8 recipe model (docs/compute.md, "FP8").

Run:  python benchmarks/validate_fp8_linear.py [--worst N]

The measurement (``data/torchao_fp8_rowwise_linear.csv``, its header gives the provenance):
pytorch/ao's published table of ``LayerNorm → Linear → Sigmoid`` forward + backward on an H100,
both models compiled, GPU kernel time, 216 shapes ``M, K, N`` from 1024 to 32768. ddlsim times
the same kernels on ``grand-teton-h100`` (Meta's HBM2e H100 at 2.4 TB/s, the part torchao's
roofline names) under the ``torchtitan-2025`` stack with ``fp8_recipe: rowwise`` and
``compile``: in both precisions the LayerNorm forward (read and write ``M·K`` in bf16: 4 bytes
per element) and backward (6), the sigmoid forward (4 per ``M·N``) and backward (6), and the
linear's three GEMMs; in FP8 the linear as :func:`ddlsim.workloads.decoder.layerkernels._linear`
builds it (the recipe's cast passes, its GEMM kernels and rescale passes:
``ddlsim/simulator/kernels/fp8recipe.py``). The profiler's sum of kernel times has no launch
gaps, so none are added. The speedup is ``t_bf16 / t_fp8``; the error ``predicted / measured
− 1`` (positive: ddlsim predicts more gain than was measured). Nothing is fitted to the table.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from public_runs import DATA, read_csv  # noqa: E402

TABLE = DATA / "torchao_fp8_rowwise_linear.csv"


def device_and_stack(recipe: str = "rowwise"):
    """The :class:`~ddlsim.simulator.kernels.device.KernelDevice` of ``grand-teton-h100`` and
    the resolved ``torchtitan-2025`` stack with ``recipe`` and ``compile``."""
    import ddlsim
    from ddlsim.errors import DDLSimWarning
    from ddlsim.simulator.kernels.device import kernel_device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DDLSimWarning)
        cfg = ddlsim.load_config({
            "model": {"preset": "llama-3.1-8b"}, "parallel": {},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192,
                      "dtype": "fp8"},
            "system": {"preset": "grand-teton-h100",
                       "software": {"stack": "torchtitan-2025", "compile": True,
                                    "kernels": {"fp8_recipe": recipe}}}})
    return kernel_device(cfg.system), cfg.software


def block_seconds(M: float, K: float, N: float, dtype: str, dev, sw) -> float:
    """GPU seconds of ``LayerNorm → Linear → Sigmoid`` forward + backward with the linear's
    GEMMs in ``dtype`` (module docstring)."""
    from ddlsim.simulator.kernels.device import kernel_time
    from ddlsim.workloads.decoder.layerkernels import _linear
    from ddlsim.workloads.trace import Kernel
    ew = [Kernel("memory", bytes=b) for b in (4 * M * K, 6 * M * K, 4 * M * N, 6 * M * N)]
    linear = [k for bwd in (False, True)
              for k in _linear((M, N, K), dtype, bwd, sw.fp8_recipe, bool(sw.compile))]
    return sum(kernel_time(k, dev) for k in ew + linear)


def evaluate(table: Path = TABLE) -> list[dict]:
    """One record per measured shape: ``M``, ``K``, ``N``, measured and predicted speedup,
    and the error."""
    dev, sw = device_and_stack()
    out = []
    for row in read_csv(table):
        M, K, N = (float(row[k]) for k in ("M", "K", "N"))
        pred = (block_seconds(M, K, N, "bf16", dev, sw)
                / block_seconds(M, K, N, "fp8", dev, sw))
        meas = float(row["speedup"])
        out.append({"M": int(M), "K": int(K), "N": int(N), "measured": meas,
                    "predicted": pred, "error": pred / meas - 1})
    return out


def large(o: dict) -> bool:
    """A shape whose GEMMs outweigh its casts: ``M ≥ 8192`` and ``K, N ≥ 4096``."""
    return o["M"] >= 8192 and o["K"] >= 4096 and o["N"] >= 4096


def stats(out: list[dict]) -> dict:
    """``mean`` |error|, ``signed`` mean, ``worst`` record, and ``same_side``: the shapes on
    which ddlsim agrees with the measurement on whether FP8 beats bf16 at all."""
    errs = [o["error"] for o in out]
    return {"mean": sum(map(abs, errs)) / len(errs), "signed": sum(errs) / len(errs),
            "worst": max(out, key=lambda o: abs(o["error"])),
            "same_side": sum((o["measured"] >= 1) == (o["predicted"] >= 1) for o in out)}


def summary(out: list[dict]) -> str:
    """Mean and worst |error|, the signed mean and the faster-or-slower agreement, over all
    shapes and over the :func:`large` ones."""
    lines = []
    for label, rows in (("all", out), ("large (M >= 8192, K, N >= 4096)",
                                       [o for o in out if large(o)])):
        st, w = stats(rows), stats(rows)["worst"]
        lines.append(f"{label}: mean |error| {100 * st['mean']:.1f}%, worst "
                     f"{100 * w['error']:+.1f}% (M={w['M']} K={w['K']} N={w['N']}), signed "
                     f"mean {100 * st['signed']:+.1f}% over {len(rows)} shapes; faster or "
                     f"slower than bf16 as measured on {st['same_side']} of {len(rows)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worst", type=int, default=12, help="rows to list, largest |error| first")
    args = ap.parse_args(argv)
    out = evaluate()
    print(f"{'M':>6} {'K':>6} {'N':>6}  {'measured':>8}  {'predicted':>9}  {'error':>7}")
    for o in sorted(out, key=lambda o: -abs(o["error"]))[:args.worst]:
        print(f"{o['M']:6d} {o['K']:6d} {o['N']:6d}  {o['measured']:8.2f}  "
              f"{o['predicted']:9.2f}  {100 * o['error']:+6.1f}%")
    print()
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit the one fitted constant of ddlsim's FP8 rowwise recipe, ``ROWWISE_PASS_SHARE``
(``ddlsim/simulator/kernels/fp8recipe.py``): the share of the streaming bandwidth at which
the compiled rowwise recipe's input and output-gradient passes and its rescales move their
bytes, on half of torchao's per-linear table, and report the other half held out.

Run:  python benchmarks/fit_fp8_rowwise_passes.py

The table (``data/torchao_fp8_rowwise_linear.csv``, provenance in its header) is a published
kernel-level measurement: ``LayerNorm → Linear → Sigmoid`` forward + backward, compiled, on an
H100, 216 shapes. The fit takes the 108 shapes with M = 1024, 4096, 16384; the 108 with
M = 2048, 8192, 32768 are held out. The share is searched on a 0.01 grid from 0.05 to 1.00
for the least mean |error| of the predicted speedup over the fit shapes (each shape timed as
``validate_fp8_linear.py`` times it). Nothing end-to-end enters the fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import validate_fp8_linear as v  # noqa: E402
from public_runs import read_csv  # noqa: E402

FIT_M = (1024, 4096, 16384)
GRID = [i / 100 for i in range(5, 101)]


def shapes() -> tuple[list[tuple], list[tuple]]:
    """``(fit, held_out)``: ``(M, K, N, measured speedup)`` of the table's shapes."""
    rows = [tuple(float(r[k]) for k in ("M", "K", "N", "speedup")) for r in read_csv(v.TABLE)]
    return [r for r in rows if r[0] in FIT_M], [r for r in rows if r[0] not in FIT_M]


def errors(share: float, rows: list[tuple], dev, sw) -> list[float]:
    """Predicted / measured − 1 of the speedup of each of ``rows`` with the share ``share``."""
    from ddlsim.simulator.kernels import fp8recipe
    saved = dict(fp8recipe.FP8_PASS_KERNELS)
    fp8recipe.FP8_PASS_KERNELS.update(inductor_rowwise=share,
                                      inductor_rowwise_transpose=share * 1.4 / 2.2)
    try:
        return [v.block_seconds(M, K, N, "bf16", dev, sw)
                / v.block_seconds(M, K, N, "fp8", dev, sw) / meas - 1
                for M, K, N, meas in rows]
    finally:
        fp8recipe.FP8_PASS_KERNELS.clear()
        fp8recipe.FP8_PASS_KERNELS.update(saved)


def mean_abs(errs: list[float]) -> float:
    return sum(map(abs, errs)) / len(errs)


def fit() -> dict:
    """The fitted share and the mean |error| of the fit and held-out shapes, before (share
    1: the passes at the bandwidth the model gives them without the fit) and after."""
    dev, sw = v.device_and_stack()
    fit_rows, held = shapes()
    share = min(GRID, key=lambda x: (mean_abs(errors(x, fit_rows, dev, sw)), x))
    return {"share": share,
            **{f"{name}_{tag}": mean_abs(errors(x, rows, dev, sw))
               for name, rows in (("fit", fit_rows), ("held", held))
               for tag, x in (("before", 1.0), ("after", share))}}


def main() -> int:
    out = fit()
    print(f"fitted ROWWISE_PASS_SHARE = {out['share']:.2f}")
    for name in ("fit", "held"):
        print(f"{name:>4} shapes: mean |error| {100 * out[name + '_before']:.1f} % -> "
              f"{100 * out[name + '_after']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The closed loop's iteration op by op: numpy's CPU time against ddlsim's charge per trace op.

    python benchmarks/closed_loop.py --ranks 1 -o closed-loop   # calibrate, predict, run
    python benchmarks/closed_loop_ops.py closed-loop            # then account for one rank

Reads the loop's run config and profile of one rank (``run-ddp-1.yaml``, ``profile1.yaml``
in the folder), times each trace op's numpy work in this process (one BLAS thread, freed
memory cached as in the loop; the least of ``--iters``) and prints, per op of the trace, the
measured and predicted milliseconds and the error (ddlsim/reference/accounting.py).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads its BLAS

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a closed loop's output folder (-o)")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations (>= 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    cfg_path, prof_path = args.folder / "run-ddp-1.yaml", args.folder / "profile1.yaml"
    if not (cfg_path.exists() and prof_path.exists()) or args.iters < 1:
        ap.error(f"needs {cfg_path} and {prof_path} (python benchmarks/closed_loop.py "
                 f"--ranks 1 -o {args.folder}) and --iters >= 1 (got {args.iters})")
    import ddlsim
    from ddlsim.calibration import CalibrationProfile
    from ddlsim.reference.accounting import account, measured_ops, predicted_ops
    from ddlsim.reference.machine import cache_allocations
    from ddlsim.reference.train import shape_of
    cfg = ddlsim.load_config(cfg_path)
    cached = cache_allocations()
    load = os.getloadavg()[0]
    rows = account(measured_ops(shape_of(cfg), iters=args.iters),
                   predicted_ops(cfg, CalibrationProfile.load(prof_path)))
    print(f"load average {load:.2f}; freed memory cached: {cached}")
    print(f"{'trace op':32s} {'numpy (ms)':>10s} {'ddlsim (ms)':>11s} {'error':>8s}")
    for r in rows:
        print(f"{r['op']:32s} {r['measured_s'] * 1e3:10.2f} {r['predicted_s'] * 1e3:11.2f} "
              f"{r['error']:+8.1%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

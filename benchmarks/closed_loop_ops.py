"""The closed loop's runs op by op: numpy's CPU time against ddlsim's charge per trace op.

    python benchmarks/closed_loop.py -o closed-loop      # calibrate, predict, run, compare
    python benchmarks/closed_loop_ops.py closed-loop     # then each run's account

Prints, for each run the loop compared (``closed_loop.json`` in the folder), every compute op
of ddlsim's trace: the least CPU time of its numpy work over the interleaved job's rounds
(the most over ranks), the cost model's time with the loop's own profile, and the error
(ddlsim/reference/accounting.py says which numpy step each op is charged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def table(row: dict) -> str:
    """The account of one loop row as text."""
    lines = [f"{row['strategy']} on {row['ranks']} rank(s): {'trace op':>20s} "
             f"{'numpy (ms)':>10s} {'ddlsim (ms)':>11s} {'error':>8s}"]
    for r in row["ops"]:
        lines.append(f"  {r['op']:44s} {r['measured_s'] * 1e3:10.2f} "
                     f"{r['predicted_s'] * 1e3:11.2f} {r['error']:+8.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a closed loop's output folder (-o)")
    ap.add_argument("--ranks", type=int, default=None, help="only the runs of this many ranks")
    args = ap.parse_args(argv)
    path = args.folder / "closed_loop.json"
    if not path.exists():
        ap.error(f"{path} does not exist: run python benchmarks/closed_loop.py -o "
                 f"{args.folder} first")
    rows = [r for r in json.loads(path.read_text()) if "ops" in r
            and args.ranks in (None, r["ranks"])]
    if not rows:
        ap.error(f"{path} has no compared run with an op-by-op account"
                 + (f" on {args.ranks} rank(s)" if args.ranks else ""))
    print("\n\n".join(table(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

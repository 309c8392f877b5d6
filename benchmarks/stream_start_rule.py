"""A kernel on a second stream against a persistent GEMM, measured on one H200, beside a rule
with no fitted parameter (the lead of docs/moe.md, "Expert-parallel communication overlap").

The measurement is ``benchmarks/data/device_h200_2026-11-30/run10/stream_start.json``
(``benchmarks/device/stream_start.py``: a chain of identical bf16 GEMMs on one stream; on
another, a spin, then an element-wise add that becomes ready mid-chain; normal or high
priority). cuBLAS ran every GEMM as a persistent kernel, one CTA per SM looping over output
tiles (the kernel's name gives the tile, ``nvjet_sm90_tst_<M>x<N>_...``; its grid the CTAs).

The rule: the side kernel cannot start while every SM holds a GEMM CTA; the first CTAs retire
when the tiles run out, at the start of the GEMM's last, partial round of tiles:
``rounds = tiles / CTAs``, the last round beginning ``floor(rounds) / rounds`` of the way
through the kernel (all CTAs take the same time per tile). A side kernel ready before that
waits until then; ready after it, it starts at once (``max(0, last_round - ready)``). The
tiles are ``ceil(M/tm) · ceil(N/tn)`` for the kernel's ``tm × tn`` tile.

Run: ``python benchmarks/stream_start_rule.py [--markdown]``
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys

from public_runs import DATA, print_table

RUN = DATA / "device_h200_2026-11-30" / "run10" / "stream_start.json"


def tiles(name: str, m: int, n: int) -> int:
    """Output tiles of a GEMM of ``m × n`` run by the nvjet kernel ``name``."""
    hit = re.search(r"_tst_(\d+)x(\d+)_", name)
    if hit is None:
        raise ValueError(f"no tile in kernel name {name!r}")
    tm, tn = int(hit.group(1)), int(hit.group(2))
    return math.ceil(m / tm) * math.ceil(n / tn)


def rule_delay_us(rep: dict, m: int, n: int) -> float:
    """The rule's delay of one repeat (µs): from ready to the running GEMM's last round."""
    ctas = math.prod(rep["gemm_grid"])
    rounds = tiles(rep["gemm_kernel"], m, n) / ctas
    last_round = rep["gemm_start"] + math.floor(rounds) / rounds * rep["gemm_dur_us"]
    return max(0.0, last_round - rep["ready"])


def rows() -> list[dict]:
    """Per case with a side kernel: the measured and the rule's median delay (µs)."""
    out = []
    for case in json.loads(RUN.read_text())["cases"]:
        reps = [r for r in case["repeats"] if "delay_us" in r and "gemm_kernel" in r]
        if not reps:
            continue
        m, n, _ = case["mnk"]
        out.append({"case": case["case"], "gemm_us": statistics.median(r["gemm_dur_us"]
                                                                       for r in reps),
                    "measured_us": statistics.median(r["delay_us"] for r in reps),
                    "rule_us": statistics.median(rule_delay_us(r, m, n) for r in reps),
                    "to_end_us": statistics.median(r["to_gemm_end_us"] for r in reps),
                    "priority": "high" if case["priority"] < 0 else "normal"})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    lines = [[r["case"], r["priority"], f"{r['gemm_us']:.0f}", f"{r['measured_us']:.0f}",
              f"{r['rule_us']:.0f}", f"{r['to_end_us']:.0f}"] for r in rows()]
    print_table(["case", "side stream", "GEMM µs", "measured delay µs", "rule µs",
                 "to the GEMM's end µs"], lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

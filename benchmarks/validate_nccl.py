"""ddlsim's collective bus bandwidth against published nccl-tests results (A100, H100).

Run:  python benchmarks/validate_nccl.py [--engine analytical|des] [--write-docs] [--fit]
      python benchmarks/validate_nccl.py --include-excluded [--engine analytical|des]
      python benchmarks/validate_nccl.py --nccl-version 2.30.7   # every row with one release
      python benchmarks/validate_nccl.py --nccl-tests OUTPUT --gpu A100|H100 [--op OP]
                                         [--nodes N] [--ranks N] [--algorithm nccl_ring|...]

Each row of ``benchmarks/data/nccl_tests_published.csv`` (sources cited in its header) is one
nccl-tests measurement: an operation on ``gpus`` GPUs over ``nodes`` nodes at one size. ddlsim
times the same operation, one group of all the GPUs, on the system preset of that GPU
(``dgx-a100``, ``dgx-h100``, with the row's GPUs spread evenly over its nodes; 4 NICs a node
for the 4-HDR servers of nccl-tests issue #119) with
its default collective backend (NCCL's tuning model on these GPUs, with the NVLS plateau and
pipeline fill as measured: ``simulator/collectives/nccl/measured.py``), and reports the bus
bandwidth nccl-tests would print: ``busbw = size / time × factor`` (nccl-tests
doc/PERFORMANCE.md). A row is timed with the tuning model of the NCCL release its source states
(column ``nccl_version``; ``simulator/collectives/nccl/versions.py``) where ddlsim tabulates
it, else with ddlsim's default, its role saying which; ``--nccl-version`` times every row with
one.
Rows whose ``role`` is ``fitted`` are the calibration data of ``measured.py``'s three fitted
constants and of ``hops.py``'s two; the summary gives them apart
from the ``held-out`` rows, which set nothing and are the validation. Small messages (under 1
MiB) are recorded by nccl-tests' out-of-place ``time`` (``time_us``: their printed busbw is
0.00) and summarised on lines of their own (held-out, fitted), so that the figures from 1 MiB
up stay comparable. Then one line per size band (:data:`BANDS`) and one for issue 29's target
(every held-out size within 25 %, mean within 10 %). A row with a reason in its ``excluded``
column (the source's own repeated measurement of that size disagrees with it) is shown with
that reason and left out of every mean and worst, on a line that names it;
``--include-excluded`` counts those rows like the others instead (the figures docs/comm.md
gives "with the 32 B row"; not with ``--write-docs``, ``--fit`` or ``--nccl-tests``).
``--write-docs`` replaces the nccl-tests section of ``docs/validation.md`` with the table
printed. ``--nccl-tests`` compares one's own nccl-tests output (text or ``-J`` JSON, read by
``ddlsim.calibration.readers``; every size, out-of-place) instead, on the preset of ``--gpu``
(``--algorithm``: the ``NCCL_ALGO`` it ran).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).with_name("data") / "nccl_tests_published.csv"
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- nccl-tests: begin -->", "<!-- nccl-tests: end -->"
PRESET = {"A100": "dgx-a100", "H100": "dgx-h100"}
#: nccl-tests doc/PERFORMANCE.md bus-bandwidth factors
FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
          "reduce_scatter": lambda p: (p - 1) / p}
#: rows under this size (bytes) are summarised apart: the small-message regime, where a
#: collective's time is its latency, not its bandwidth
SMALL_BYTES = 2**20
#: size bands of the per-band summary, (from bytes, below bytes, name): pure latency, the
#: latency-bound small messages, then the fill-bound, mid and bandwidth-bound sizes
BANDS = ((0, 2**10, "< 1 KiB"), (2**10, 2**20, "1 KiB-1 MiB"), (2**20, 2**24, "1-16 MiB"),
         (2**24, 2**28, "16-256 MiB"), (2**28, 2**32, "256 MiB-4 GiB"),
         (2**32, float("inf"), ">= 4 GiB"))
#: issue 29's target for nccl-tests: every size within this |error| ...
TARGET_WORST = 0.25
#: ... and a mean |error| within this, over the held-out rows
TARGET_MEAN = 0.10


def rows() -> list[dict]:
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def measured_busbw(row: dict) -> float:
    """The row's measured bus bandwidth (GB/s): ``busbw_GBps`` where recorded, else nccl-tests'
    own formula on the out-of-place ``time_us``: ``size / time × factor`` (doc/PERFORMANCE.md)."""
    if row.get("busbw_GBps"):
        return float(row["busbw_GBps"])
    size, p = float(row["size_bytes"]), int(row["gpus"])
    return size / (float(row["time_us"]) * 1e-6) * FACTOR[row["op"]](p) / 1e9


def time_us(row: dict, busbw_GBps: float) -> float:
    """The time (µs) of one collective of the row's size at ``busbw_GBps`` of bus bandwidth."""
    size, p = float(row["size_bytes"]), int(row["gpus"])
    return size * FACTOR[row["op"]](p) / (busbw_GBps * 1e9) * 1e6


def row_version(row: dict, version: str | None = None) -> tuple[str, str]:
    """(NCCL release the row is timed with, note for its role): ``version`` where given (every
    row), else the release the source states (column ``nccl_version``) where ddlsim tabulates
    it, else ddlsim's default; the note says which and why ("" for an unstated release)."""
    from ddlsim.simulator.collectives.nccl.versions import DEFAULT_VERSION, NCCL_VERSIONS
    stated = row.get("nccl_version") or ""
    if version is not None:
        return version, f"NCCL {version} (--nccl-version)"
    if not stated:
        return DEFAULT_VERSION, ""
    if stated in NCCL_VERSIONS:
        return stated, f"NCCL {stated} as stated"
    return DEFAULT_VERSION, f"NCCL {stated} stated, not tabulated: timed with {DEFAULT_VERSION}"


def system(row: dict, version: str | None = None):
    from ddlsim.config import SystemConfig, resolve_section
    spec = {"preset": PRESET[row["gpu"]], "nodes": int(row["nodes"]),
            "collectives": {"nccl_version": row_version(row, version)[0]}}
    gpus, nodes = int(row["gpus"]), int(row["nodes"])
    if nodes > 1 and gpus % nodes == 0:  # the row's GPUs on each node (nccl150: one of each)
        spec["devices_per_node"] = gpus // nodes
    if row["source"] == "nccl119":
        spec["nics_per_node"] = 4  # 4 x HDR 200 Gb/s per server (the hardware)
    if row["source"] == "nccl812":  # DGX A100: 2 x AMD EPYC 7742 (NVIDIA DGX A100 user guide)
        spec["collectives"]["cpu_vendor"] = "amd"
    return SystemConfig.model_validate(resolve_section("system", spec))


def predicted_busbw(row: dict, engine: str, version: str | None = None) -> tuple[float, str]:
    """(busbw GB/s, algorithm label) of one collective of the row's size on all its GPUs, with
    the NCCL release of :func:`row_version`."""
    from ddlsim.simulator.analytical.engine import simulate_analytical
    from ddlsim.simulator.costs import CostModel
    from ddlsim.workloads.trace import (Block, Collective, GroupFamily, Op, Program, RankClass,
                                        Step, Workload, WorkloadMeta)
    p, op, size = int(row["gpus"]), row["op"], float(row["size_bytes"])
    coll = Collective("x", op, "g", size, algorithm=row["algorithm"] or None)
    program = Program({"b": Block("b", "other", (Op(coll),))}, (Step("b"),))
    wl = Workload("nccl-test", p, {"g": GroupFamily("g", "dp", np.arange(p).reshape(1, p))},
                  (RankClass("all", tuple(range(p)), program),), WorkloadMeta(1, 1))
    cost = CostModel(system(row, version), wl)
    if engine == "des":
        from ddlsim.simulator.des import run_des
        t = run_des(wl, cost, record_spans=False)[0].timings[0].end
    else:
        t = simulate_analytical(wl, cost).timings[0].end
    return size / t * FACTOR[op](p) / 1e9, cost.choice(coll).label


def output_rows(path: str, gpu: str, nodes: int | None = None, ranks: int | None = None,
                algorithm: str = "", op: str | None = None) -> list[dict]:
    """The rows of one nccl-tests output, as the CSV's (out-of-place time, role held-out)."""
    from ddlsim.calibration.readers.nccl_json import read_nccl_tests_json
    from ddlsim.calibration.readers.nccl_tests import read_nccl_tests_text
    reader = read_nccl_tests_json if path.endswith(".json") else read_nccl_tests_text
    got = reader(path, op=op, ranks=ranks, nodes=nodes).table
    got = got[(got["variant"] == "out_of_place") & (got["bytes"] > 0)]
    wrong = sorted(set(got["op"]) - set(FACTOR))
    if wrong:
        raise ValueError(f"{path}: op {', '.join(wrong)} is not compared; allowed: "
                         f"{', '.join(FACTOR)}")
    from ddlsim.simulator.collectives import algorithms_for
    for name in sorted(set(got["op"])):
        if algorithm and algorithm not in algorithms_for(name, "nccl"):
            raise ValueError(f"--algorithm {algorithm!r} is not one of NCCL's for {name}; "
                             f"allowed: {', '.join(algorithms_for(name, 'nccl'))}")
    return [{"source": Path(path).stem, "gpu": gpu, "gpus": str(r.ranks), "nodes": str(r.nodes),
             "op": r.op, "size_bytes": str(r.bytes), "busbw_GBps": str(r.busbw_Bps / 1e9),
             "role": "held-out", "algorithm": algorithm} for r in got.itertuples()]


def table(engine: str, data: list[dict] | None = None, include_excluded: bool = False,
          version: str | None = None) -> tuple[list[str], dict[str, list[float]]]:
    """The markdown table, and the errors (ddlsim / measured − 1) per row role, per size (key
    ``size:<bytes>``: every row of that size, whatever its role) and per role and size (key
    ``<role>:<bytes>``); a row with an ``excluded`` reason is shown with it and counted under
    ``excluded`` only (its line, reason included, under ``excluded rows``), or, with
    ``include_excluded``, counted like the others (its reason still shown). Each row is timed
    with the NCCL release of :func:`row_version` (``version``: every row with that one), named
    in its role where one is stated or given."""
    lines = ["| source | GPU | GPUs | nodes | op | size | measured busbw (GB/s) | ddlsim busbw "
             "(GB/s) | measured time (µs) | ddlsim time (µs) | error | ddlsim algorithm | role |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {"fitted": [], "held-out": [], "small": [],
                                      "small fitted": []}
    for row in rows() if data is None else data:
        got, label = predicted_busbw(row, engine, version)
        pub = measured_busbw(row)
        err = got / pub - 1
        size = float(row["size_bytes"])
        note = row_version(row, version)[1]
        role = f"{row['role']}, {note}" if note else row["role"]
        if row.get("excluded") and not include_excluded:  # shown, counted in no mean or worst
            errors.setdefault("excluded", []).append(err)
            errors.setdefault("excluded rows", []).append(
                f"{row['source']} {row['op']} {_size(size)} {100 * err:+.1f}% ({row['excluded']})")
            role = f"{role}, excluded: {row['excluded']}"
        else:
            if row.get("excluded"):
                role = f"{role}, counted though excluded: {row['excluded']}"
            errors[_role_key(row["role"], size)].append(err)
            errors.setdefault(f"size:{size:.0f}", []).append(err)
            errors.setdefault(f"{row['role']}:{size:.0f}", []).append(err)
        lines.append(f"| {row['source']} | {row['gpu']} | {row['gpus']} | {row['nodes']} | "
                     f"{row['op']} | {_size(size)} | {_bw(pub)} | {_bw(got)} | "
                     f"{time_us(row, pub):.1f} | {time_us(row, got):.1f} | {100 * err:+.1f}% | "
                     f"{label}{' (forced)' if row['algorithm'] else ''} | {role} |")
    return lines, errors


def _role_key(role: str, size: float) -> str:
    """The summary line a row counts in: its role from 1 MiB up, ``small`` (held-out) or
    ``small fitted`` below."""
    if size >= SMALL_BYTES:
        return role
    return "small" if role == "held-out" else "small fitted"


def _bw(GBps: float) -> str:
    return f"{GBps:.1f}" if GBps >= 1 else f"{GBps:.3g}"


def _size(b: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:g} {unit}"
    return f"{b:g} B"


def summary(errors: dict[str, list[float]], engine: str) -> str:
    """One line per role (held-out first: the validation) and one for all rows, from 1 MiB up;
    one for the small messages (under 1 MiB) held out, one for those fitted; the worst error
    per size (every role)."""
    parts = [("held-out (validation)", errors["held-out"]),
             ("fitted (calibration data)", errors["fitted"]),
             ("all", errors["held-out"] + errors["fitted"]),
             ("small messages (< 1 MiB, held-out)", errors.get("small", [])),
             ("small messages (< 1 MiB, fitted)", errors.get("small fitted", []))]
    out = []
    for name, errs in parts:
        if not errs:
            continue
        a = np.abs(errs)
        out.append(f"{name}: {len(errs)} measurements, mean |error| {100 * a.mean():.1f}%, "
                   f"median {100 * np.median(a):.1f}%, worst {100 * a.max():.1f}%, signed mean "
                   f"{100 * np.mean(errs):+.1f}%")
    sizes = sorted((float(k[5:]), v) for k, v in errors.items() if k.startswith("size:"))
    out.append("worst per size: " + ", ".join(
        f"{_size(b)} {100 * max(errs, key=abs):+.1f}% ({len(errs)})" for b, errs in sizes))
    out += band_lines(errors)
    if errors.get("excluded rows"):
        out.append("excluded from every mean and worst above (the source disagrees with itself): "
                   + "; ".join(errors["excluded rows"]))
    return "\n".join(out) + (f"\n({engine} engine; error = ddlsim busbw / measured − 1, so + is "
                             "optimistic)")


def _by_role_and_size(errors: dict[str, list[float]], role: str) -> list[tuple[float, list]]:
    """(size in bytes, errors) of one role's rows, ascending (keys ``<role>:<bytes>``)."""
    head = f"{role}:"
    return sorted((float(k[len(head):]), v) for k, v in errors.items() if k.startswith(head))


def band_lines(errors: dict[str, list[float]]) -> list[str]:
    """One line per size band of :data:`BANDS` (held-out and fitted rows apart: count, mean and
    worst |error|), and one for issue 29's target over the held-out rows (every size within
    :data:`TARGET_WORST`, mean within :data:`TARGET_MEAN`); none without per-role sizes."""
    held = _by_role_and_size(errors, "held-out")
    fitted = _by_role_and_size(errors, "fitted")
    if not held and not fitted:
        return []

    def stats(pairs, lo, hi):
        errs = [e for b, v in pairs if lo <= b < hi for e in v]
        if not errs:
            return "none"
        a = np.abs(errs)
        return (f"{len(errs)}, mean |error| {100 * a.mean():.1f}%, worst "
                f"{100 * max(errs, key=abs):+.1f}%")

    out = [f"band {name}: held-out {stats(held, lo, hi)}; fitted {stats(fitted, lo, hi)}"
           for lo, hi, name in BANDS if stats(held + fitted, lo, hi) != "none"]
    if held:
        a = np.abs([e for _, v in held for e in v])
        beyond = [f"{_size(b)} {100 * max(v, key=abs):+.1f}%" for b, v in held
                  if max(np.abs(v)) > TARGET_WORST]
        met = a.mean() <= TARGET_MEAN and not beyond
        out.append(f"issue 29 target (held-out, every size within {100 * TARGET_WORST:.0f}%, mean "
                   f"within {100 * TARGET_MEAN:.0f}%): {len(a)} rows, mean |error| "
                   f"{100 * a.mean():.1f}%, sizes beyond: {', '.join(beyond) or 'none'} -> "
                   f"{'met' if met else 'not met'}")
    return out


def write_docs(lines: list[str], text: str) -> None:
    body = "\n".join([BEGIN, "", *lines, "", text, "", END])
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + body + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## NCCL collectives against nccl-tests\n\n" + body + "\n"
    DOC.write_text(doc)


def fit_fill() -> list[str]:
    """The scan that set ``measured.FILL_CHUNKS``: per algorithm, the mean |error| over its
    calibration rows (``nccl290`` for NVLS, ``nccl309a`` for NVLS-tree) at depths 1-5."""
    from ddlsim.simulator.collectives.nccl import measured, model
    out = []
    for algo, source in (("nvls", "nccl290"), ("nvls_tree", "nccl309a")):
        kept, scan = measured.FILL_CHUNKS[algo], []
        for depth in np.arange(1.0, 5.01, 0.5):
            measured.FILL_CHUNKS[algo] = float(depth)
            model._achieved_nvls.cache_clear()
            errs = [predicted_busbw(r, "analytical")[0] / float(r["busbw_GBps"]) - 1
                    for r in rows() if r["source"] == source]
            scan.append((float(np.mean(np.abs(errs))), float(depth)))
        measured.FILL_CHUNKS[algo] = kept
        model._achieved_nvls.cache_clear()
        out.append(f"{algo} on {source}: " + ", ".join(f"{d:g}: {100 * e:.2f}%" for e, d in scan)
                   + f" -> best {min(scan)[1]:g} (kept {kept:g})")
    return out


def fit_hop() -> str:
    """The fits that set ``hops.LL_HOP_US["ampere"]`` and ``hops.NET_LL_HOP_US``: the
    least-squares LL steps of the ``nccl123`` rows (NVLink) and of the ``nccl150`` rows
    (network; :func:`ddlsim.simulator.collectives.nccl.hops.fit_ll_hop_us`,
    ``fit_net_ll_hop_us``)."""
    from ddlsim.simulator.collectives.nccl import hops
    points = [(int(r["gpus"]), float(r["time_us"])) for r in rows() if r["source"] == "nccl123"]
    net = [(int(r["gpus"]), int(r["nodes"]), float(r["time_us"])) for r in rows()
           if r["source"] == "nccl150"]
    return (f"ring LL NVLink step on nccl123 ({len(points)} rows): "
            f"{hops.fit_ll_hop_us(points):.4f} us (kept {hops.LL_HOP_US['ampere']:g})\n"
            f"ring LL network step on nccl150 ({len(net)} rows): "
            f"{hops.fit_net_ll_hop_us(net):.4f} us (kept {hops.NET_LL_HOP_US:g})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="analytical", choices=["analytical", "des"])
    ap.add_argument("--write-docs", action="store_true",
                    help="replace the nccl-tests section of docs/validation.md")
    ap.add_argument("--fit", action="store_true",
                    help="print the fits of the fitted constants (NVLS pipeline depths, "
                         "A100 ring LL step, network LL step), and exit")
    ap.add_argument("--nccl-tests", metavar="OUTPUT",
                    help="an nccl-tests output (text, or .json from -J) to compare instead")
    ap.add_argument("--gpu", choices=sorted(PRESET), help="the GPU of --nccl-tests' run")
    ap.add_argument("--nodes", type=int, help="nodes of --nccl-tests' run (else its hosts)")
    ap.add_argument("--ranks", type=int, help="ranks of --nccl-tests' run (else its '# Rank' lines)")
    ap.add_argument("--op", help="the collective of --nccl-tests' run, where the output does not "
                    "name it (all_reduce, all_gather, reduce_scatter)")
    ap.add_argument("--algorithm", default="", help="the NCCL_ALGO --nccl-tests' run forced, as "
                    "ddlsim names it (nccl_ring, nccl_tree, nccl_nvls, …); default NCCL's choice")
    ap.add_argument("--include-excluded", action="store_true",
                    help="count the rows the CSV excludes (with a reason) in the means and "
                         "worsts; not with --write-docs, --fit or --nccl-tests")
    from ddlsim.simulator.collectives.nccl.versions import version_names
    ap.add_argument("--nccl-version", choices=version_names(),
                    help="time every row with this NCCL release's tuning model instead of the "
                         "one its source states (else ddlsim's default); not with --write-docs "
                         "or --fit")
    args = ap.parse_args(argv)
    if args.nccl_version and (args.write_docs or args.fit):
        ap.error("--nccl-version does not go with --write-docs or --fit (both time each row "
                 "with the release its source states)")
    if args.include_excluded and (args.write_docs or args.fit or args.nccl_tests):
        ap.error("--include-excluded does not go with --write-docs (the docs' table leaves "
                 "those rows out), --fit or --nccl-tests (neither reads the excluded column)")
    if args.fit:
        print("\n".join([*fit_fill(), fit_hop()]))
        return 0
    data = None
    if args.nccl_tests:
        if args.gpu is None or args.write_docs:
            ap.error("--nccl-tests needs --gpu, and does not write the docs")
        try:
            data = output_rows(args.nccl_tests, args.gpu, args.nodes, args.ranks, args.algorithm,
                               args.op)
        except Exception as exc:  # the readers' CalibrationError, a bad --algorithm, …
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        lines, errors = table(args.engine, data, args.include_excluded, args.nccl_version)
    except ValueError as exc:  # ConfigError: e.g. an NCCL_ALGO NCCL does not run there
        if data is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = summary(errors, args.engine)
    print("\n".join(lines))
    print("\n" + text)
    if args.write_docs:
        write_docs(lines, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read OSU micro-benchmarks output (osu_allreduce, osu_bcast, …, osu_latency, osu_bw).

Format (OMB 5.x–7.x): a title ``# OSU MPI Allreduce Latency Test v7.3`` (``MPI-CUDA``,
``NCCL`` … in place of ``MPI``), optionally ``# Datatype: MPI_CHAR.``, a column header such as
``# Size       Avg Latency(us)`` — with ``-f``: ``Min Latency(us)  Max Latency(us)
Iterations`` — or ``# Size          Latency (us)`` (osu_latency), ``# Size      Bandwidth (MB/s)``
(osu_bw), then one row per size. Latencies are µs (collectives: average over iterations and
ranks; osu_latency: half the round trip), bandwidth MB/s (10⁶ B/s).

Sizes are converted to the nccl-tests convention of the tidy table: OSU's ``Size`` is the
per-rank contribution for allgather (``MPI_Allgather(sendbuf, size, …)``) and the per-peer
block for alltoall, so ``bytes = size × ranks`` there; allreduce, reduce, bcast and
reduce_scatter (whole send buffer) keep ``size``. The OSU output does not say how many ranks
or nodes ran, so collectives need ``ranks`` and every file needs ``nodes`` or ``scope``.
osu_bw rows are ``sendrecv`` with ``variant = "streaming"``: time = size / bandwidth of a
window of back-to-back messages, which is a throughput, not one message's α + β·S.

A row that cannot be used (see :func:`read_osu`) is skipped and reported with its line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ...textio import MAX_DATA_BYTES, read_text
from ..schema import (MAX_TIME_S, CalibrationError, ReadResult, ResultParseError, comm_row,
                      tidy_frame)
from .checks import (Rows, RowSkipped, SizeOrder, looks_like_row, parse_float, parse_int,
                     parse_size, parse_time)

__all__ = ["read_osu", "parse_osu", "OSU_TESTS"]

_TITLE = re.compile(r"^#?\s*OSU\s+(?P<lib>\S+)\s+(?P<name>.+?)\s+Test(?:\s+v(?P<ver>[\d.]+))?",
                    re.IGNORECASE)
#: OSU test title → (operation, variant, size multiplier is ranks?)
OSU_TESTS: dict[str, tuple[str, str, bool]] = {
    "allreduce latency": ("all_reduce", "", False),
    "reduce latency": ("reduce", "", False),
    "broadcast latency": ("broadcast", "", False),
    "allgather latency": ("all_gather", "", True),
    "reduce_scatter latency": ("reduce_scatter", "", False),
    "reduce_scatter_block latency": ("reduce_scatter", "", False),
    "all-to-all personalized exchange latency": ("all_to_all", "", True),
    "latency": ("sendrecv", "", False),
    "bandwidth": ("sendrecv", "streaming", False),
}
_COLUMNS = {"size": "size", "avglatency(us)": "mean", "latency(us)": "mean",
            "minlatency(us)": "min", "maxlatency(us)": "max", "iterations": "n",
            "bandwidth(mb/s)": "bw"}


def _test(title: re.Match, path: Path, lineno: int) -> tuple[str, str, bool]:
    name = title["name"].strip().lower()
    if name not in OSU_TESTS:
        raise ResultParseError(path, lineno, f"OSU test {title['name']!r} is not supported; "
                               f"supported: {', '.join(sorted(OSU_TESTS))}")
    return OSU_TESTS[name]


def _header(line: str) -> list[str] | None:
    names = [re.sub(r"\s+", "", n).lower() for n in re.split(r"\s{2,}", line.lstrip("#").strip())]
    return [_COLUMNS.get(n, "") for n in names] if names and names[0] == "size" else None


def _row(tokens: list[str], cols: list[str]) -> dict[str, float]:
    if len(tokens) != len(cols):
        cut = "truncated: " if len(tokens) < len(cols) else ""
        raise RowSkipped(f"{cut}{len(tokens)} columns, the column header has {len(cols)}")
    out: dict[str, float] = {"size": parse_size(tokens[0])}
    for name, tok in zip(cols[1:], tokens[1:]):
        if name in ("mean", "min", "max"):
            out[name] = parse_time(tok, f"{name} latency (µs)", 1e-6)
        elif name == "bw":
            out[name] = parse_float(tok, "bandwidth (MB/s)") * 1e6
            if not out[name] > 0:
                raise RowSkipped(f"bandwidth {tok} MB/s must be > 0")
        elif name == "n":
            out[name] = parse_int(tok, "iterations")
    if "bw" in out and not 0 < out["size"] / out["bw"] <= MAX_TIME_S:
        raise RowSkipped(f"size {out['size']} B at {tokens[1]} MB/s gives no time in "
                         f"(0, {MAX_TIME_S:g}] s")
    return out


def _scan(text: str, path: Path) -> tuple[dict, Rows]:
    meta: dict = {}
    cols: list[str] = []
    rows, order = Rows(path), SizeOrder()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if m := _TITLE.match(line):
            meta.update(test=_test(m, path, lineno), lib=m["lib"], ver=m["ver"] or "")
            order.reset()
        elif m := re.match(r"#\s*Datatype:\s*(\S+?)\.?$", line):
            meta["dtype"] = m[1]
        elif line.startswith("#"):
            cols = _header(line) or cols
        elif line.split() and looks_like_row(line.split()[0]):
            got = rows.attempt(lineno, line,
                               lambda: _checked_row(line, meta, cols, order, lineno))
            if got is not None:
                rows.kept.append(got)
    if "test" not in meta or not rows.records:
        raise CalibrationError(f"{path}: no OSU micro-benchmark results found (expected a "
                               "'# OSU MPI … Test' title and result rows)")
    return meta, rows


def _checked_row(line: str, meta: dict, cols: list[str], order: SizeOrder,
                 lineno: int) -> dict[str, float]:
    if "test" not in meta or not cols:
        raise RowSkipped("a result row before the OSU title and column header")
    if "mean" not in cols and "bw" not in cols:
        raise RowSkipped("the column header above has no latency or bandwidth column")
    r = _row(line.split(), cols)
    order.check(None, r["size"], lineno)
    order.keep(None, r["size"], lineno)
    return r


def _stats(r: dict[str, float], nbytes: int) -> dict:
    t = nbytes / r["bw"] if "bw" in r else r["mean"]
    return {"time_mean_s": t, "time_median_s": math.nan,
            "time_min_s": r.get("min", math.nan), "time_max_s": r.get("max", math.nan),
            "time_std_s": math.nan, "n": int(r.get("n", 0))}


def parse_osu(text: str, path: str | Path, *, ranks: int | None = None,
              nodes: int | None = None, scope: str | None = None,
              backend: str | None = None) -> ReadResult:
    """Parse the text of an OSU output (see :func:`read_osu`)."""
    path = Path(path)
    meta, rows = _scan(text, path)
    op, variant, per_rank = meta["test"]
    n = 2 if op == "sendrecv" else ranks  # osu_latency and osu_bw run on exactly 2 ranks
    if n is None:
        raise CalibrationError(f"{path}: OSU output does not record the number of ranks of a "
                               f"collective ({op}); pass --ranks N")
    m = nodes or {"intra": 1, "inter": 2 if op == "sendrecv" else None}.get(scope or "")
    if m is None:
        raise CalibrationError(f"{path}: OSU output does not record where the ranks ran; pass "
                               "--nodes N (or --scope intra; --scope inter suffices for "
                               "osu_latency/osu_bw between two nodes)")
    if m > n:
        raise CalibrationError(f"{path}: {m} nodes for {n} ranks; a node holds at least one "
                               "rank (check --ranks and --nodes)")
    lib = meta["lib"]
    be = backend or ("nccl" if lib.upper().startswith("NCCL") else "mpi")
    out = []
    for r in rows.kept:
        nbytes = int(r["size"]) * (n if per_rank else 1)
        out.append(comm_row(backend=be, library=f"OSU {lib}", library_version=f"OMB "
                            f"{meta['ver']}".strip(), op=op, ranks=n, nodes=m,
                            ranks_per_node=n // m if n % m == 0 else 0,
                            scope=scope or ("intra" if m == 1 else "inter"), nbytes=nbytes,
                            stats=_stats(r, nbytes), dtype=meta.get("dtype", ""),
                            variant=variant, source=str(path)))
    return ReadResult(tidy_frame(out), tuple(rows.skipped), rows.records, str(path), "osu")


def read_osu(path: str | Path, *, ranks: int | None = None, nodes: int | None = None,
             scope: str | None = None, backend: str | None = None) -> ReadResult:
    """Read one OSU output file (see the module docstring for sizes).

    Returns
    -------
    ReadResult
        The tidy table, and a :class:`~ddlsim.calibration.schema.SkippedRow` for every row
        left out: sizes that are not whole byte counts, non-numeric, NaN, infinite, zero or
        negative latencies or bandwidths, truncated lines, duplicate or falling sizes.
    """
    text = read_text(path, what="OSU output", max_bytes=MAX_DATA_BYTES)
    return parse_osu(text, path, ranks=ranks, nodes=nodes, scope=scope, backend=backend)

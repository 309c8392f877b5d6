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
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ..schema import CalibrationError, ResultParseError, comm_row, tidy_frame

__all__ = ["read_osu", "OSU_TESTS"]

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


def _row(tokens: list[str], cols: list[str], path: Path, lineno: int) -> dict[str, float]:
    if len(tokens) < len(cols):
        raise ResultParseError(path, lineno, f"expected {len(cols)} columns, got {len(tokens)}")
    out = {}
    for name, tok in zip(cols, tokens):
        if name:
            try:
                out[name] = float(tok)
            except ValueError:
                raise ResultParseError(path, lineno, f"cannot read {tok!r} as a number "
                                       f"(column {name})") from None
    return out


def _scan(path: Path) -> tuple[dict, list[dict]]:
    meta: dict = {}
    cols: list[str] = []
    rows: list[dict] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.strip()
            if m := _TITLE.match(line):
                meta.update(test=_test(m, path, lineno), lib=m["lib"], ver=m["ver"] or "")
            elif m := re.match(r"#\s*Datatype:\s*(\S+?)\.?$", line):
                meta["dtype"] = m[1]
            elif line.startswith("#"):
                cols = _header(line) or cols
            elif line[:1].isdigit():
                if "test" not in meta or not cols:
                    raise ResultParseError(path, lineno, "a result row before the OSU title "
                                           "and column header")
                rows.append(_row(line.split(), cols, path, lineno))
    if "test" not in meta or not rows:
        raise CalibrationError(f"{path}: no OSU micro-benchmark results found (expected a "
                               "'# OSU MPI … Test' title and result rows)")
    return meta, rows


def _stats(r: dict[str, float], nbytes: int) -> dict:
    if "bw" in r:
        t = nbytes / (r["bw"] * 1e6) if r["bw"] > 0 else math.nan
    else:
        t = r["mean"] * 1e-6
    return {"time_mean_s": t, "time_median_s": math.nan,
            "time_min_s": r["min"] * 1e-6 if "min" in r else math.nan,
            "time_max_s": r["max"] * 1e-6 if "max" in r else math.nan,
            "time_std_s": math.nan, "n": int(r.get("n", 0))}


def read_osu(path: str | Path, *, ranks: int | None = None, nodes: int | None = None,
             scope: str | None = None, backend: str | None = None) -> pd.DataFrame:
    """Read one OSU output file into the tidy table (see the module docstring for sizes)."""
    path = Path(path)
    meta, rows = _scan(path)
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
    lib = meta["lib"]
    be = backend or ("nccl" if lib.upper().startswith("NCCL") else "mpi")
    out = []
    for r in rows:
        nbytes = int(r["size"]) * (n if per_rank else 1)
        stats = _stats(r, nbytes)
        if math.isfinite(stats["time_mean_s"]) and stats["time_mean_s"] > 0:
            out.append(comm_row(backend=be, library=f"OSU {lib}", library_version=f"OMB "
                                f"{meta['ver']}".strip(), op=op, ranks=n, nodes=m,
                                ranks_per_node=n // m if n % m == 0 else 0,
                                scope=scope or ("intra" if m == 1 else "inter"), nbytes=nbytes,
                                stats=stats, dtype=meta.get("dtype", ""), variant=variant,
                                source=str(path)))
    return tidy_frame(out)

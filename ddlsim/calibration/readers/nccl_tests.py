"""Read nccl-tests results (NVIDIA/nccl-tests): the text table and the ``-J file.json`` output.

Text output: ``#`` lines are comments, some of which carry the run's facts (``# nccl-tests
version … nccl-library=22703``, ``# Collective test starting: all_reduce_perf``, ``# nThread 1
nGpus 1 … iters: 20``, one ``#  Rank  0 Group  0 Pid … on HOST device …`` line per rank, and
the column header). A result row is ``size count type redop [root]`` then the out-of-place
``time algbw busbw #wrong`` and the in-place ``time algbw busbw #wrong`` (older versions have
no ``root`` column and call the last column ``error``; ``-R`` per-iteration runs add four
columns per block). Times are µs (average over iterations and, by default, over ranks;
``-a 3`` reports the max), bandwidths GB/s (10⁹ B/s). Both in-place and out-of-place rows are
returned (``variant``). Other lines (NCCL INFO logs, launcher chatter) are skipped; a line
that starts with a number but cannot be read is an error naming the file and the line.

JSON output (``-J``/``--output_file x.json``, nccl-tests ≥ 2.17): the schema written by
``src/util.cu`` (``JSON_FILE_VERSION 3``): ``{"version", "args": [argv…], "nccl_version":
int, "config": {"iterations", "devices": [{"rank", "hostname", …}]}, "results": [{"size",
"count", "type", "redop", "root", "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"},
"in_place": {…}, "out_of_place_per_iter": {"min_us", "max_us", "p50_us", "stdev_us",
"times_us"}, …}]}``. The reader needs only ``results[].size`` and a ``time`` (or
``cpu_time``) per variant; every other key is optional.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from ..schema import OPS, CalibrationError, ResultParseError, comm_row, tidy_frame

__all__ = ["read_nccl_tests_text", "read_nccl_tests_json", "nccl_version_string",
           "op_from_program"]

_PROGRAMS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
             "all_gather": "all_gather", "alltoall": "all_to_all", "broadcast": "broadcast",
             "reduce": "reduce", "sendrecv": "sendrecv"}
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_VERSION_LINE = re.compile(r"nccl-library=(\d+)")
_PROGRAM_LINE = re.compile(r"Collective test starting:\s*(\S+)")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_VARIANTS = ("out_of_place", "in_place")
#: Launcher output tags (``mpirun --tag-output``: ``[1,0]<stdout>:``, or ``[0]``).
_TAG = re.compile(r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>:)?")


def nccl_version_string(code: int) -> str:
    """NCCL version code → ``"NCCL 2.27.3"`` (``NCCL_VERSION``: X·10000+Y·100+Z from 2.9,
    X·1000+Y·100+Z before)."""
    code = int(code)
    if code >= 20900:
        return f"NCCL {code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"NCCL {code // 1000}.{code % 1000 // 100}.{code % 100}"


def op_from_program(name: str) -> str | None:
    """``"./build/all_reduce_perf"`` → ``"all_reduce"``; None when not recognised."""
    stem = Path(str(name)).name.removesuffix("_mpi").removesuffix("_perf")
    for key in sorted(_PROGRAMS, key=len, reverse=True):
        if stem == key or stem.startswith(key + "_perf"):
            return _PROGRAMS[key]
    return None


def _op_from_path(path: Path) -> str | None:
    name = path.name.lower()
    for key in sorted(_PROGRAMS, key=len, reverse=True):
        if key in name:
            return _PROGRAMS[key]
    return None


def _resolve_op(op: str | None, found: str | None, path: Path) -> str:
    chosen = op or found or _op_from_path(path)
    if chosen is None:
        raise CalibrationError(f"{path}: cannot tell which collective this nccl-tests output "
                               f"measures (no 'Collective test starting' line and no op in the "
                               f"file name); pass --op, one of {', '.join(OPS)}")
    if chosen not in OPS:
        raise CalibrationError(f"{path}: operation {chosen!r} is not one of {', '.join(OPS)}")
    return chosen


def _float(token: str) -> float:
    return math.nan if token.upper() in ("N/A", "NAN", "-") else float(token)


class _TextState:
    """What the comment lines of a text output have told us so far."""

    def __init__(self) -> None:
        self.version, self.program, self.iters = "", None, 0
        self.hosts: dict[int, str] = {}
        self.time_cols: list[int] = []

    def comment(self, line: str) -> None:
        if m := _VERSION_LINE.search(line):
            self.version = nccl_version_string(int(m[1]))
        if m := _PROGRAM_LINE.search(line):
            self.program = op_from_program(m[1])
        if m := _ITERS.search(line):
            self.iters = int(m[1])
        if m := _RANK_LINE.match(line.strip()):
            self.hosts[int(m[1])] = m[2]
        names = line.lstrip("#").split()
        if names[:2] == ["size", "count"]:
            self.time_cols = [i for i, n in enumerate(names) if n in ("time", "cputime")]


def _default_time_cols(tokens: list[str]) -> list[int]:
    has_root = len(tokens) > 4 and re.fullmatch(r"-?\d+", tokens[4]) is not None
    first = 5 if has_root else 4
    return [first, first + 4]


def _parse_row(tokens: list[str], state: _TextState, path: Path, lineno: int) -> dict:
    cols = state.time_cols or _default_time_cols(tokens)
    if len(tokens) < cols[0] + 1:
        raise ResultParseError(path, lineno, f"expected at least {cols[0] + 1} columns "
                               f"(size count type redop [root] time …), got {len(tokens)}")
    try:
        size, _ = int(tokens[0]), int(tokens[1])  # size (B), count (elements)
        times = {v: _float(tokens[c]) if c < len(tokens) else math.nan
                 for v, c in zip(_VARIANTS, cols)}
    except ValueError as exc:
        raise ResultParseError(path, lineno, f"cannot read a number: {exc}") from None
    return {"bytes": size, "dtype": tokens[2], "times_us": times}


def read_nccl_tests_text(path: str | Path, *, op: str | None = None, backend: str = "nccl",
                         ranks: int | None = None, nodes: int | None = None,
                         scope: str | None = None) -> pd.DataFrame:
    """Read one nccl-tests text output into the tidy table (both variants per size).

    ``op``, ``ranks``, ``nodes`` and ``scope`` override what the file says (needed for old
    outputs that do not name the collective: the file name is tried, e.g. ``all_gather.txt``).
    """
    path, state, parsed = Path(path), _TextState(), []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = _TAG.sub(" ", raw).strip()
            if line.startswith("#"):
                state.comment(line)
            elif line.split(maxsplit=1)[:1] and line.split(maxsplit=1)[0].isdigit():
                parsed.append(_parse_row(line.split(), state, path, lineno))
    if not parsed:
        raise CalibrationError(f"{path}: no nccl-tests result rows found")
    hosts = [state.hosts[r] for r in sorted(state.hosts)]
    return _rows(parsed, _resolve_op(op, state.program, path), backend, state.version,
                 state.iters, hosts, ranks, nodes, scope, path)


def _layout(hosts: list[str], ranks: int | None, nodes: int | None, scope: str | None,
            path: Path) -> tuple[int, int, int, str]:
    n = ranks or len(hosts)
    if not n:
        raise CalibrationError(f"{path}: the output lists no '# Rank' lines, so the number of "
                               "ranks is unknown; pass --ranks")
    m = nodes or len(set(hosts)) or (1 if scope in (None, "intra") else 0)
    if not m:
        raise CalibrationError(f"{path}: the number of nodes is unknown; pass --nodes")
    return n, m, n // m if n % m == 0 else 0, scope or ("intra" if m == 1 else "inter")


def _rows(parsed: list[dict], op: str, backend: str, version: str, iters: int,
          hosts: list[str], ranks: int | None, nodes: int | None, scope: str | None,
          path: Path) -> pd.DataFrame:
    n, m, rpn, sc = _layout(hosts, ranks, nodes, scope, path)
    rows = []
    for p in parsed:
        for variant, t_us in p["times_us"].items():
            if not math.isfinite(t_us) or t_us <= 0:
                continue
            stats = {"time_mean_s": t_us * 1e-6, "time_median_s": math.nan,
                     "time_min_s": math.nan, "time_max_s": math.nan, "time_std_s": math.nan,
                     "n": iters, **p.get("stats", {}).get(variant, {})}
            rows.append(comm_row(backend=backend, library="NCCL" if backend == "nccl" else
                                 backend, library_version=version, op=op, ranks=n, nodes=m,
                                 ranks_per_node=rpn, scope=sc, nbytes=p["bytes"], stats=stats,
                                 dtype=p["dtype"], variant=variant, source=str(path)))
    if not rows:
        raise CalibrationError(f"{path}: every result row has an empty time (N/A)")
    return tidy_frame(rows)


# ------------------------------------------------------------------------------------- json
def _json_time_us(block: object) -> float:
    if not isinstance(block, dict):
        return math.nan
    value = block.get("time", block.get("cpu_time"))
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _json_stats(per_iter: object) -> dict:
    if not isinstance(per_iter, dict):
        return {}
    out, keys = {}, {"p50_us": "time_median_s", "min_us": "time_min_s", "max_us": "time_max_s",
                     "stdev_us": "time_std_s"}
    for key, col in keys.items():
        try:
            out[col] = float(per_iter[key]) * 1e-6
        except (KeyError, TypeError, ValueError):
            pass
    if isinstance(per_iter.get("times_us"), list):
        out["n"] = len(per_iter["times_us"]) - int(per_iter.get("skipped_iterations", 0) or 0)
    return out


def _json_result(i: int, res: object, path: Path) -> dict:
    if not isinstance(res, dict) or "size" not in res:
        raise ResultParseError(path, None, f"results[{i}] is not an object with a 'size'")
    try:
        size = int(res["size"])
    except (TypeError, ValueError):
        raise ResultParseError(path, None, f"results[{i}].size = {res['size']!r} is not an "
                               "integer") from None
    return {"bytes": size, "dtype": str(res.get("type", "")),
            "times_us": {v: _json_time_us(res.get(v)) for v in _VARIANTS},
            "stats": {v: _json_stats(res.get(f"{v}_per_iter")) for v in _VARIANTS}}


def read_nccl_tests_json(path: str | Path, *, op: str | None = None, backend: str = "nccl",
                         ranks: int | None = None, nodes: int | None = None,
                         scope: str | None = None) -> pd.DataFrame:
    """Read one nccl-tests JSON output (schema in the module docstring) into the tidy table."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultParseError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if isinstance(doc, list):
        doc = {"results": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ResultParseError(path, None, "expected an object with a 'results' list "
                               "(nccl-tests -J output)")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in config.get("devices", []) if isinstance(d, dict)]
    hosts = [str(d.get("hostname", "")) for d in sorted(devices, key=lambda d: d.get("rank", 0))]
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    found = op_from_program(args[0]) if args else None
    version = nccl_version_string(doc["nccl_version"]) if "nccl_version" in doc else ""
    parsed = [_json_result(i, r, path) for i, r in enumerate(doc["results"])]
    if not parsed:
        raise CalibrationError(f"{path}: the 'results' list is empty")
    return _rows(parsed, _resolve_op(op, found, path), backend, version,
                 int(config.get("iterations", 0) or 0), hosts, ranks, nodes, scope, path)

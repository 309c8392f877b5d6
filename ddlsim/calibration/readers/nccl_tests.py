"""Read nccl-tests text output (NVIDIA/nccl-tests); the ``-J`` JSON output: :mod:`.nccl_json`.

Text output: ``#`` lines are comments, some of which carry the run's facts (``# nccl-tests
version … nccl-library=22703``, ``# Collective test starting: all_reduce_perf``, ``# nThread 1
nGpus 1 … iters: 20``, one ``#  Rank  0 Group  0 Pid … on HOST device …`` line per rank, and
the column header). A result row is ``size count type redop [root]`` then the out-of-place
``time algbw busbw #wrong`` and the in-place ``time algbw busbw #wrong`` (older versions have
no ``root`` column and call the last column ``error``; ``-R`` per-iteration runs add four
columns per block). Times are µs (average over iterations and, by default, over ranks;
``-a 3`` reports the max), bandwidths GB/s (10⁹ B/s). Both in-place and out-of-place rows are
returned (``variant``). Other lines (NCCL INFO logs, launcher chatter) are ignored; a line
that starts with a number (``8K``, ``-16`` included) is a result row, and one that cannot be
used is skipped and reported (:class:`~ddlsim.calibration.schema.SkippedRow`: file, line,
reason), as is each unusable time of a row whose other variant is kept.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ...textio import MAX_DATA_BYTES, read_text
from ..schema import OPS, CalibrationError, ReadResult, comm_row, tidy_frame
from .checks import Rows, RowSkipped, SizeOrder, looks_like_row, parse_int, parse_size, parse_time

__all__ = ["read_nccl_tests_text", "parse_nccl_tests_text", "nccl_version_string",
           "op_from_program"]

_PROGRAMS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
             "all_gather": "all_gather", "alltoall": "all_to_all", "broadcast": "broadcast",
             "reduce": "reduce", "sendrecv": "sendrecv"}
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_VERSION_LINE = re.compile(r"nccl-library=(\d+)")
_PROGRAM_LINE = re.compile(r"Collective test starting:\s*(\S+)")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
VARIANTS = ("out_of_place", "in_place")
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


def resolve_op(op: str | None, found: str | None, path: Path) -> str:
    chosen = op or found or _op_from_path(path)
    if chosen is None:
        raise CalibrationError(f"{path}: cannot tell which collective this nccl-tests output "
                               f"measures (no 'Collective test starting' line and no op in the "
                               f"file name); pass --op, one of {', '.join(OPS)}")
    if chosen not in OPS:
        raise CalibrationError(f"{path}: operation {chosen!r} is not one of {', '.join(OPS)}")
    return chosen


def _small_int(text: str) -> int | None:
    return int(text) if len(text) <= 18 else None


class _TextState:
    """What the comment lines of a text output have told us so far."""

    def __init__(self) -> None:
        self.version, self.program, self.first_program, self.iters = "", None, None, 0
        self.hosts: dict[int, str] = {}
        self.time_cols: list[int] = []
        self.ncols = 0

    def comment(self, line: str) -> bool:
        """Take in a comment line; True when it starts a new run (sizes may start over)."""
        if (m := _VERSION_LINE.search(line)) and (code := _small_int(m[1])) is not None:
            self.version = nccl_version_string(code)
        if m := _PROGRAM_LINE.search(line):
            self.program = op_from_program(m[1])
            self.first_program = self.first_program or self.program
        if (m := _ITERS.search(line)) and (iters := _small_int(m[1])) is not None:
            self.iters = iters
        if (m := _RANK_LINE.match(line.strip())) and (rank := _small_int(m[1])) is not None:
            self.hosts[rank] = m[2]
        names = line.lstrip("#").split()
        if names[:2] == ["size", "count"]:
            self.time_cols = [i for i, n in enumerate(names) if n in ("time", "cputime")]
            self.ncols = len(names)
        return bool(_PROGRAM_LINE.search(line)) or line.lstrip("# ").startswith("nThread")


def _default_time_cols(tokens: list[str]) -> list[int]:
    has_root = len(tokens) > 4 and re.fullmatch(r"-?\d+", tokens[4]) is not None
    first = 5 if has_root else 4
    return [first, first + 4]


def _check_columns(tokens: list[str], state: _TextState, cols: list[int]) -> None:
    if state.ncols and len(tokens) != state.ncols:
        cut = "truncated: " if len(tokens) < state.ncols else ""
        raise RowSkipped(f"{cut}{len(tokens)} columns, the column header has {state.ncols}")
    if len(tokens) < cols[-1] + 1:
        raise RowSkipped(f"truncated: {len(tokens)} columns, expected at least {cols[-1] + 1} "
                         "(size count type redop [root] time algbw busbw #wrong time …)")


def _parse_row(tokens: list[str], state: _TextState, order: SizeOrder, lineno: int,
               rows: Rows, text: str) -> list[dict]:
    """One result line → its usable variants; row-level problems raise RowSkipped."""
    cols = state.time_cols or _default_time_cols(tokens)
    _check_columns(tokens, state, cols)
    size = parse_size(tokens[0])
    parse_int(tokens[1], "count")
    key = (state.program, tuple(tokens[2:cols[0]]))  # type, redop[, root]
    order.check(key, size, lineno)
    order.keep(key, size, lineno)
    out = []
    for variant, c in zip(VARIANTS, cols):
        try:
            t = parse_time(tokens[c], f"{variant.replace('_', '-')} time (µs)", 1e-6)
        except RowSkipped as exc:
            rows.skip(lineno, str(exc), text)
            continue
        out.append({"bytes": size, "dtype": tokens[2], "variant": variant, "time_s": t,
                    "stats": {}, "program": state.program})
    return out


def parse_nccl_tests_text(text: str, path: str | Path, *, op: str | None = None,
                          backend: str = "nccl", ranks: int | None = None,
                          nodes: int | None = None, scope: str | None = None) -> ReadResult:
    """Parse the text of an nccl-tests output (see :func:`read_nccl_tests_text`)."""
    path, state, order = Path(path), _TextState(), SizeOrder()
    rows = Rows(path)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _TAG.sub(" ", raw).strip()
        if line.startswith("#"):
            if state.comment(line):
                order.reset()
            continue
        tokens = line.split()
        if tokens and looks_like_row(tokens[0]):
            got = rows.attempt(lineno, line, lambda: _parse_row(tokens, state, order, lineno,
                                                                 rows, line))
            rows.kept.extend(got or [])
    if not rows.records:
        raise CalibrationError(f"{path}: no nccl-tests result rows found")
    hosts = [state.hosts[r] for r in sorted(state.hosts)]
    for p in rows.kept:
        p["op"] = resolve_op(op, p.pop("program") or state.first_program, path)
    if not rows.kept:
        resolve_op(op, state.first_program, path)
    return tidy_result(rows, backend, state.version, state.iters, hosts, (ranks, nodes, scope),
                       path, "nccl-tests")


def read_nccl_tests_text(path: str | Path, *, op: str | None = None, backend: str = "nccl",
                         ranks: int | None = None, nodes: int | None = None,
                         scope: str | None = None) -> ReadResult:
    """Read one nccl-tests text output: both variants per size, and the rows skipped.

    ``op``, ``ranks``, ``nodes`` and ``scope`` override what the file says (needed for old
    outputs that do not name the collective: the file name is tried, e.g. ``all_gather.txt``).
    Each ``# Collective test starting`` line names the operation of the rows below it.

    Returns
    -------
    ReadResult
        The tidy table, and a :class:`~ddlsim.calibration.schema.SkippedRow` for every row
        (or variant of a row) left out: sizes that are not whole byte counts (``8K``,
        ``-16``), non-numeric, NaN, infinite, zero or negative times, truncated lines,
        duplicate sizes and sizes that fall within a run.
    """
    text = read_text(path, what="nccl-tests output", max_bytes=MAX_DATA_BYTES)
    return parse_nccl_tests_text(text, path, op=op, backend=backend, ranks=ranks, nodes=nodes,
                                 scope=scope)


def _layout(hosts: list[str], ranks: int | None, nodes: int | None, scope: str | None,
            path: Path) -> tuple[int, int, int, str]:
    n = ranks or len(hosts)
    if not n:
        raise CalibrationError(f"{path}: the output lists no '# Rank' lines, so the number of "
                               "ranks is unknown; pass --ranks")
    m = nodes or len(set(hosts)) or (1 if scope in (None, "intra") else 0)
    if not m:
        raise CalibrationError(f"{path}: the number of nodes is unknown; pass --nodes")
    if m > n:
        raise CalibrationError(f"{path}: {m} nodes for {n} ranks; a node holds at least one "
                               "rank (check --ranks and --nodes)")
    return n, m, n // m if n % m == 0 else 0, scope or ("intra" if m == 1 else "inter")


def tidy_result(rows: Rows, backend: str, version: str, iters: int, hosts: list[str],
            layout: tuple, path: Path, fmt: str) -> ReadResult:
    n, m, rpn, sc = _layout(hosts, *layout, path)
    out = []
    for p in rows.kept:
        stats = {"time_mean_s": p["time_s"], "time_median_s": math.nan,
                 "time_min_s": math.nan, "time_max_s": math.nan, "time_std_s": math.nan,
                 "n": iters, **p["stats"]}
        out.append(comm_row(backend=backend, library="NCCL" if backend == "nccl" else backend,
                            library_version=version, op=p["op"], ranks=n, nodes=m,
                            ranks_per_node=rpn, scope=sc, nbytes=p["bytes"], stats=stats,
                            dtype=p["dtype"], variant=p["variant"], source=str(path)))
    return ReadResult(tidy_frame(out), tuple(rows.skipped), rows.records, str(path), fmt)

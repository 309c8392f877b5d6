"""Read nccl-tests ``-J file.json`` output (NVIDIA/nccl-tests ≥ 2.17).

JSON output (``-J``/``--output_file x.json``, nccl-tests ≥ 2.17): the schema written by
``src/util.cu`` (``JSON_FILE_VERSION 3``): ``{"version", "args": [argv…], "nccl_version":
int, "config": {"iterations", "devices": [{"rank", "hostname", …}]}, "results": [{"size",
"count", "type", "redop", "root", "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"},
"in_place": {…}, "out_of_place_per_iter": {"min_us", "max_us", "p50_us", "stdev_us",
"times_us"}, …}]}``. The reader needs only ``results[].size`` and a ``time`` (or
``cpu_time``) per variant; every other key is optional.

A ``results[]`` entry that cannot be used is skipped and reported with the line where it
starts (:class:`~ddlsim.calibration.schema.SkippedRow`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...documents import DocumentError, parse_json
from ...textio import MAX_DATA_BYTES, read_text
from ..schema import CalibrationError, ReadResult, ResultParseError
from .checks import Rows, RowSkipped, SizeOrder, parse_float, parse_int, parse_size, parse_time
from .nccl_tests import VARIANTS, nccl_version_string, op_from_program, resolve_op, tidy_result

__all__ = ["read_nccl_tests_json", "parse_nccl_tests_json"]

_PER_ITER = {"p50_us": "time_median_s", "min_us": "time_min_s", "max_us": "time_max_s"}


def _json_stats(per_iter: object, what: str) -> dict:
    """Median, min, max, std and n from a ``*_per_iter`` block; bad values raise RowSkipped."""
    if not isinstance(per_iter, dict):
        return {}
    out = {col: parse_time(per_iter[key], f"{what} {key}", 1e-6)
           for key, col in _PER_ITER.items() if key in per_iter}
    if "stdev_us" in per_iter:
        std = parse_float(per_iter["stdev_us"], f"{what} stdev_us")
        if std < 0:
            raise RowSkipped(f"{what} stdev_us {std} is negative")
        out["time_std_s"] = std * 1e-6
    if isinstance(per_iter.get("times_us"), list):
        skipped = parse_int(per_iter.get("skipped_iterations") or 0, f"{what} skipped_iterations")
        out["n"] = max(len(per_iter["times_us"]) - skipped, 0)
    return out


def _json_variant(res: dict, variant: str) -> dict | None:
    """The time and statistics of one variant; None when the result has no such block."""
    block = res.get(variant)
    if block is None:
        return None
    what = variant.replace("_", "-")
    if not isinstance(block, dict) or ("time" not in block and "cpu_time" not in block):
        raise RowSkipped(f"{variant} has no 'time'")
    t = parse_time(block.get("time", block.get("cpu_time")), f"{what} time (µs)", 1e-6)
    return {"variant": variant, "time_s": t,
            "stats": _json_stats(res.get(f"{variant}_per_iter"), what)}


def _json_result(res: object, rows: Rows, order: SizeOrder, line: int,
                 text: str) -> list[dict]:
    """One ``results[]`` entry → its usable variants; entry-level problems raise RowSkipped."""
    if not isinstance(res, dict) or "size" not in res:
        raise RowSkipped("not an object with a 'size'")
    size = res["size"]
    if isinstance(size, bool) or not isinstance(size, (int, float, str)):
        raise RowSkipped(f"size {size!r} is not a whole number of bytes")
    size = parse_size(str(size), allow_float=isinstance(size, float))
    dtype = str(res.get("type", ""))
    key = (dtype, str(res.get("redop", "")), str(res.get("root", "")))
    order.check(key, size, line)
    order.keep(key, size, line)
    out, before = [], len(rows.skipped)
    for variant in VARIANTS:
        try:
            got = _json_variant(res, variant)
        except RowSkipped as exc:
            rows.skip(line, str(exc), text)
            continue
        if got is not None:
            out.append({"bytes": size, "dtype": dtype, **got})
    if not out and len(rows.skipped) == before:
        raise RowSkipped("has neither an 'out_of_place' nor an 'in_place' time")
    return out


#: Most values one nccl-tests JSON file may hold (the readers stop at 50,000 rows of ~15).
MAX_JSON_VALUES = 1_000_000


def _load_json(text: str, path: Path) -> object:
    try:
        return parse_json(text, str(path), max_nodes=MAX_JSON_VALUES, allow_nan=True)
    except DocumentError as exc:
        raise ResultParseError(path, exc.line, f"invalid nccl-tests JSON: {exc.detail}") from None
    except ValueError as exc:  # int() of a huge integer literal
        raise ResultParseError(path, None, f"invalid nccl-tests JSON: {exc}") from None


def _result_lines(text: str) -> list[int]:
    """Line where each element of the top-level ``results`` array (or of a top-level array)
    starts; ``text`` is valid JSON without duplicate keys."""
    dec, i = json.JSONDecoder(), _skip_ws(text, 0)
    if text[i] == "[":
        return _array_lines(text, i)
    i = _skip_ws(text, i + 1)
    while text[i] == '"':
        key, i = dec.raw_decode(text, i)
        i = _skip_ws(text, _skip_ws(text, i) + 1)  # past ':'
        if key == "results":
            return _array_lines(text, i)
        _, i = dec.raw_decode(text, i)
        i = _skip_ws(text, i)
        i = _skip_ws(text, i + 1) if text[i] == "," else i
    return []


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _array_lines(text: str, i: int) -> list[int]:
    dec, lines = json.JSONDecoder(), []
    i = _skip_ws(text, i + 1)
    while i < len(text) and text[i] != "]":
        lines.append(text.count("\n", 0, i) + 1)
        _, i = dec.raw_decode(text, i)
        i = _skip_ws(text, i)
        i = _skip_ws(text, i + 1) if text[i] == "," else i
    return lines


def _json_meta(doc: dict) -> tuple[list[str], str | None, str, int]:
    """Hosts (by rank), the program's operation, the NCCL version and the iteration count."""
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in config.get("devices", []) if isinstance(d, dict)] \
        if isinstance(config.get("devices"), list) else []
    rank = (lambda d: d["rank"] if isinstance(d.get("rank"), int) else 0)
    hosts = [str(d.get("hostname", "")) for d in sorted(devices, key=rank)]
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    found = op_from_program(str(args[0])) if args else None
    code = doc.get("nccl_version")
    version = nccl_version_string(code) if isinstance(code, int) and 0 <= code < 10 ** 9 \
        else ""
    iters = config.get("iterations")
    return hosts, found, version, iters if isinstance(iters, int) and 0 <= iters < 2**62 else 0


def parse_nccl_tests_json(text: str, path: str | Path, *, op: str | None = None,
                          backend: str = "nccl", ranks: int | None = None,
                          nodes: int | None = None, scope: str | None = None) -> ReadResult:
    """Parse the text of an nccl-tests JSON output (see :func:`read_nccl_tests_json`)."""
    path = Path(path)
    doc = _load_json(text, path)
    if isinstance(doc, list):
        doc = {"results": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ResultParseError(path, None, "expected an object with a 'results' list "
                               "(nccl-tests -J output)")
    if not doc["results"]:
        raise CalibrationError(f"{path}: the 'results' list is empty")
    hosts, found, version, iters = _json_meta(doc)
    rows, order = Rows(path), SizeOrder()
    lines = _result_lines(text)
    lines += [1] * (len(doc["results"]) - len(lines))  # never: the scan follows json.loads
    the_op = resolve_op(op, found, path)
    for res, line in zip(doc["results"], lines):
        shown = json.dumps(res, separators=(",", ":"))[:200]
        got = rows.attempt(line, shown, lambda: _json_result(res, rows, order, line, shown))
        rows.kept.extend({**p, "op": the_op} for p in got or [])
    return tidy_result(rows, backend, version, iters, hosts, (ranks, nodes, scope), path,
                       "nccl-tests-json")


def read_nccl_tests_json(path: str | Path, *, op: str | None = None, backend: str = "nccl",
                         ranks: int | None = None, nodes: int | None = None,
                         scope: str | None = None) -> ReadResult:
    """Read one nccl-tests JSON output (schema in the module docstring).

    Returns
    -------
    ReadResult
        The tidy table and a :class:`~ddlsim.calibration.schema.SkippedRow` for every
        ``results[]`` entry (or variant) left out, located by the line where it starts.
    """
    text = read_text(path, what="nccl-tests JSON output", max_bytes=MAX_DATA_BYTES)
    return parse_nccl_tests_json(text, path, op=op, backend=backend, ranks=ranks, nodes=nodes,
                                 scope=scope)

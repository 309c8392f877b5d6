"""Readers of nccl-tests (text, JSON), OSU and ddlsim CSVs, on the sample files of data/.

The samples are synthetic values in the real layouts (see data/make_samples.py); the values
checked here are read off the files by hand. Damaged rows: tests/calibration/test_calib_skips.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ddlsim.calibration.outputs import write_csv
from ddlsim.calibration.readers import detect_format, read_results
from ddlsim.calibration.schema import COLUMNS, CalibrationError, ResultParseError, SkippedRow

DATA = Path(__file__).parent / "data"


def row(df, op_bytes, variant=""):
    sel = df[(df["bytes"] == op_bytes) & (df["variant"] == variant)]
    assert len(sel) == 1
    return sel.iloc[0]


@pytest.mark.parametrize("name, fmt", [
    ("nccl_all_reduce_perf.txt", "nccl-tests"), ("nccl_all_gather.txt", "nccl-tests"),
    ("nccl_reduce_scatter.json", "nccl-tests-json"), ("osu_allreduce.txt", "osu"),
    ("osu_latency.txt", "osu"), ("osu_bw.txt", "osu"), ("osu_allgather.txt", "osu"),
])
def test_detect_format(name, fmt):
    assert detect_format(DATA / name) == fmt


def test_nccl_tests_text_reads_both_variants_and_the_run_facts():
    df = read_results(DATA / "nccl_all_reduce_perf.txt").table
    assert tuple(df.columns) == COLUMNS
    assert len(df) == 2 * 25  # 8 B … 128 MiB, out-of-place and in-place
    r = row(df, 8, "out_of_place")
    assert r["time_mean_s"] == pytest.approx(11.06e-6)  # "11.06" µs
    assert (r["op"], r["ranks"], r["nodes"], r["ranks_per_node"], r["scope"], r["n"]) == \
        ("all_reduce", 8, 1, 8, "intra", 20)
    assert r["library_version"] == "NCCL 2.27.3"  # nccl-library=22703
    big = row(df, 134217728, "in_place")
    assert big["busbw_Bps"] == pytest.approx(134217728 / big["time_mean_s"] * 1.75)


def test_old_nccl_tests_layout_takes_the_op_from_the_file_name():
    df = read_results(DATA / "nccl_all_gather.txt").table  # no root column, no program line
    assert set(df["op"]) == {"all_gather"}
    assert (df["ranks"].iloc[0], df["nodes"].iloc[0], df["scope"].iloc[0]) == (16, 2, "inter")
    assert row(df, 1024, "out_of_place")["time_mean_s"] == pytest.approx(20.22e-6)
    assert df["n"].iloc[0] == 50


def test_old_nccl_tests_layout_without_op_asks_for_it(tmp_path):
    anon = tmp_path / "results.txt"
    anon.write_text((DATA / "nccl_all_gather.txt").read_text())
    with pytest.raises(CalibrationError, match="--op"):
        read_results(anon)
    assert set(read_results(anon, op="all_gather").table["op"]) == {"all_gather"}


def test_nccl_tests_json():
    df = read_results(DATA / "nccl_reduce_scatter.json").table
    assert set(df["op"]) == {"reduce_scatter"} and len(df) == 2 * 9
    assert (df["ranks"].iloc[0], df["nodes"].iloc[0], df["ranks_per_node"].iloc[0]) == (16, 2, 8)
    doc = json.loads((DATA / "nccl_reduce_scatter.json").read_text())
    first = doc["results"][0]
    r = row(df, 4096, "out_of_place")
    assert r["time_mean_s"] == pytest.approx(first["out_of_place"]["time"] * 1e-6)
    per_iter = first["out_of_place_per_iter"]  # per-iteration block → median, min, max, n
    assert r["time_median_s"] == pytest.approx(per_iter["p50_us"] * 1e-6)
    assert r["time_min_s"] == pytest.approx(per_iter["min_us"] * 1e-6) and r["n"] == 10


def test_osu_collective_with_full_statistics():
    df = read_results(DATA / "osu_allreduce.txt", ranks=4, nodes=1).table
    r = row(df, 4)
    assert (r["time_mean_s"], r["time_min_s"], r["time_max_s"], r["n"]) == \
        pytest.approx((1.98e-6, 1.58e-6, 2.57e-6, 1000))
    assert (r["op"], r["library_version"], r["dtype"]) == ("all_reduce", "OMB 7.3", "MPI_CHAR")


def test_osu_allgather_sizes_become_total_bytes():
    df = read_results(DATA / "osu_allgather.txt", ranks=4, nodes=1).table
    assert list(df["bytes"][:3]) == [4, 16, 64]  # OSU size is per rank: × 4 ranks


def test_osu_pt2pt_latency_and_streaming_bandwidth():
    lat = read_results(DATA / "osu_latency.txt", scope="inter").table
    assert set(lat["op"]) == {"sendrecv"} and lat["ranks"].iloc[0] == 2
    assert (lat["nodes"].iloc[0], lat["variant"].iloc[0]) == (2, "")
    bw = read_results(DATA / "osu_bw.txt", nodes=1).table
    r = row(bw, 4194304, "streaming")
    mbps = float((DATA / "osu_bw.txt").read_text().splitlines()[-1].split()[1])
    assert r["time_mean_s"] == pytest.approx(4194304 / (mbps * 1e6))  # MB/s = 10^6 B/s


def test_osu_needs_ranks_and_placement():
    with pytest.raises(CalibrationError, match="--ranks"):
        read_results(DATA / "osu_allreduce.txt", nodes=1)
    with pytest.raises(CalibrationError, match="--nodes"):
        read_results(DATA / "osu_allreduce.txt", ranks=4)


def _corrupt(src: Path, dst: Path, predicate, replace) -> int:
    lines = src.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if predicate(ln))
    lines[i] = replace(lines[i])
    dst.write_text("\n".join(lines) + "\n")
    return i + 1


def _replace_token(line: str, index: int, new: str) -> str:
    tokens = line.split()
    tokens[index] = new
    return "  ".join(tokens)


@pytest.mark.parametrize("name, kwargs, predicate, token, rows_lost", [
    ("nccl_all_reduce_perf.txt", {}, lambda ln: ln.strip().startswith("4096 "), 5, 1),  # time
    ("nccl_all_reduce_perf.txt", {}, lambda ln: ln.strip().startswith("64 "), 1, 2),  # count
    ("nccl_all_gather.txt", {}, lambda ln: ln.strip().startswith("16384 "), 8, 1),  # in-place
    ("osu_allreduce.txt", {"ranks": 4, "nodes": 1}, lambda ln: ln.startswith("512 "), 1, 1),
    ("osu_latency.txt", {"nodes": 1}, lambda ln: ln.startswith("64 "), 1, 1),
])
def test_malformed_line_is_skipped_and_reported_with_file_and_line(tmp_path, name, kwargs,
                                                                   predicate, token, rows_lost):
    """Was: a malformed number stopped the read (ResultParseError). Now the row (or only the
    damaged variant of an nccl-tests row) is skipped and reported with FILE:LINE, and the rest
    of the file is kept; the fit decides whether too much was lost (test_calib_skips.py)."""
    bad = tmp_path / name
    lineno = _corrupt(DATA / name, bad, predicate,
                      lambda ln: _replace_token(ln, token, "1.2.3"))
    good, got = read_results(DATA / name, **kwargs), read_results(bad, **kwargs)
    assert len(got.skipped) == 1 and got.records == good.records
    (skip,) = got.skipped
    assert (skip.file, skip.line) == (str(bad), lineno) and "1.2.3" in skip.reason
    assert str(skip).startswith(f"{bad}:{lineno}: skipped: ")
    assert len(got.table) == len(good.table) - rows_lost


def test_truncated_nccl_row_is_skipped_and_reported(tmp_path):
    """Was: an error for the file. Now the truncated line is skipped with its line number."""
    bad = tmp_path / "nccl_all_reduce_perf.txt"
    lineno = _corrupt(DATA / bad.name, bad, lambda ln: ln.strip().startswith("8192 "),
                      lambda ln: " ".join(ln.split()[:3]))
    got = read_results(bad)
    assert got.skipped == (SkippedRow(str(bad), lineno, "truncated: 3 columns, the column "
                                      "header has 13", "8192 2048 float"),)
    assert 8192 not in set(got.table["bytes"]) and len(got.table) == 48


def test_malformed_json_names_file_and_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{\n "results": [\n  {"size": 8,}\n ]\n}\n')
    with pytest.raises(ResultParseError, match=r"x\.json:3"):
        read_results(bad, op="all_reduce")


def test_ddlsim_csv_round_trip_and_bad_cell(tmp_path):
    df = read_results(DATA / "nccl_all_reduce_perf.txt").table
    path = write_csv(tmp_path / "r.csv", df)
    back = read_results(path)
    assert detect_format(path) == "ddlsim" and back.skipped == () and back.records == 50
    pd.testing.assert_frame_equal(back.table, df, rtol=1e-8)
    lines = path.read_text().splitlines()
    lines[5] = lines[5].replace(",8,", ",eight,", 1)  # line 6: ranks
    path.write_text("\n".join(lines) + "\n")
    got = read_results(path)  # was: ResultParseError; now that row is skipped and reported
    assert [(s.line, s.reason) for s in got.skipped] == [(6, "ranks 'eight' is not a whole "
                                                          "number")]
    assert len(got.table) == 49


def test_unknown_format_lists_the_allowed_ones(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")
    with pytest.raises(CalibrationError, match="nccl-tests-json"):
        read_results(junk)

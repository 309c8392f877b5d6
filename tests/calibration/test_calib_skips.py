"""Nothing read is lost silently: every row a reader skips is reported with FILE:LINE and the
reason, stored in the profile, printed by ``calibrate fit``; a fit refuses files with too many
unusable rows, groups it cannot fit and non-physical parameters; unreadable files and
profiles are refused with ddlsim's own errors.

Each case damages one row of a sample file of data/ (or of a CSV made from one), writes it
to tmp_path and checks the report against the line it damaged.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ddlsim.calibration import CalibrationProfile
from ddlsim.calibration.build import check_skipped_share, fit_profile
from ddlsim.calibration.cli import app
from ddlsim.calibration.fit import SegmentFit, check_physical
from ddlsim.calibration.outputs import write_csv
from ddlsim.calibration.readers import detect_format, read_results
from ddlsim.calibration.schema import CalibrationError, ReadResult, SkippedRow
from ddlsim.errors import ConfigError
from ddlsim.textio import InputFileError

DATA = Path(__file__).parent / "data"
NCCL, OSU = DATA / "nccl_all_reduce_perf.txt", DATA / "osu_allreduce.txt"


def damage(src: Path, dst: Path, first_token: str, edit) -> int:
    """Apply ``edit`` to the first line of ``src`` whose first token is ``first_token``;
    write ``dst``; return the 1-based line number."""
    lines = src.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [first_token])
    lines[i:i + 1] = edit(lines[i])
    dst.write_text("\n".join(lines) + "\n")
    return i + 1


def token(index: int, new: str):
    def edit(line: str) -> list[str]:
        t = line.split()
        t[index] = new
        return ["  ".join(t)]
    return edit


# nccl-tests row: size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
@pytest.mark.parametrize("first, edit, reason, lost", [
    ("256", token(0, "8K"), "size '8K' is not a whole number of bytes", 2),
    ("1024", token(0, "-16"), "size -16 is negative", 2),
    ("4096", token(5, "nan"), "out-of-place time (µs) is 'nan', not a finite number", 1),
    ("4096", token(9, "inf"), "in-place time (µs) is 'inf', not a finite number", 1),
    ("8192", token(5, "-3.2"), "out-of-place time (µs) -3.2 must be > 0", 1),
    ("8192", token(9, "0.00"), "in-place time (µs) 0.00 must be > 0", 1),
    ("8192", token(5, "1e12"), "longer than an hour", 1),
    ("8192", token(5, "eleven"), "out-of-place time (µs) 'eleven' is not a number", 1),
    ("8192", token(9, "N/A"), "in-place time (µs) is 'N/A' (not measured)", 1),
    ("8192", token(1, "2k"), "count '2k' is not a whole number", 2),
    ("8192", lambda ln: [" ".join(ln.split()[:7])], "truncated: 7 columns, the column header "
     "has 13", 2),
    ("8192", lambda ln: [ln + " 17"], "14 columns, the column header has 13", 2),
    ("8192", lambda ln: [ln, ln], "duplicate size 8192 B (already on line", 0),
    ("8192", token(0, "128"), "size 128 B is smaller than 4096 B on line", 2),
])
def test_nccl_tests_text_skips(tmp_path, first, edit, reason, lost):
    bad = tmp_path / "all_reduce.txt"
    lineno = damage(NCCL, bad, first, edit)
    if reason.startswith("duplicate"):
        lineno += 1  # the second copy is the one skipped
    got = read_results(bad)
    assert [(s.file, s.line) for s in got.skipped] == [(str(bad), lineno)]
    assert reason in got.skipped[0].reason
    assert len(got.table) == 50 - lost and got.unusable == 1


def test_a_new_run_in_the_same_file_may_repeat_sizes(tmp_path):
    """Two runs appended to one file (each with its header) are both kept, not duplicates;
    each ``# Collective test starting`` names the operation of the rows below it."""
    text = NCCL.read_text()
    both = tmp_path / "two.txt"
    both.write_text(text + text.replace("all_reduce_perf", "all_gather_perf"))
    got = read_results(both)
    assert got.skipped == () and len(got.table) == 100
    assert got.table["op"].value_counts().to_dict() == {"all_reduce": 50, "all_gather": 50}


@pytest.mark.parametrize("first, edit, reason", [
    ("512", token(0, "8K"), "size '8K' is not a whole number of bytes"),
    ("512", token(1, "nan"), "mean latency (µs) is 'nan', not a finite number"),
    ("512", token(2, "-1"), "min latency (µs) -1 must be > 0"),
    ("512", token(4, "many"), "iterations 'many' is not a whole number"),
    ("512", lambda ln: [ln.split()[0]], "truncated: 1 columns, the column header has 5"),
    ("512", lambda ln: [ln, ln], "duplicate size 512 B"),
])
def test_osu_skips(tmp_path, first, edit, reason):
    bad = tmp_path / "osu_allreduce.txt"
    lineno = damage(OSU, bad, first, edit) + reason.startswith("duplicate")
    got = read_results(bad, ranks=4, nodes=1)
    assert [s.line for s in got.skipped] == [lineno] and reason in got.skipped[0].reason
    assert len(got.table) == 19 - (not reason.startswith("duplicate"))


def test_osu_row_before_the_header_is_reported(tmp_path):
    bad = tmp_path / "osu.txt"
    bad.write_text("4   1.98\n" + OSU.read_text())
    got = read_results(bad, format="osu", ranks=4, nodes=1)
    assert [(s.line, s.reason) for s in got.skipped] == [
        (1, "a result row before the OSU title and column header")]


def _json_line(text: str, index: int) -> int:
    """Line of the ``{`` that opens results[index] (the sample has one ``"size"`` each)."""
    at = [m.start() for m in re.finditer(r'"size"', text)][index]
    return text.count("\n", 0, text.rfind("{", 0, at)) + 1


@pytest.mark.parametrize("patch, reason, lost", [
    ({"size": "8K"}, "size '8K' is not a whole number of bytes", 2),
    ({"size": -16}, "size -16 is negative", 2),
    ({"size": True}, "size True is not a whole number", 2),
    ({"out_of_place": {"time": float("nan")}}, "out-of-place time (µs) is 'nan'", 1),
    ({"in_place": {"alg_bw": 3.0}}, "in_place has no 'time'", 1),
    ({"out_of_place_per_iter": {"p50_us": -4}}, "out-of-place p50_us -4 must be > 0", 1),
    ({"size": 65536}, "duplicate size 65536 B", 2),  # results[2]'s size
])
def test_nccl_tests_json_skips_name_the_line_of_the_entry(tmp_path, patch, reason, lost):
    doc = json.loads((DATA / "nccl_reduce_scatter.json").read_text())
    doc["results"][3].update(patch)
    bad = tmp_path / "rs.json"
    bad.write_text(json.dumps(doc, indent=1))  # json writes NaN as NaN, as Python reads it
    got = read_results(bad)
    line = _json_line(bad.read_text(), 3)
    assert {s.line for s in got.skipped} == {line} and reason in got.skipped[0].reason
    assert len(got.table) == 18 - lost


def _comm_csv(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "comm.csv", read_results(NCCL).table)


@pytest.mark.parametrize("column, value, reason", [
    ("bytes", "8K", "bytes '8K' is not a whole number of bytes"),
    ("bytes", "-16", "bytes -16 is negative"),
    ("time_mean_s", "inf", "time_mean_s is 'inf', not a finite number"),
    ("time_mean_s", "-1e-5", "time_mean_s -1e-5 must be > 0"),
    ("ranks", "0", "ranks 0 and nodes 1: need 1 <= nodes <= ranks"),
    ("op", "allreduce", "op 'allreduce' is not one of"),
    ("scope", "rack", "scope 'rack' is not one of intra, inter"),
])
def test_ddlsim_csv_skips(tmp_path, column, value, reason):
    path = _comm_csv(tmp_path)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.loc[4, column] = value  # data row 5 = line 6
    df.to_csv(path, index=False)
    got = read_results(path)
    assert [s.line for s in got.skipped] == [6] and reason in got.skipped[0].reason
    assert len(got.table) == 49


def test_ddlsim_csv_missing_fields_and_duplicates(tmp_path):
    path = _comm_csv(tmp_path)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 2)[0]          # line 4: two fields short
    lines.append(lines[10])                        # line 52: a copy of line 11
    path.write_text("\n".join(lines) + "\n")
    got = read_results(path)
    assert [(s.line, s.reason[:40]) for s in got.skipped] == [
        (4, "truncated: 18 fields, the header has 20"),
        (52, "duplicate of line 11 (same backend, libr")]
    assert got.records == 51 and len(got.table) == 49


def test_compute_csv_skips(tmp_path):
    flops = 2.0 * np.array([64, 128, 256, 512]) ** 3
    df = pd.DataFrame({"backend": "numpy", "library_version": "2", "device": "cpu",
                       "kind": ["gemm", "gemm", "gemm", "matmul"], "dtype": "fp32",
                       "m": [64, 128, 256, 512], "n": 0, "k": 0, "batch": 0, "heads": 0,
                       "seq": 0,
                       "head_dim": 0, "flops": flops, "time_mean_s": flops / 1e11,
                       "time_median_s": flops / 1e11, "time_min_s": "", "time_max_s": "",
                       "time_std_s": "", "reps": 3, "flops_per_s": [1e11, 0.0, 1e11, 1e11]})
    path = tmp_path / "c.csv"
    df.to_csv(path, index=False)
    got = read_results(path)
    assert detect_format(path) == "ddlsim-compute"
    assert [(s.line, s.reason) for s in got.skipped] == [
        (3, "flops_per_s 0.0 must be in (0, 1e+18]"),
        (5, "kind 'matmul' is not one of gemm, attention")]
    assert len(got.table) == 2


# ------------------------------------------------------------------------ refusing a fit
def _result(records: int, bad: int) -> ReadResult:
    skipped = tuple(SkippedRow("f.txt", i + 1, "size '8K' is not a whole number of bytes")
                    for i in range(bad))
    return ReadResult(read_results(NCCL).table, skipped, records, "f.txt", "nccl-tests")


def test_share_of_unusable_rows_refuses_above_the_limit_only():
    check_skipped_share([_result(20, 2)])            # 10 %: not more than the default 10 %
    with pytest.raises(CalibrationError, match=r"f\.txt: 3 of 20 rows \(15%\).*"
                                               r"--max-skipped-share"):
        check_skipped_share([_result(20, 3)])
    check_skipped_share([_result(20, 3)], 0.15)
    with pytest.raises(CalibrationError, match="in \\[0, 1\\]"):
        check_skipped_share([_result(20, 3)], 1.5)


def test_fit_records_the_skipped_rows_in_the_provenance(tmp_path):
    bad = tmp_path / "all_reduce.txt"
    line = damage(NCCL, bad, "256", token(0, "8K"))
    profile = fit_profile([read_results(bad)], bootstrap=0)
    prov = profile.to_dict()["provenance"]
    assert prov["skipped"] == [{"file": str(bad), "line": line, "text": prov["skipped"][0]["text"],
                                "reason": "size '8K' is not a whole number of bytes"}]
    assert prov["inputs"][0]["records"] == 25 and prov["inputs"][0]["skipped"] == 1
    assert prov["fit"]["max_skipped_share"] == 0.1


def test_too_few_points_in_a_group_refuses_the_fit_and_names_it(tmp_path):
    df = read_results(NCCL).table
    lonely = df.iloc[:2].assign(op="broadcast")  # one size (in- and out-of-place)
    with pytest.raises(CalibrationError, match=r"cannot fit 1 communicator group.*"
                                               r"nccl broadcast intra \(8 ranks, 1 nodes\)"):
        fit_profile([ReadResult(pd.concat([df, lonely]), (), 51, "x.csv", "ddlsim")],
                    bootstrap=0)


def test_times_that_do_not_grow_with_size_give_no_bandwidth(tmp_path):
    df = read_results(NCCL).table
    df = df[df["bytes"] <= 4096].assign(time_mean_s=11e-6)
    with pytest.raises(CalibrationError, match="non-physical fit.*bandwidth 1/β is .* B/s"):
        fit_profile([ReadResult(df, (), len(df), "x.csv", "ddlsim")], bootstrap=0)


def _segment(alpha: float, beta: float) -> SegmentFit:
    return SegmentFit(8, 1024, alpha, beta, (0, 0), (0, 0), 0, 0, 0, 5, 0.01)


@pytest.mark.parametrize("alpha, beta, needle", [
    (-1e-6, 1e-10, "latency α = -1e-06"), (float("nan"), 1e-10, "latency α = nan"),
    (1e-6, float("inf"), "β = inf"), (1e-6, -1e-10, "β = -1e-10"),
    (1e-6, 0.0, "bandwidth 1/β is infinite"), (1e-6, 0.5e-15, "1/β is 2e+15 B/s"),
])
def test_non_physical_parameters_are_rejected_with_the_reason(alpha, beta, needle):
    with pytest.raises(CalibrationError, match=re.escape(needle)):
        check_physical((_segment(alpha, beta),))
    check_physical((_segment(1e-6, 0.0), _segment(2e-6, 1e-10)))  # flat below, then slope


# ---------------------------------------------------------------------------- the CLI
def test_cli_fit_prints_every_skipped_row_on_one_line_then_refuses_or_fits(tmp_path):
    bad = tmp_path / "all_reduce.txt"
    lines = [damage(NCCL, bad, "256", token(0, "8K")),
             damage(bad, bad, "4096", token(5, "nan")),
             damage(bad, bad, "8192", lambda ln: [" ".join(ln.split()[:6])])]
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["fit", str(bad), "-o", str(out), "--bootstrap", "0"])
    printed = [ln for ln in res.output.splitlines() if ": skipped: " in ln]
    assert [ln.split(": skipped: ")[0] for ln in printed] == [f"{bad}:{n}" for n in lines]
    assert res.exit_code == 2 and not out.exists()  # 3 of 25 = 12 % > 10 %
    assert "3 of 25 rows (12%)" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["fit", str(bad), "-o", str(out), "--bootstrap", "0",
                                   "--max-skipped-share", "0.2"])
    assert res.exit_code == 0, res.output
    assert "3 row(s) skipped" in " ".join(res.output.split())
    assert len(CalibrationProfile.load(out).doc.provenance["skipped"]) == 3
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and f"{bad}:{lines[0]}: size '8K'" in shown.output


# --------------------------------------------------------------- unreadable files, profiles
def _unreadable(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"x.{kind}"
    if kind == "dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "binary":
        p.write_bytes(b"\x7fELF\x00\x00" * 10)
    elif kind == "latin1":
        p.write_bytes("# size  count  café\n".encode("latin-1"))
    return p


@pytest.mark.parametrize("kind, needle", [("dir", "a directory"), ("fifo", "FIFO"),
                                          ("binary", "binary"), ("latin1", "not UTF-8"),
                                          ("missing", "does not exist")])
def test_unreadable_inputs_are_refused_without_reading(tmp_path, kind, needle):
    path = _unreadable(tmp_path, kind)
    for call in (lambda: read_results(path), lambda: detect_format(path),
                 lambda: read_results(path, "osu", ranks=2, nodes=1),
                 lambda: CalibrationProfile.load(path)):
        with pytest.raises(InputFileError, match=needle):
            call()


@pytest.mark.parametrize("text, needle", [
    ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
     + "".join(f"{n}: &{n} [*{m}, *{m}, *{m}, *{m}, *{m}, *{m}, *{m}, *{m}, *{m}, *{m}]\n"
               for m, n in zip("abcdefg", "bcdefgh")),
     "expands to more than"),
    ("x: " + "[" * 200 + "]" * 200 + "\n", "nested more than 50 levels"),
    ("version: 1\nversion: 1\n", "duplicate key 'version'"),
    ("version: 1\ncomm: [{a: 1}\n", "not valid YAML"),
    ("version: " + "9" * 5000 + "\n", "not a YAML document ddlsim can read"),
    ("--- 1\n--- 2\n", "not valid YAML"),
])
def test_garbage_profiles_are_config_errors(tmp_path, text, needle):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        CalibrationProfile.load(p)


@pytest.mark.parametrize("value", [".inf", ".nan", "-1.0e-6"])
def test_profile_with_non_physical_parameters_is_refused(tmp_path, value):
    path = fit_profile([read_results(NCCL)], bootstrap=0).save(tmp_path / "p.yaml")
    CalibrationProfile.load(path)  # as written: fine
    path.write_text(re.sub(r"alpha_s: [^,}\n]+", f"alpha_s: {value}", path.read_text(), count=1))
    with pytest.raises(ConfigError, match="alpha_s"):
        CalibrationProfile.load(path)


# ------------------------------------------------------------------------ bounded work
def test_a_file_with_too_many_rows_is_refused_when_the_limit_is_reached(monkeypatch):
    """The limit (50,000 rows) is patched down to 10 so the test stays fast; reading stops at
    row 11 of the 25, naming its line."""
    import ddlsim.calibration.readers.checks as checks

    monkeypatch.setattr(checks, "MAX_RECORDS", 10)
    line = NCCL.read_text().splitlines().index(next(
        ln for ln in NCCL.read_text().splitlines() if ln.split()[:1] == ["8192"])) + 1
    with pytest.raises(CalibrationError, match=f"{NCCL.name}:{line}: more than 10 result rows"):
        read_results(NCCL)


def test_a_curve_with_too_many_sizes_is_refused_before_the_breakpoint_search(monkeypatch):
    import ddlsim.calibration.fit as fit

    monkeypatch.setattr(fit, "MAX_FIT_SIZES", 24)  # the sample has 25 sizes
    with pytest.raises(CalibrationError, match="50 points at 25 distinct sizes: more than"):
        fit_profile([read_results(NCCL)], bootstrap=0)


@pytest.mark.parametrize("text, needle", [
    ('{"results": [], "results": [{"size": 8}]}', "duplicate key 'results'"),
    ("[" * 100_000 + "]" * 100_000, "nested more than 50 levels"),
    ('{"results": [{"size": 1' + "0" * 5000 + "}]}", "invalid nccl-tests JSON"),
    ('{"results": [{"size": 8,}]}', ":1: invalid nccl-tests JSON: not valid JSON"),
    ('{"results": []}', "the 'results' list is empty"),
    ('{"results": {"size": 8}}', "expected an object with a 'results' list"),
])
def test_broken_json_is_one_error_for_the_file(tmp_path, text, needle):
    path = tmp_path / "all_reduce.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=re.escape(needle)):
        read_results(path)

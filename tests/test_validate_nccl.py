"""The nccl-tests validation (benchmarks/validate_nccl.py): its data's provenance and roles,
forced algorithms NCCL can run, and the script's summary. No accuracy bounds (as for the other
public validations): the figures are reported in docs/comm.md and docs/validation.md."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("validate_nccl", BENCH / "validate_nccl.py")
vn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vn)
ROWS = vn.rows()
HEADER = "\n".join(ln for ln in vn.DATA.read_text().splitlines() if ln.startswith("#"))


def test_every_source_is_cited_in_the_header():
    for source in {r["source"] for r in ROWS}:
        assert re.search(rf"^# {source}:", HEADER, re.M), source


def test_roles_and_sizes():
    assert {r["role"] for r in ROWS} == {"fitted", "held-out"}
    assert all(int(r["size_bytes"]) > 0 for r in ROWS)
    # exactly one measurement a row: busbw from 1 MiB up, the out-of-place time below
    for r in ROWS:
        small = int(r["size_bytes"]) < vn.SMALL_BYTES
        assert bool(r["busbw_GBps"]) != small and bool(r["time_us"]) == small, r
        assert float(r["time_us"] if small else r["busbw_GBps"]) > 0
    # the fitted rows are those measured.py and hops.py name: nccl212's all-reduce, nccl290,
    # nccl309a; nccl123, nccl150
    fitted = {(r["source"], r["op"]) for r in ROWS if r["role"] == "fitted"}
    assert fitted == {("nccl212", "all_reduce"), ("nccl290", "all_reduce"),
                      ("nccl309a", "all_reduce"), ("nccl123", "all_reduce"),
                      ("nccl150", "all_reduce")}


def test_the_a100_ring_ll_step_is_the_fit_of_its_rows():
    """hops.LL_HOP_US["ampere"] is the least-squares step of the nccl123 rows, as --fit prints."""
    from ddlsim.simulator.collectives.nccl.hops import LL_HOP_US, fit_ll_hop_us
    points = [(int(r["gpus"]), float(r["time_us"])) for r in ROWS if r["source"] == "nccl123"]
    assert len(points) == 7
    assert LL_HOP_US["ampere"] == pytest.approx(fit_ll_hop_us(points), abs=5e-4)
    assert "kept 1.877" in vn.fit_hop()


def test_the_network_ll_step_is_the_fit_of_its_rows():
    """hops.NET_LL_HOP_US is the least-squares network step of the nccl150 rows (one GPU on each
    of 2 nodes: both steps of the ring cross the network), as --fit prints; the rows are timed
    on one GPU a node."""
    from ddlsim.simulator.collectives.nccl.hops import NET_LL_HOP_US, fit_net_ll_hop_us
    points = [(int(r["gpus"]), int(r["nodes"]), float(r["time_us"])) for r in ROWS
              if r["source"] == "nccl150"]
    assert len(points) == 4 and all(p == nodes == 2 for p, nodes, _ in points)
    # by hand: the mean of (t − 6.6 µs NCCL's ring LL base) / 2 steps
    by_hand = sum((t - 6.6) / 2 for _, _, t in points) / len(points)
    assert fit_net_ll_hop_us(points) == pytest.approx(by_hand)
    assert NET_LL_HOP_US == pytest.approx(by_hand, abs=5e-4)
    assert f"kept {NET_LL_HOP_US:g}" in vn.fit_hop()
    assert vn.system(next(r for r in ROWS if r["source"] == "nccl150")).devices_per_node == 1


@pytest.mark.parametrize("row", [r for r in ROWS if r["algorithm"]],
                         ids=lambda r: f"{r['source']}-{r['gpus']}-{r['algorithm']}")
def test_a_forced_algorithm_is_one_nccl_runs_there(row):
    """A row that forced NCCL_ALGO names an algorithm NCCL runs on that group (NVLS: more
    than 2 GPUs of a node, src/transport/nvls.cc), so ddlsim times it rather than refusing."""
    busbw, label = vn.predicted_busbw(row, "analytical")
    assert busbw > 0 and label.startswith(row["algorithm"] + "/")


def test_a_time_row_is_compared_by_nccl_tests_busbw_formula():
    """busbw = size / time × 2(p−1)/p (nccl-tests doc/PERFORMANCE.md): 4096 B in 16.69 µs on
    8 GPUs is 0.4295 GB/s (the issue prints 0.43), and time_us inverts it."""
    row = next(r for r in ROWS if r["source"] == "deepep303" and r["op"] == "all_reduce"
               and r["size_bytes"] == "4096")
    assert vn.measured_busbw(row) == pytest.approx(4096 / 16.69e-6 * 2 * 7 / 8 / 1e9)
    assert round(vn.measured_busbw(row), 2) == 0.43
    assert vn.time_us(row, vn.measured_busbw(row)) == pytest.approx(16.69)


def test_small_messages_are_summarised_apart():
    """Rows under 1 MiB get their own line; the role lines stay those from 1 MiB up."""
    errors = {"fitted": [], "held-out": [0.1], "small": [-0.5, 0.1], "size:8": [-0.5],
              "size:1048576": [0.1]}
    text = vn.summary(errors, "analytical")
    assert "held-out (validation): 1 measurements, mean |error| 10.0%" in text
    assert "small messages (< 1 MiB, held-out): 2 measurements, mean |error| 30.0%" in text
    assert "small messages (< 1 MiB, fitted)" not in text  # none in errors: no line
    errors["small fitted"] = [0.02]
    assert ("small messages (< 1 MiB, fitted): 1 measurements, mean |error| 2.0%"
            in vn.summary(errors, "analytical"))
    assert "worst per size: 8 B -50.0% (1), 1 MiB +10.0% (1)" in text


def test_summary_gives_roles_and_the_worst_per_size():
    errors = {"fitted": [0.01], "held-out": [-0.2, 0.1], "size:1048576": [0.1, -0.2],
              "size:4194304": [0.01]}
    text = vn.summary(errors, "analytical")
    assert "held-out (validation): 2 measurements" in text
    assert "worst per size: 1 MiB -20.0% (2), 4 MiB +1.0% (1)" in text


#: a made-up nccl-tests output (8 ranks on one host, two sizes), the format of all_reduce_perf
OUTPUT = """\
# nThread 1 nGpus 1 minBytes 32768 maxBytes 33554432 step: 1024(factor) warmup iters: 5 iters: 20
#
# Using devices
""" + "".join(f"#  Rank  {r} Group  0 Pid  {100 + r} on   node-a device  {r} [0x0{r}] NVIDIA "
              "A100-SXM4-80GB\n" for r in range(8)) + """\
#
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
       32768          8192     float     sum      -1    20.00    1.64    2.87      0    21.00    1.56    2.73      0
    33554432       8388608     float     sum      -1    200.0  167.77  293.60      0    201.0  166.94  292.14      0
"""


def test_an_nccl_tests_output_becomes_rows(tmp_path):
    """busbw of the out-of-place time: 32768 B / 20 µs × 2·7/8 = 2.867 GB/s."""
    path = tmp_path / "a100.txt"
    path.write_text(OUTPUT)
    got = vn.output_rows(str(path), "A100", op="all_reduce")
    assert [(r["gpus"], r["nodes"], r["op"], r["size_bytes"]) for r in got] == [
        ("8", "1", "all_reduce", "32768"), ("8", "1", "all_reduce", "33554432")]
    assert float(got[0]["busbw_GBps"]) == pytest.approx(32768 / 20e-6 * 2 * 7 / 8 / 1e9)


def test_main_compares_an_output_and_refuses_bad_options(tmp_path, capsys):
    path = tmp_path / "a100.txt"
    path.write_text(OUTPUT)
    assert vn.main(["--nccl-tests", str(path), "--gpu", "A100", "--op", "all_reduce"]) == 0
    out = capsys.readouterr().out
    assert out.count("| a100 | A100 | 8 | 1 | all_reduce |") == 2
    assert "worst per size: 32 KiB" in out
    assert vn.main(["--nccl-tests", str(path), "--gpu", "A100", "--op", "all_reduce",
                    "--algorithm", "nccl_bogus"]) == 2
    assert "not one of NCCL's for all_reduce" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        vn.main(["--nccl-tests", str(path)])  # no --gpu
    assert exit_.value.code == 2


def test_an_excluded_row_has_its_reason_and_only_the_source_disagreeing_with_itself():
    """The one excluded row (DeepEP#303's 32 B all-reduce: 24.63 µs out of place, 13.10 µs in
    place in the same run) states why in the CSV; the table shows the reason and every mean and
    worst leaves it out, the summary naming it."""
    excluded = [r for r in ROWS if r["excluded"]]
    assert [(r["source"], r["op"], r["size_bytes"]) for r in excluded] == [
        ("deepep303", "all_reduce", "32")]
    assert "in-place time of 32 B is 13.10 us" in excluded[0]["excluded"]
    lines, errors = vn.table("analytical", excluded)
    assert "held-out, excluded: the same run's in-place time" in lines[-1]
    assert errors["held-out"] == errors["small"] == [] and len(errors["excluded"]) == 1
    assert not any(k.startswith("size:") for k in errors)
    text = vn.summary(errors, "analytical")
    assert "excluded from every mean and worst above" in text
    assert "deepep303 all_reduce 32 B" in text


def test_bands_and_the_issue_target():
    """One line per size band with rows (held-out and fitted apart), and the target line: every
    held-out size within 25 %, mean within 10 %."""
    errors = {"held-out": [0.05], "small": [-0.30, 0.02], "fitted": [0.01],
              "held-out:8": [-0.30], "held-out:4096": [0.02], "held-out:1048576": [0.05],
              "fitted:1048576": [0.01]}
    lines = vn.band_lines(errors)
    assert lines[0] == ("band < 1 KiB: held-out 1, mean |error| 30.0%, worst -30.0%; "
                        "fitted none")
    assert lines[1].startswith("band 1 KiB-1 MiB: held-out 1, mean |error| 2.0%")
    assert lines[2] == ("band 1-16 MiB: held-out 1, mean |error| 5.0%, worst +5.0%; "
                        "fitted 1, mean |error| 1.0%, worst +1.0%")
    assert len(lines) == 4  # no rows from 16 MiB: no band line
    assert lines[3].endswith("3 rows, mean |error| 12.3%, sizes beyond: 8 B -30.0% -> not met")
    errors["held-out:8"] = [-0.2]
    assert vn.band_lines(errors)[-1].endswith("sizes beyond: none -> met")
    assert vn.band_lines({"held-out": [0.1]}) == []  # no per-role sizes: no band lines


def test_include_excluded_counts_the_excluded_row_and_stays_out_of_the_docs(capsys):
    """``--include-excluded``: the 32 B row counted in the means and worsts (docs/comm.md's
    figures "with the 32 B row"), its reason still shown; refused where it would be ignored."""
    excluded = [r for r in ROWS if r["excluded"]]
    lines, errors = vn.table("analytical", excluded, include_excluded=True)
    assert "counted though excluded: the same run's in-place time" in lines[-1]
    assert len(errors["small"]) == 1 and "excluded" not in errors
    assert errors["size:32"] == errors["small"]
    for other in (["--write-docs"], ["--fit"], ["--nccl-tests", "x.txt", "--gpu", "A100"]):
        with pytest.raises(SystemExit) as exit_:
            vn.main(["--include-excluded", *other])
        assert exit_.value.code == 2
        assert "--include-excluded does not go with" in capsys.readouterr().err


def test_a_stated_nccl_release_is_the_sources_and_times_the_row():
    """A row's ``nccl_version`` is the release its source's header entry states, and the row is
    timed with it where ddlsim tabulates it (else the default, said in its role)."""
    from ddlsim.simulator.collectives.nccl.versions import DEFAULT_VERSION
    for source in {r["source"] for r in ROWS if r["nccl_version"]}:
        versions = {r["nccl_version"] for r in ROWS if r["source"] == source}
        entry = re.search(rf"^# {source}:(.*?)(?=^# \w+:|\Z)", HEADER, re.M | re.S).group(1)
        assert len(versions) == 1 and f"NCCL {versions.pop()}" in entry, source
    row = next(r for r in ROWS if r["source"] == "nccl1244")
    assert vn.row_version(row) == ("2.21.5", "NCCL 2.21.5 as stated")
    assert vn.system(row).collectives.nccl_version == "2.21.5"
    assert vn.row_version(row, "2.30.7") == ("2.30.7", "NCCL 2.30.7 (--nccl-version)")
    old = next(r for r in ROWS if r["source"] == "nccl812")
    assert vn.row_version(old) == (DEFAULT_VERSION, "NCCL 2.16.5 stated, not tabulated: timed "
                                                    f"with {DEFAULT_VERSION}")
    unstated = next(r for r in ROWS if r["source"] == "nccl290")
    assert vn.row_version(unstated) == (DEFAULT_VERSION, "")


def test_nccl_version_does_not_go_with_the_docs_or_the_fit(capsys):
    with pytest.raises(SystemExit):
        vn.main(["--nccl-version", "2.21.5", "--write-docs"])
    assert "--nccl-version does not go with" in capsys.readouterr().err

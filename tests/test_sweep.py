"""``ddlsim sweep`` and ``ddlsim.sweep``: every combination of the ranges, in a fixed order,
each predicted exactly as ``ddlsim.predict`` predicts it; invalid combinations recorded."""

from __future__ import annotations

import itertools
import json
import math
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.sweeps import DOES_NOT_FIT, SweepError, parse_range, parse_values

runner = CliRunner()
WIKI = "examples/wiki-gpt2-9ranks-reduce_scatter.yaml"
NIC = "system.nic.bandwidth_Bps"
NIC_RANGE = f"{NIC}=1,10,100 Gb/s"
STRATEGIES = ["ddp", "reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter"]


def _refused(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error: ") and message in text, text
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # one paragraph
    assert "Traceback" not in r.output and r.stdout == ""
    return text


# -- range syntax ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec, values", [
    ("1,2,4", [1, 2, 4]),
    ("ring, tree", ["ring", "tree"]),
    ("true,false", [True, False]),
    ("100,200,400 Gb/s", ["100 Gb/s", "200 Gb/s", "400 Gb/s"]),  # the last unit applies to all
    ("10 Gb/s,1 GB/s", ["10 Gb/s", "1 GB/s"]),                   # items keep their own unit
    ("1.5,25 us", ["1.5 us", "25 us"]),
    ("1:8", [1, 2, 3, 4, 5, 6, 7, 8]),                            # inclusive
    ("0:12:4", [0, 4, 8, 12]),
    ("1:10:3", [1, 4, 7, 10]),
    ("1:64:*2", [1, 2, 4, 8, 16, 32, 64]),
    ("1:10:*3", [1, 3, 9]),                                       # stops at the last <= STOP
    ("5:5", [5]),
])
def test_accepted_range_forms(spec, values):
    assert parse_values(spec) == values


@pytest.mark.parametrize("spec, problem", [
    ("", "empty item"), ("1,,2", "empty item"), ("1,2,1", "given twice"),
    ("8:1", "ends (1) before it starts (8)"), ("1:8:0", "step >= 1"),
    ("0:8:*2", "factor >= 2"), ("1:8:*1", "factor >= 2"),
    ("1.5:3", "is not an integer range"), ("1:8,16", "is not an integer range"),
    ("1:30 Gb/s", "integers without a unit"),
    ("ring,100 Gb/s", "'ring' is not one"), ("1,[2,3]", "not a scalar"), ("{a: 1}", "not a scalar"),
])
def test_bad_ranges_are_refused_naming_the_allowed_forms(spec, problem):
    with pytest.raises(SweepError) as exc:
        parse_values(spec, "--set-range 'x'")
    text = str(exc.value)
    assert text.startswith("--set-range 'x': ") and problem in text
    assert "START:STOP[:STEP]" in text and "100,200,400 Gb/s" in text


def test_parse_range_splits_the_path():
    assert parse_range("parallel.tensor_model_parallel_size=1:8:*2") == (
        "parallel.tensor_model_parallel_size", [1, 2, 4, 8])
    for text in ("parallel", "tp=1,2", "parallel.=1,2", "=1,2"):
        with pytest.raises(SweepError, match="PATH=VALUES"):
            parse_range(text)


# -- the sweep ------------------------------------------------------------------------------

def test_product_order_and_count():
    nics = ["1 Gb/s", "10 Gb/s"]
    frame = ddlsim.sweep(WIKI, {NIC: nics, "parallel.dp_strategy": STRATEGIES})
    assert len(frame) == len(nics) * len(STRATEGIES)
    assert list(frame.columns[:2]) == [NIC, "parallel.dp_strategy"]
    expected = [(float(n.split()[0]) * 1e9 / 8, s) for n, s in itertools.product(nics, STRATEGIES)]
    assert list(zip(frame[NIC], frame["parallel.dp_strategy"])) == expected  # first is slowest
    assert frame["valid"].all() and frame["reason"].isna().all()


def test_nic_sweep_on_the_wiki_example_equals_separate_predictions():
    frame = ddlsim.sweep(WIKI, {NIC: parse_values("1,10,100 Gb/s")})
    times = list(frame["iteration_time_s"])
    # More NIC bandwidth can only shorten the data-parallel reduction: never slower.
    assert all(a >= b for a, b in zip(times, times[1:])) and times[0] > times[-1]
    for (_, row), nic in zip(frame.iterrows(), ("1 Gb/s", "10 Gb/s", "100 Gb/s")):
        cfg = ddlsim.load_config(WIKI, [f"{NIC}={nic}"])
        alone = ddlsim.predict(cfg).to_row()
        assert {k: row[k] for k in alone} == alone  # exactly, every column
        assert row[NIC] == cfg.system.nic.bandwidth_Bps


def test_invalid_combinations_are_recorded_not_raised():
    frame = ddlsim.sweep(WIKI, {"parallel.tensor_model_parallel_size": [1, 2, 3]})
    assert list(frame["valid"]) == [True, False, False]
    assert frame["iteration_time_s"].notna().tolist() == [True, False, False]
    for tp, reason in zip((2, 3), frame["reason"][1:]):  # TP·9 ranks > the 10 devices
        assert f"{9 * tp} ranks" in reason and "10 devices" in reason


def test_plans_that_do_not_fit_are_predicted_and_marked():
    small = ["system.device.memory_bytes=1 GB"]  # the wiki plan needs 2.01 GiB per rank
    kept = ddlsim.sweep(WIKI, {NIC: ["1 Gb/s"]}, small)
    assert kept["valid"].all() and not kept["fits"].any()
    assert kept["iteration_time_s"][0] > 0
    strict = ddlsim.sweep(WIKI, {NIC: ["1 Gb/s"]}, small, check_fit=True)
    assert list(strict["reason"]) == [DOES_NOT_FIT] and not strict["valid"].any()
    assert strict["iteration_time_s"][0] == kept["iteration_time_s"][0]


def test_too_large_sweeps_and_unknown_paths_are_refused():
    from ddlsim.errors import WorkTooLargeError

    with pytest.raises(WorkTooLargeError, match="10,100 combinations"):
        ddlsim.sweep(WIKI, {"train.micro_batch_size": list(range(1, 102)),
                            "parallel.data_parallel_size": list(range(1, 101))})
    with pytest.raises(SweepError, match="did you mean 'bandwidth_Bps'"):
        ddlsim.sweep(WIKI, {"system.nic.bandwith_Bps": [1e9]})
    with pytest.raises(SweepError, match="both swept and set"):
        ddlsim.sweep(WIKI, {NIC: [1e9]}, [f"{NIC}=2e9"])


# -- the command ----------------------------------------------------------------------------

def test_cli_table_and_summary():
    r = runner.invoke(app, ["sweep", WIKI, "--set-range", NIC_RANGE, "--set-range",
                            "parallel.tensor_model_parallel_size=1,2"])
    assert r.exit_code == 0, r.output
    assert "Sweep of system.nic.bandwidth_Bps, parallel.tensor_model_parallel_size" in r.stdout
    assert "6 runs: 3 valid, 3 invalid:" in r.stdout
    assert "(1) 3 × the plan needs TP·PP·DP = 2·1·9 = 18 ranks" in " ".join(r.stdout.split())


def test_cli_csv_output_round_trips(tmp_path):
    path = tmp_path / "plans.csv"
    r = runner.invoke(app, ["sweep", WIKI, "--set-range", NIC_RANGE, "-o", str(path)])
    assert r.exit_code == 0, r.output
    read = pd.read_csv(path)
    frame = ddlsim.sweep(WIKI, {NIC: parse_values("1,10,100 Gb/s")}, check_fit=True)
    assert list(read.columns) == list(frame.columns)
    for column in (NIC, "iteration_time_s", "tokens_per_s", "mfu", "memory_total_bytes"):
        assert list(read[column]) == list(frame[column])  # full precision
    assert read["valid"].all() and read["reason"].isna().all()


def test_cli_json_format_lists_every_row():
    r = runner.invoke(app, ["sweep", WIKI, "--set-range", "parallel.tensor_model_parallel_size=1,2",
                            "-f", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["valid"] for row in rows] == [True, False]
    assert rows[1]["iteration_time_s"] is None and "18 ranks" in rows[1]["reason"]
    assert "2 runs: 1 valid, 1 invalid" in r.stderr


def test_cli_plot_is_a_png_with_labelled_axes(tmp_path):
    from ddlsim.sweepreport import draw_sweep

    path = tmp_path / "sweep.png"
    r = runner.invoke(app, ["sweep", WIKI, "--set-range", NIC_RANGE, "--set-range",
                            "parallel.dp_strategy=ddp,reduce_scatter", "--plot", str(path)])
    assert r.exit_code == 0, r.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    paths = [NIC, "parallel.dp_strategy"]
    frame = ddlsim.sweep(WIKI, {NIC: parse_values("1,10,100 Gb/s"),
                                "parallel.dp_strategy": ["ddp", "reduce_scatter"]})
    fig = draw_sweep(frame, paths, tmp_path / "again.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "system.nic.bandwidth (Gb/s)"  # as typed (issue 31)
    assert sorted(ax.get_lines()[0].get_xdata()) == [1.0, 10.0, 100.0]
    assert ax.get_ylabel() == "iteration time (s)" and ax.get_xscale() == "log"
    assert len(ax.get_lines()) == 2  # one line per dp_strategy


@pytest.mark.parametrize("args, message", [
    (["--set-range", f"{NIC}=1:4:0"], "--set-range 'system.nic.bandwidth_Bps=1:4:0': the "
                                      "integer range '1:4:0' needs a step >= 1"),
    (["--set-range", "tp"], "write PATH=VALUES"),
    (["--set-range", f"{NIC}=1,2", "--set-range", f"{NIC}=3"], "names 'system.nic.bandwidth_Bps' twice"),
    (["--set-range", "train.micro_batch_size=1:101", "--set-range",
      "parallel.data_parallel_size=1:100"], "the sweep (101 × 100): this run would take too "
                                            "much work: 10,100 combinations"),
    (["--set-range", f"{NIC}=1,2,3", "--max-runs", "2"], "3 combinations in the sweep (the product of the ranges' lengths), over the limit of 2"),
    (["--set-range", f"{NIC}=1", "--engine", "fast"], "--engine 'fast' is not allowed"),
    (["--set-range", f"{NIC}=1", "-o", "-"], "-o - is not allowed for a sweep"),
    (["--set-range", f"{NIC}=1", "--force"], "no output file is named"),
])
def test_cli_refusals_are_one_paragraph(args, message):
    _refused(["sweep", WIKI, *args], message)


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    _refused(["sweep", WIKI, "--set-range", f"{NIC}=1", "-o", str(tmp_path / "p.parquet")],
             "pip install pyarrow")
    assert not (tmp_path / "p.parquet").exists()


def test_progress_bar_shows_only_after_its_delay():
    from ddlsim.sweepreport import ProgressBar

    quick = ProgressBar(delay_s=math.inf)
    quick(1, 3)
    assert quick.bar is None
    slow = ProgressBar(delay_s=0.0)
    slow(1, 3)
    assert slow.bar is not None and slow.bar.tasks[0].completed == 1
    slow.close()
    assert slow.bar is None


def test_the_api_name_stays_the_function_after_the_module_is_imported():
    import ddlsim.sweeps  # noqa: F401 — a submodule named "sweep" would shadow the function

    assert ddlsim.sweep is ddlsim.sweeps.sweep


def test_a_yaml_flow_list_gives_values_that_are_lists_or_mappings():
    """``[[1,1,1],[2,2,1]]``: values a comma list cannot write (CosmoFlow spatial grids, a
    software stack with overrides), each given once."""
    from ddlsim.ranges import parse_values
    assert parse_values("[[1,1,1],[2,2,1]]") == [[1, 1, 1], [2, 2, 1]]
    assert parse_values("[megatron-core-2024, {stack: deepspeed, what_if: true}]") == \
        ["megatron-core-2024", {"stack": "deepspeed", "what_if": True}]
    for bad, words in (("[[1,1,1],[1,1,1]]", "given twice"), ("[]", "non-empty"),
                       ("[[1,1", "not a YAML list")):
        with pytest.raises(SweepError, match=words):
            parse_values(bad)

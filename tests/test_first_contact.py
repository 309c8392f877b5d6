"""Issue 31, first contact: every budget checked before the work is built, every value checked
where it enters, no output written over an input. Each case answers within a second."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.errors import ConfigError, WorkTooLargeError
from ddlsim.limits import Limits

WIKI = "examples/wiki-gpt2-9ranks-reduce_scatter.yaml"
SEARCH = "examples/search-gpt3-175b-1024.yaml"
runner = CliRunner()


def run_cli(*args: str):
    start = time.perf_counter()
    res = runner.invoke(app, list(args))
    return res, time.perf_counter() - start


def one_error(res) -> str:
    """The one ``error:`` paragraph of a refused command (exit 2)."""
    text = res.output.strip()
    assert res.exit_code == 2, res.output
    assert "Traceback" not in text and "\nerror: " in "\n" + text, text
    before, _, error = ("\n" + text).partition("\nerror: ")
    assert all(ln.startswith("warning: ") for ln in before.splitlines() if ln), text
    return "error: " + error


# ---------------------------------------------------------------------- budgets before build
@pytest.mark.parametrize("args, budget", [
    (["sweep", WIKI, "--set-range", "train.micro_batch_size=1:100000000"], "axis_values=1e8"),
    (["sweep", WIKI, "--set-range",
      "train.micro_batch_size=" + ",".join(map(str, range(1, 100_002)))], "axis_values=200000"),
    (["search", SEARCH, "--axis", "train.micro_batch_size=1:100000000"], "axis_values=1e8"),
    (["search", SEARCH, "--axis", "train.micro_batch_size=1:90000", "--axis",
      "parallel.tensor_model_parallel_size=1:64"], "search_plans=6e6"),
    (["predict", WIKI, "--set", "system.nodes=1000000"], "topology_links=1e7"),
    (["calibrate", "fit", "tests/calibration/data/nccl_all_reduce_perf.txt", "-o",
      "never-written.yaml", "--max-segments", "1000000"], "fit_segments=1e6"),
])
def test_work_is_refused_before_it_is_built_with_the_limit_to_raise(args, budget):
    res, took = run_cli(*args)
    text = one_error(res)
    assert f"--limit {budget}" in text
    assert took < 5.0, took  # ~0.1-1 s here (without the check: 16-90 s); 5 s for a loaded CI
    assert not Path("never-written.yaml").exists()


def test_every_command_with_work_takes_limit():
    for command in ("predict", "compare", "sweep", "search"):
        res = runner.invoke(app, [command, "--help"])
        assert "--limit" in res.output, command
    res = runner.invoke(app, ["calibrate", "fit", "--help"])
    assert "--limit" in res.output


def test_a_raised_limit_lets_the_sweep_through():
    ranges = {"train.micro_batch_size": [1, 2, 4]}
    with pytest.raises(WorkTooLargeError, match="sweep_runs=3"):
        ddlsim.sweep(WIKI, ranges, limits=Limits(sweep_runs=2))
    frame = ddlsim.sweep(WIKI, ranges, limits=Limits(sweep_runs=3))
    assert len(frame) == 3


def test_sweep_predictions_run_under_the_given_limits():
    frame = ddlsim.sweep(WIKI, {"train.micro_batch_size": [1]}, limits=Limits(ranks=8))
    assert not frame["valid"][0] and "--limit ranks=" in frame["reason"][0]


def test_search_and_sweep_refuse_a_range_without_materialising_it():
    start = time.perf_counter()
    with pytest.raises(WorkTooLargeError, match="10,000,000,000 values"):
        ddlsim.sweep(WIKI, {"train.micro_batch_size": range(1, 10**10 + 1)})
    with pytest.raises(WorkTooLargeError, match="axis_values"):
        ddlsim.search(SEARCH, {"train.micro_batch_size": "1:10000000000"})
    assert time.perf_counter() - start < 5.0  # without the check: minutes and GBs


def test_max_runs_and_limit_sweep_runs_are_one_budget():
    text = one_error(runner.invoke(app, ["sweep", WIKI, "--set-range", "train.micro_batch_size=1,2",
                                         "--max-runs", "5", "--limit", "sweep_runs=5"]))
    assert "give one" in text


def test_a_limit_given_twice_is_refused():
    text = one_error(runner.invoke(app, ["predict", WIKI, "--limit", "ranks=10",
                                         "--limit", "ranks=20"]))
    assert "--limit ranks is given twice" in text


# ----------------------------------------------------------------- values checked on entry
@pytest.mark.parametrize("values, message", [
    ([True, 2], "the value True is not valid for parallel.tensor_model_parallel_size: "
                "expected a number, got the boolean true"),
    ([2.5, 4], "the value 2.5 is not valid"),
    ([[1, 2], 4], "the value [1, 2] is not valid"),
    (["x", 2], "the value 'x' is not valid"),
    ([None, 2], "the value None is not valid"),
])
def test_search_axis_values_go_through_the_field_validator(values, message):
    with pytest.raises(ConfigError) as err:
        ddlsim.search(SEARCH, {"parallel.tensor_model_parallel_size": values}, top=0)
    assert "search.axes.parallel.tensor_model_parallel_size" in str(err.value)
    assert message in str(err.value)


def test_search_axis_booleans_on_the_command_line_are_refused():
    text = one_error(runner.invoke(app, ["search", SEARCH, "--axis",
                                         "parallel.tensor_model_parallel_size=true,2"]))
    assert "boolean" in text


@pytest.mark.parametrize("change, message", [
    ({"iteration_time_s": 0}, "iteration_time_s = 0"),
    ({"iteration_time_s": -1.0}, "iteration_time_s = -1.0"),
    ({"breakdown": {"compute_s": -3.0}}, "breakdown.compute_s = -3.0"),
])
def test_compare_validates_saved_results(tmp_path, change, message):
    saved = tmp_path / "r.json"
    res = runner.invoke(app, ["predict", WIKI, "-f", "json", "-o", str(saved)])
    assert res.exit_code == 0, res.output
    data = json.loads(saved.read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    text = one_error(runner.invoke(app, ["compare", str(saved), str(bad)]))
    assert message in text and "bad.json" in text


# ------------------------------------------------------------------ no output over an input
@pytest.mark.parametrize("command", [
    ["predict", "{c}", "-o", "{c}"],
    ["predict", "{c}", "--plot", "{c}"],
    ["comm", "{c}", "-o", "{c}"],
    ["sweep", "{c}", "--set-range", "train.micro_batch_size=1,2", "-o", "{c}"],
    ["compare", "{c}", "{c}", "-o", "{c}"],
    ["calibrate", "fit", "{c}", "-o", "{c}"],
    ["calibrate", "show", "{c}", "--plot", "{c}"],
])
def test_no_output_overwrites_an_input_even_with_force(tmp_path, command):
    config = tmp_path / "c.yaml"
    shutil.copy(WIKI, config)
    text = config.read_text().replace("../", str(Path.cwd()) + "/")
    config.write_text(text)
    args = [a.format(c=config) for a in command] + ["--force"]
    message = one_error(runner.invoke(app, args))
    assert "never writes over its own input" in message
    assert config.read_text() == text


def test_an_output_that_is_a_link_to_the_input_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    shutil.copy(WIKI, config)
    link = tmp_path / "link.yaml"
    link.symlink_to(config)
    message = one_error(runner.invoke(app, ["predict", str(config), "-o", str(link),
                                            "--force"]))
    assert "never writes over its own input" in message


# --------------------------------------------------------------- options and readers
@pytest.mark.parametrize("args, option", [
    (["predict", WIKI, "-o", "a.json", "-o", "b.json"], "-o/--output"),
    (["predict", WIKI, "--model=gpt2", "--model", "llama-2-7b"], "--model"),
    (["calibrate", "fit", "x.csv", "-o", "a.yaml", "--output", "b.yaml"], "-o/--output"),
])
def test_an_option_taking_one_value_given_twice_is_refused(args, option):
    text = one_error(runner.invoke(app, args))
    assert text == f"error: {option} is given twice; it takes one value, so give it once"
    assert not Path("a.json").exists() and not Path("b.json").exists()


def test_short_help_is_accepted():
    for args in (["-h"], ["predict", "-h"], ["calibrate", "fit", "-h"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and "Usage" in res.output, args


MPIP_HEAD = ("@--- Callsite Message Sent statistics (all, sent bytes) ----\n---------\n"
             "Name Site Rank Count Max Mean Min Sum\n")


@pytest.mark.parametrize("rows, message", [
    ("Allreduce 1 0 10 1 1 1 nan\n", "Sum nan is not a finite number >= 0"),
    ("Allreduce 1 0 10 1 1 1 -inf\n", "Sum -inf is not a finite number >= 0"),
    ("Allreduce 1 0 99999999999999999999 1 1 1 1\n", "is not between 0 and 2^53"),
    ("Allreduce 1 -3 1 1 1 1 1\n", "Rank -3 is not between 0"),
])
def test_mpip_lines_out_of_range_are_refused_naming_the_line(tmp_path, rows, message):
    report = tmp_path / "r.mpip"
    report.write_text(MPIP_HEAD + rows)
    text = one_error(runner.invoke(app, ["comm", WIKI, "--diff-mpip", str(report)]))
    assert message in text and "cannot read the line" in text


def test_an_mpip_section_with_no_rows_is_a_diff_not_a_crash(tmp_path):
    report = tmp_path / "r.mpip"
    report.write_text(MPIP_HEAD)
    res = runner.invoke(app, ["comm", WIKI, "--diff-mpip", str(report)])
    assert res.exit_code == 1 and "rows differ" in res.output


# ------------------------------------------------------------------ what a person reads
def test_a_sweep_shows_values_as_typed_and_keeps_si_in_the_frame():
    from ddlsim.sweepreport import sweep_table
    from rich.console import Console

    frame = ddlsim.sweep(WIKI, {"system.nic.bandwidth_Bps": ["200 Gb/s", "400 Gb/s"]})
    assert list(frame["system.nic.bandwidth_Bps"]) == [2.5e10, 5e10]  # SI: B/s
    console = Console(width=80, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(sweep_table(frame, ["system.nic.bandwidth_Bps"], 80))
    text = console.export_text()
    assert "200 Gb/s" in text and "400 Gb/s" in text and "GB/s" not in text


def test_sweep_tables_fit_80_columns_without_wrapping():
    res = runner.invoke(app, ["sweep", WIKI, "--set-range",
                              "system.nic.bandwidth_Bps=200,400 Gb/s", "--set-range",
                              "parallel.dp_strategy=ddp,reduce_scatter", "--engine", "both",
                              "--width", "80"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [ln for ln in lines if "Gb/s" in ln]
    assert len(rows) == 8 and all("…" not in ln for ln in rows)  # one line a row, nothing cut
    assert "tokens/s left out at 80 columns" in res.output


def test_search_tables_explain_every_abbreviation_and_name_the_currency():
    from ddlsim.search import report

    frame = ddlsim.search(SEARCH, {"parallel.tensor_model_parallel_size": [4, 8],
                                   "parallel.pipeline_model_parallel_size": [8],
                                   "parallel.virtual_pipeline_model_parallel_size": [None, 6],
                                   "train.recompute": ["none", "selective", "full"],
                                   "parallel.sequence_parallel": [False, True]},
                          objective="cost", price_per_gpu_hour=2.0, currency="EUR", top=0)
    text = report.legend(frame, exact=True, front=True)
    for words in ("PP8×6 8 stages of 6 virtual stages", "b micro-batch size", "Z ZeRO stage",
                  "SP sequence parallelism", "none/sel/full recomputation",
                  "EUR/Mtok cost of a million tokens at 2 EUR per GPU-hour", "exact Δ",
                  "* on the Pareto front"):
        assert words in text, words
    labels = {report.plan_label(r) for r in frame.to_dict(orient="records")}
    assert all(label.split()[-1] in ("none", "sel", "full") for label in labels)


def test_search_files_hold_the_plan_in_words(tmp_path):
    out = tmp_path / "plans.csv"
    res = runner.invoke(app, ["search", SEARCH, "--axis", "parallel.tensor_model_parallel_size=4,8",
                              "--axis", "parallel.pipeline_model_parallel_size=8,16",
                              "--top", "0", "-o", str(out), "--width", "80"])
    assert res.exit_code == 0, res.output
    import pandas as pd

    frame = pd.read_csv(out)
    assert frame["plan"].str.startswith("TP").all() and "plan_index" in frame
    assert frame["plan"].str.contains(" mbs").all()
    assert max(map(len, res.output.splitlines())) <= 80
    assert "*" in res.output.splitlines()[1]  # the Pareto column survives 80 columns


def test_a_result_shows_itself_compactly_and_as_html():
    r = ddlsim.predict(WIKI)
    text = repr(r)
    assert text.startswith("<Result analytical: ") and len(text) < 200 and "\n" not in text
    assert "9 ranks" in text and "gpt2-124m on cpu-10gbe" in text
    html = r._repr_html_()
    assert len(html) < 3000 and "<table>" in html and "display:flex" in html
    from ddlsim.simulator.result_html import breakdown_parts

    shares = [s for _, s in breakdown_parts(r)]
    assert abs(sum(shares) - r.iteration_time_s) <= 1e-9 * r.iteration_time_s
    assert r.to_frame().shape[0] == 1


def test_presets_read_at_80_columns():
    res = runner.invoke(app, ["presets", "model"], terminal_width=80)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(map(len, lines)) <= 80 and not any("│" in ln for ln in lines)
    assert "  gpt2-124m" in [ln.rstrip() for ln in lines]
    assert any(ln.startswith("    source: ") for ln in lines)


def test_des_progress_prints_lines_off_a_terminal():
    import io

    from ddlsim.simulator.des.progress import ConsoleProgress

    buf = io.StringIO()  # not a terminal: a pipe or a CI log
    p = ConsoleProgress(buf)
    p._t0, p._estimate = time.perf_counter() - 5.0, 50.0  # 5 s into a 50 s run
    p.update(1.5, 1000)
    p.update(1.6, 1100)  # the next line is due a tenth of the estimate later
    p.stop()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("DES: 5 s elapsed of an estimated 50 s")
    assert "simulated 1.500 s, 1,000 events" in lines[0]


def test_search_verify_des_over_budget_names_an_option_search_has():
    args = ["search", SEARCH, "--axis", "parallel.tensor_model_parallel_size=8", "--axis",
            "parallel.pipeline_model_parallel_size=16", "--top", "1", "--verify", "des"]
    text = one_error(runner.invoke(app, [*args, "--limit", "des_rank_ops=1000"]))
    assert "--limit des_rank_ops=" in text
    assert "--limit" in runner.invoke(app, ["search", "--help"]).output


@pytest.mark.parametrize("spec, message", [
    ("true,2", "the value True is not valid"),
    ("2.5,4", "the value 2.5 is not valid"),
])
def test_sweep_ranges_go_through_the_field_validator(spec, message):
    text = one_error(runner.invoke(app, ["sweep", WIKI, "--set-range",
                                         f"parallel.tensor_model_parallel_size={spec}"]))
    assert message in text and "the range of 'parallel.tensor_model_parallel_size'" in text


def test_a_plan_on_half_the_system_or_less_is_said_not_silent():
    res = runner.invoke(app, ["predict", "examples/gpt3-175b-1024-a100.yaml", "-f", "csv",
                              "--allow-oom", "--set", "parallel.pipeline_model_parallel_size=8"])
    assert res.exit_code == 0, res.output
    assert "the plan runs on 512 of the system's 1,024 devices" in res.output


def test_sweep_and_search_frames_show_compact_html():
    sweep = ddlsim.sweep(WIKI, {"system.nic.bandwidth_Bps": ["10 Gb/s", "100 Gb/s"]})
    html = sweep._repr_html_()
    assert "10 Gb/s" in html and "display:flex" in html and html.count("<tr>") == 3
    plain = sweep.to_frame()
    assert type(plain).__name__ == "DataFrame" and plain.attrs == sweep.attrs
    assert list(plain["iteration_time_s"]) == list(sweep["iteration_time_s"])
    search = ddlsim.search(SEARCH, {"parallel.tensor_model_parallel_size": [4, 8],
                                    "parallel.pipeline_model_parallel_size": [8, 16]}, top=0)
    html = search._repr_html_()
    assert "<th>Pareto</th>" in html and " mbs" in html and len(html) < 20_000


@pytest.mark.parametrize("args", [
    ["sweep", WIKI, "--set-range", "train.micro_batch_size=1", "--dask", "local",
     "--dask-workers", "99999999999999999999"],
    ["calibrate", "fit", "tests/calibration/data/nccl_all_reduce_perf.txt", "-o",
     "never-written.yaml", "--bootstrap", "99999999999999999999"],
])
def test_worker_and_resample_counts_are_bounded_before_they_start(args):
    res, took = run_cli(*args)
    text = one_error(res)
    assert "99999999999999999999" in text or "~10^20" in text
    assert took < 5.0 and not Path("never-written.yaml").exists()

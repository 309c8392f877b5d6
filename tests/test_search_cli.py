"""``ddlsim search`` and ``ddlsim.search(...)``: outputs, refusals in one paragraph, the
search: section read only by the search command."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.errors import ConfigError

runner = CliRunner()
EXAMPLE = "examples/search-gpt3-175b-1024.yaml"
SMALL = """\
model: gpt3-1.3b
parallel: {tensor_model_parallel_size: 2}
train: {micro_batch_size: 1, global_batch_size: 16, seq_length: 1024}
system: {preset: dgx-a100, nodes: 1}
search:
  axes:
    parallel.tensor_model_parallel_size: [1, 2, 4]
    parallel.pipeline_model_parallel_size: "1:4:*2"
    train.recompute: [none, full]
  top: 3
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "search.yaml"
    path.write_text(SMALL)
    return path


def _one_paragraph_error(r, *fragments):
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error: "), text
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for fragment in fragments:
        assert fragment in text, text
    return text


def test_python_api_is_the_callable_subpackage(small):
    frame = ddlsim.search(small)
    assert isinstance(frame, pd.DataFrame)
    from ddlsim.search import evaluate_grid, search  # the subpackage's parts import too
    assert callable(evaluate_grid) and search.__module__ == "ddlsim.search.run"
    # 3 TP × 3 PP × 2 recompute = 18 plans on 8 GPUs, all valid for gpt3-1.3b (24 layers)
    assert frame.attrs["total"] == 18 and len(frame) + sum(frame.attrs["rejected"].values()) == 18
    assert frame["rank"].tolist() == list(range(1, len(frame) + 1))
    assert frame["iteration_time_s"].is_monotonic_increasing
    assert frame["exact_iteration_time_s"].notna().sum() == 3
    assert (frame["exact_error"].dropna().abs() < 0.03).all()


def test_arguments_replace_the_section(small):
    frame = ddlsim.search(small, {"train.micro_batch_size": [1, 2]}, top=0, objective="mfu")
    assert frame.attrs["total"] == 2 and "exact_iteration_time_s" not in frame
    assert frame["mfu"].is_monotonic_decreasing


def test_cli_writes_csv_and_plot_and_refuses_to_overwrite(small, tmp_path):
    out, plot = tmp_path / "plans.csv", tmp_path / "pareto.png"
    r = runner.invoke(app, ["search", str(small), "--top", "2", "-o", str(out), "--plot",
                            str(plot)])
    assert r.exit_code == 0, r.output
    assert "18 plans:" in r.stdout and "Pareto front" in r.stdout
    frame = pd.read_csv(out)
    assert len(frame) == len(ddlsim.search(small, top=0))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = runner.invoke(app, ["search", str(small), "-o", str(out)])
    _one_paragraph_error(again, "--force")
    assert runner.invoke(app, ["search", str(small), "-o", str(out), "--force"]).exit_code == 0


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow installed")
def test_parquet_without_pyarrow_suggests_csv(small, tmp_path):
    r = runner.invoke(app, ["search", str(small), "-o", str(tmp_path / "p.parquet")])
    _one_paragraph_error(r, "pyarrow", "p.csv")


def test_the_shipped_example_runs(tmp_path):
    r = runner.invoke(app, ["search", EXAMPLE, "--top", "3", "-o", str(tmp_path / "p.csv")])
    assert r.exit_code == 0, r.output
    assert "13,440 plans" in r.stdout and "rejected" in r.stdout


def test_predict_refuses_a_search_section_rather_than_ignore_it():
    r = runner.invoke(app, ["predict", EXAMPLE])
    _one_paragraph_error(r, "section 'search'", "ddlsim search")


@pytest.mark.parametrize("section, fragments", [
    ("{axes: {parallel.tensor_model_parallel_size: [1]}, objective: speed}",
     ["search.objective", "speed"]),
    ("{axez: {}}", ["search.axez is not a field", "did you mean 'axes'"]),
    ("{objective: cost}", ["price_per_gpu_hour"]),
    ("{axes: {system.nodes: [1, 2]}}", ["not a parallel.*, train.* or model.* field"]),
    ("{axes: {parallel.tensor_size: [1, 2]}}", ["cannot vary", "tensor_size"]),
    ("{axes: {train.micro_batch_size: '4:1'}}", ["ends (1) before it starts (4)"]),
    ("{constraints: {max_gpu: 8}}", ["search.constraints.max_gpu is not a field",
                                     "max_gpus"]),
    ("{axes: {train.global_batch_size: [8, 16]}, constraints: {global_batch_size: 16}}",
     ["fixes it"]),
])
def test_bad_sections_are_one_paragraph(tmp_path, section, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(SMALL.split("search:")[0] + f"search: {section}\n")
    _one_paragraph_error(runner.invoke(app, ["search", str(path)]), *fragments)


def test_moe_models_are_searched_by_the_exact_engine():
    """A Mixture-of-Experts model has no vectorised tier: its plans are predicted one by one
    (ddlsim/search/exact.py), the frame says so."""
    config = {"model": "mixtral-8x7b", "parallel": {},
              "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
              "system": {"preset": "dgx-h100", "nodes": 1}}
    frame = ddlsim.search(config, {"parallel.tensor_model_parallel_size": [4, 8]}, top=1)
    assert frame.attrs["tier"] == "exact" and len(frame) + sum(frame.attrs["rejected"].values()) == 2


@pytest.mark.parametrize("args, fragment", [
    (["--verify", "exact"], "--verify 'exact'"),
    (["--objective", "speed"], "--objective 'speed'"),
    (["--dask-workers", "2"], "--dask-workers applies only with --dask local"),
    (["--force"], "no output file is named"),
])
def test_bad_options_are_refused(small, args, fragment):
    _one_paragraph_error(runner.invoke(app, ["search", str(small), *args]), fragment)


def test_verify_des_adds_the_des_time(small):
    """One node, no NIC to share: the DES of the best plan is within 10 % of the analytical
    engine (docs/engines.md, agreement of the two engines)."""
    frame = ddlsim.search(small, {"parallel.tensor_model_parallel_size": [2, 4]}, top=1,
                          verify="des")
    des, exact = frame["des_iteration_time_s"].iloc[0], frame["exact_iteration_time_s"].iloc[0]
    assert abs(des / exact - 1) < 0.10
    assert frame["des_iteration_time_s"].iloc[1:].isna().all()


def test_a_data_parallel_size_the_config_writes_is_kept_not_derived(tmp_path):
    """Without a DP axis the search derives DP to fill the devices; a DP the base config writes
    is the user's and is kept (a one-value axis), not silently replaced."""
    path = tmp_path / "search.yaml"
    path.write_text(SMALL.replace("parallel: {tensor_model_parallel_size: 2}",
                                  "parallel: {tensor_model_parallel_size: 2, "
                                  "data_parallel_size: 2}"))
    frame = ddlsim.search(path, top=0)
    assert len(frame) and (frame["parallel.data_parallel_size"] == 2).all()
    assert (frame["gpus"] == 2 * frame["parallel.tensor_model_parallel_size"]
            * frame["parallel.pipeline_model_parallel_size"]).all()

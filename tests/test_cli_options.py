"""No silently ignored option, no traceback: every misuse is one ``error:`` paragraph, exit 2."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app

runner = CliRunner()
GPT3 = "examples/gpt3-175b-1024-a100.yaml"
WIKI = "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml"
OOM = ["--set", "system.nodes=1", "--set", "parallel.pipeline_model_parallel_size=1",
       "--set", "parallel.data_parallel_size=1", "--set", "train.global_batch_size=8"]


def _refused(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error: ") and message in text, text
    assert "Traceback" not in r.output and r.stdout == ""
    return text


@pytest.mark.parametrize("args, message", [
    (["predict", WIKI, "--trace", "t.json"], "--trace needs --engine des or --engine both"),
    (["predict", WIKI, "--links", "3"], "--links needs --engine des or --engine both"),
    (["predict", WIKI, "--links", "0"], "--links needs --engine des"),
    (["predict", WIKI, "--engine", "des", "--links", "-3"], "--links -3 is negative"),
    (["predict", WIKI, "--engine", "des", "--links", "3", "-f", "json"],
     "only --format table prints"),
    (["predict", WIKI, "--backend", "nccl"], "--backend needs --calibration"),
    (["predict", WIKI, "--format", "xml"], "--format 'xml' is not allowed"),
    (["predict", WIKI, "--engine", "fast"], "--engine 'fast' is not allowed"),
    (["predict", WIKI, "--engine", "both", "--timeline", "t.png"],
     "--timeline draws one engine's timeline"),
    (["presets", "gadgets"], "section 'gadgets' is not allowed"),
    (["compare", WIKI], "compare needs two runs or more"),
    (["compare", WIKI, GPT3, "--label", "a"], "--label was given 1 time(s) for 2 inputs"),
    (["compare", WIKI, GPT3, "--label", "a", "--label", "a"], "must differ"),
    (["compare", WIKI, GPT3, "--backend", "nccl"], "--backend needs --calibration"),
    (["compare", WIKI, GPT3, "--engine", "x"], "--engine 'x' is not allowed"),
    (["topology", "show", "cpu-10gbe", "--force"], "--force applies to the --draw file"),
])
def test_misused_options_are_refused(args, message):
    _refused(args, message)


@pytest.mark.parametrize("content", [
    b"\xff\xfeh\x00i\x00",              # UTF-16
    b"model: \xe9t\xe9\n",              # Latin-1
    b"\x7fELF\x00\x00\x01",             # binary
    b"a: &a [*a, *a]\n" * 2,            # recursive YAML alias
    b"model: [1, 2\n",                  # broken YAML
    b"- just\n- a list\n",              # not a mapping
])
def test_unreadable_configs_are_one_paragraph(tmp_path, content):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    for args in (["predict", str(path)], ["compare", str(path), str(path)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith("error: ") and "Traceback" not in r.output
        assert "\n\n" not in r.stderr.strip()


def test_directory_and_missing_config(tmp_path):
    for args in (["predict", str(tmp_path)], ["predict", str(tmp_path / "nope.yaml")],
                 ["topology", "show", str(tmp_path / "nope.yaml")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and r.stderr.startswith("error: "), r.output


def test_an_internal_error_is_a_paragraph_not_a_traceback(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr("ddlsim.api.predict", broken)
    r = runner.invoke(app, ["predict", WIKI])
    assert r.exit_code == 3 and "internal error (RuntimeError: boom)" in r.stderr
    assert "Traceback" not in r.output


def test_warnings_are_printed_one_line_each_and_never_lost(monkeypatch):
    real = ddlsim.api.predict

    def warning_predict(*a, **k):
        warnings.warn("bandwidth_Bps = 200 B/s is implausibly low", UserWarning)
        warnings.warn("bandwidth_Bps = 200 B/s is implausibly low", UserWarning)
        warnings.warn("micro-batches\nare many", UserWarning)
        return real(*a, **k)
    monkeypatch.setattr("ddlsim.api.predict", warning_predict)
    r = runner.invoke(app, ["predict", WIKI, "-f", "json"])
    assert r.exit_code == 0
    assert r.stderr.splitlines() == ["warning: bandwidth_Bps = 200 B/s is implausibly low",
                                     "warning: micro-batches are many"]
    json.loads(r.stdout)  # warnings never go into the JSON on stdout


def test_warnings_before_an_error_are_printed_before_it(monkeypatch):
    def failing_predict(*a, **k):
        warnings.warn("latency_s = 2 s is unusual", UserWarning)
        raise ddlsim.ConfigError("system.nic.bandwidth_Bps = 0 is not allowed")
    monkeypatch.setattr("ddlsim.api.predict", failing_predict)
    r = runner.invoke(app, ["predict", WIKI])
    assert r.exit_code == 2
    assert r.stderr.splitlines() == ["warning: latency_s = 2 s is unusual",
                                     "error: system.nic.bandwidth_Bps = 0 is not allowed"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    r = runner.invoke(app, [flag])
    assert r.exit_code == 0 and r.stdout == f"ddlsim {ddlsim.__version__}\n"


def test_out_of_memory_without_and_with_allow_oom():
    text = _refused(["predict", GPT3, *OOM], "does not fit in memory")
    assert "zero_stage = 4" not in text and "--allow-oom" in text
    r = runner.invoke(app, ["predict", GPT3, *OOM, "--allow-oom", "-f", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["fits"] is False
    r = runner.invoke(app, ["predict", GPT3, *OOM, "--allow-oom"])
    assert r.exit_code == 0 and "DOES NOT FIT" in r.stdout
    assert json.loads(runner.invoke(app, ["predict", WIKI, "-f", "json"]).stdout)["fits"] is True


def test_output_checked_before_the_run(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text("keep me")
    monkeypatch.setattr("ddlsim.api.predict", lambda *a, **k: pytest.fail("ran anyway"))
    _refused(["predict", WIKI, "-o", str(out)], "already exists; pass --force")
    _refused(["predict", WIKI, "--engine", "des", "--trace", str(out)], "already exists")
    _refused(["predict", WIKI, "-o", str(tmp_path)], "is a directory")
    _refused(["predict", WIKI, "-o", str(tmp_path / "x"), "--plot", str(tmp_path / "x")],
             "--plot and --output name the same file")
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("command", [["predict"], ["compare", WIKI], ["topology", "show"],
                                     ["calibrate", "show"], ["calibrate", "fit", "-o", "x.yaml"]])
@pytest.mark.parametrize("content", [None, b"\x7fELF\x00\x01\x02", b"\xd0\xcf\x11\xe0 caf\xe9"])
def test_every_command_answers_unreadable_input_with_exit_2(tmp_path, command, content):
    path = tmp_path / "in.yaml"
    if content is None:
        path = tmp_path            # a directory
    else:
        path.write_bytes(content)
    r = runner.invoke(app, [*command, str(path)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (["predict", WIKI, "--force"], "--force lets an output file be replaced, but no output"),
    (["compare", WIKI, GPT3, "--force"], "no output file is named (-o, --plot)"),
    (["calibrate", "show", "ddlsim/data/calibration/dgx-a100.yaml", "--force"],
     "--force applies to the --plot file"),
    (["calibrate", "compute", "--max-seq", "64"], "--max-seq applies to the attention"),
    (["calibrate", "compute", "--reps", "-1"], "--reps -1 is negative"),
    (["calibrate", "fit", "x.csv", "-o", "p.yaml", "--bootstrap", "-5"], "--bootstrap -5"),
    (["topology", "show", "cpu-10gbe", "--nodes", "-2"], "--nodes -2 is negative"),
    (["calibrate", "fit", "x.csv", "-o", "p.yaml", "--bootstrap", "0", "--seed", "3"],
     "--seed seeds the bootstrap"),
    (["calibrate", "fit", "x.csv", "-o", "p.yaml", "--format", "ddlsim", "--ranks", "8"],
     "--ranks describe(s) nccl-tests or OSU files"),
])
def test_options_that_would_be_ignored_or_negative_are_refused(args, message):
    _refused(args, message)


@pytest.mark.parametrize("args, message", [
    (["predict", "--bogus", GPT3], "ddlsim predict: no such option: --bogus (`ddlsim predict -h`"),
    (["predikt"], "no such command 'predikt'. Did you mean 'predict'?"),
    (["predict"], "ddlsim predict: missing argument 'config'"),
    (["predict", GPT3, "--links", "abc"], "invalid value for '--links'"),
    (["calibrate", "fit"], "ddlsim calibrate fit: missing argument"),
    (["presets", "system", "dgx-a100", "extra"], "got unexpected extra argument"),
])
def test_a_command_line_click_cannot_parse_is_one_paragraph(args, message):
    """Not click's usage box: one ``error:`` line naming the command, exit 2."""
    r = runner.invoke(app, args, prog_name="ddlsim")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "╭" not in r.output


def test_presets_with_a_name_print_that_preset_in_full_as_yaml():
    import yaml

    system = yaml.safe_load(runner.invoke(app, ["presets", "system", "dgx-a100"]).stdout)
    assert system["dgx-a100"]["device"]["name"] == "A100-SXM4-80GB"
    r = runner.invoke(app, ["presets", "model", "meta-llama/Meta-Llama-3-70B"])
    assert r.stdout.startswith("# meta-llama-3-70b: 80 layers")
    assert yaml.safe_load(r.stdout)["meta-llama-3-70b"]["num_key_value_heads"] == 8
    stack = yaml.safe_load(runner.invoke(app, ["presets", "software", "torchtitan-2025"]).stdout)
    assert stack["torchtitan-2025"]["kernels"]["attention"]["source"]
    _refused(["presets", "software", "megatron"], "'megatron' is not a known software stack (did you mean")
    _refused(["presets", "system", "dgx-b200"], "system preset 'dgx-b200' does not exist")


@pytest.mark.parametrize("args, message", [
    (["predict", GPT3, "--json"], "no such option: --json; it is written --format json"),
    (["predict", GPT3, "--des"], "no such option: --des; it is written --engine des"),
    (["predict", GPT3, "--gpus", "8"], "no such option: --gpus; it is written --set "
                                       "system.nodes=N"),
    (["predict", GPT3, "--tp", "2"], "no such option: --tp; it is written --set "
                                     "parallel.tensor_model_parallel_size=N"),
    (["predict", "--config", GPT3], "no such option: --config; it is written as the first "
                                    "argument"),
    (["search", GPT3, "--json"], "no such option: --json; it is written --format json"),
])
def test_another_tools_option_is_refused_saying_how_ddlsim_writes_it(args, message):
    _refused(args, message)


def test_an_option_the_command_lacks_gets_no_hint_naming_it():
    text = _refused(["search", GPT3, "--des"], "no such option: --des")
    assert "--engine" not in text, text   # ddlsim search has no --engine


@pytest.mark.parametrize("name, section", [
    ("llama-3.1-8b", "model"), ("meta-llama/Llama-3.1-8B", "model"), ("dgx-h100", "system"),
])
def test_a_preset_named_for_the_config_says_how_a_config_names_it(name, section):
    text = _refused(["predict", name], f"config file {name!r} does not exist; {name!r} is a "
                                       f"{section} preset: a run config names it")
    assert f"--set {section}={name}" in text, text


def test_a_missing_config_that_names_no_preset_is_only_missing():
    text = _refused(["predict", "no-such-model"], "config file 'no-such-model' does not exist")
    assert "preset" not in text, text

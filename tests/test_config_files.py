"""Reading run-config files: every unreadable, malformed or hostile file is one ConfigError
paragraph naming the file (and the line where there is one), found fast, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddlsim
from ddlsim.errors import ConfigError, DDLSimError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = (ROOT / "examples" / "gpt3-175b-1024-a100.yaml").read_text()


def _bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": level i lists ``width`` aliases of level i-1 (width**levels)."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nmodel: *l{levels - 1}\n"


BAD_FILES = {
    "utf16.yaml": (EXAMPLE.encode("utf-16"), "UTF-16 text"),
    "latin1.yaml": (("# café\n" + EXAMPLE).encode("latin-1"), "not UTF-8 text"),
    "binary.yaml": (bytes(range(256)), "binary file"),
    # level i (line i+1) expands to 9**(i+1) strings: 9**5 = 59,049 > 20,000 first on line 5
    "bomb.yaml": (_bomb().encode(), "line 5: expands to more than 20,000 values"),
    "deep.yaml": (("model: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
                  "line 1: nested more than 50 levels deep"),
    "deepmap.yaml": (("model:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80))).encode(),
                     "nested more than 50 levels deep"),
    "recursive.yaml": (b"model: &a [*a]\n", "contains it; recursive documents"),
    "dup.yaml": ((EXAMPLE + "train: {micro_batch_size: 2}\n").encode(),
                 "line 18: duplicate key 'train' (first given on line 9)"),
    "dupflow.yaml": (b"model: {a: 1, a: 2}\n", "line 1: duplicate key 'a'"),
    "syntax.yaml": (b"model: [unclosed\ntrain: 1\n", "line 2: not valid YAML"),  # the ':'

    "list.yaml": (b"- model\n- train\n", "the file holds a list"),
    "scalar.yaml": (b"42\n", "the file holds a number"),
    "empty.yaml": (b"", "the file holds null"),
    "twodocs.yaml": (b"a: 1\n---\nb: 2\n", "expected a single document"),
    "tag.yaml": (b"model: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    "dup.json": (b'{"model": "gpt3-175b",\n "model": "gpt2-124m"}', "duplicate key 'model'"),
    "nan.json": (b'{"model": {"hidden_size": NaN}}', "NaN is not a number JSON allows"),
    "inf.json": (b'{"model": {"hidden_size": -Infinity}}', "-Infinity is not a number"),
    "e400.json": (b'{"model": {"hidden_size": 1e400}}', "1e400 is too large"),
    "syntax.json": (b'{"model": \n ', "line 2: not valid JSON: Expecting value (column 2)"),
    "deep.json": (b"[" * 100 + b"]" * 100, "nested more than 50 levels deep"),
    "big.json": (b"[" + b"0," * 30_000 + b"0]", "holds more than 20,000 values"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_is_one_config_error_naming_the_file(tmp_path, name):
    data, expected = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        ddlsim.load_config(path)
    assert time.perf_counter() - start < 2.0
    message = str(err.value)
    assert str(path) in message and expected in message and "\n" not in message


def test_alias_bomb_is_refused_in_milliseconds(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(levels=12, width=12))  # 12**12 ≈ 9·10^12 strings if expanded
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="through aliases"):
        ddlsim.load_config(path)
    assert time.perf_counter() - start < 0.5


def test_a_few_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "anchors.yaml"
    text = ("model: gpt3-175b\n"
            "parallel: {tensor_model_parallel_size: 8, pipeline_model_parallel_size: 16}\n"
            "train: {micro_batch_size: 1, global_batch_size: 1536, seq_length: 2048}\n"
            "system:\n  preset: dgx-a100\n  nodes: 128\n"
            "  nic: {<<: &nic {bandwidth_Bps: 100 Gb/s, latency_s: 5 us}, latency_s: 2 us}\n"
            "  intra_node: {<<: *nic, bandwidth_Bps: 300 GB/s}\n")
    path.write_text(text)
    cfg = ddlsim.load_config(path)
    assert cfg.system.nic.bandwidth_Bps == pytest.approx(100e9 / 8)
    assert cfg.system.nic.latency_s == pytest.approx(2e-6)  # an explicit key wins over <<
    assert cfg.system.intra_node.latency_s == pytest.approx(5e-6)  # the alias copies the anchor


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo"])
def test_paths_that_are_not_regular_files(tmp_path, kind):
    path = tmp_path / "cfg.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:  # a FIFO must not block the read
        ddlsim.load_config(path)
    assert time.perf_counter() - start < 2.0
    expected = {"missing": "does not exist", "directory": "is a directory",
                "fifo": "is a FIFO"}[kind]
    assert expected in str(err.value) and str(path) in str(err.value)


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (5 * 2**20) + "\n")
    with pytest.raises(ConfigError, match="more than the 4,194,304 allowed"):
        ddlsim.load_config(path)


def test_numbers_written_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 1e9 as a string; ddlsim reads it as a number (as YAML 1.2 and JSON do),
    so 1e9 layers is refused by its bound rather than accepted as an odd string."""
    path = tmp_path / "exp.yaml"
    path.write_text(EXAMPLE.replace("global_batch_size: 1536", "global_batch_size: 1.536e3"))
    assert ddlsim.load_config(path).train.global_batch_size == 1536
    path.write_text(EXAMPLE.replace("global_batch_size: 1536", "global_batch_size: 1536e0"))
    assert ddlsim.load_config(path).train.global_batch_size == 1536


@pytest.mark.parametrize("replace, expected", [
    (("nodes: 128", "nodes: 1e9"), "system.nodes: 1,000,000,000 is above the plausible maximum"),
    (("global_batch_size: 1536", "global_batch_size: 1e30"),
     "train.global_batch_size: 1e+30 is above the plausible maximum 1,000,000,000"),
    (("global_batch_size: 1536", "global_batch_size: .inf"), "train.global_batch_size: inf is"),
    (("nodes: 128", "nodes: 128\n  network: {oversubscription: .inf}"),
     "system.network.oversubscription: Input should be a finite number"),
    (("nodes: 128", "nodes: 128\n  network: {oversubscription: .nan}"),
     "system.network.oversubscription: Input should be a finite number"),
    (("nodes: 128", "nodes: 128\n  nic: {latency_s: 1e400 s}"), "'1e400 s' is not a finite time"),
    (("nodes: 128", "nodes: 128\n  nic: {bandwidth_Bps: inf Gb/s}"),
     "cannot read 'inf Gb/s' as a bandwidth"),
    (("nodes: 128", "nodes: 128\n  nic: {bandwidth_Bps: .inf}"), "inf is not a finite bandwidth"),
    (("model: gpt3-175b", "model: {preset: gpt3-175b, hidden_size: true}"),
     "model.hidden_size: expected a number, got the boolean true"),
    (("sequence_parallel: false", "sequence_parallel: 0"), "parallel.sequence_parallel"),
    (("nodes: 128", "nodes: 128\n  nic: {bandwidth_Bps: true}"), "got True"),
])
def test_strict_values_in_files(tmp_path, replace, expected):
    text = EXAMPLE.replace(*replace) if replace[0] in EXAMPLE else EXAMPLE.replace(
        "schedule: 1f1b", "schedule: 1f1b\n  " + replace[1])
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        ddlsim.load_config(path)
    assert expected in str(err.value)


def test_cli_prints_one_paragraph_and_exits_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    run = subprocess.run([sys.executable, "-m", "ddlsim.cli", "predict", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"})
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert run.stderr.startswith("error: ") and "through aliases" in run.stderr
    assert run.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("name", ["missing.yaml", "utf16.yaml", "dup.yaml"])
def test_topology_show_reads_files_as_strictly(tmp_path, name):
    from ddlsim.topologies.cli import read_spec

    if name in BAD_FILES:
        (tmp_path / name).write_bytes(BAD_FILES[name][0])
    with pytest.raises(DDLSimError):
        read_spec(str(tmp_path / name))


_YAMLISH = st.text(alphabet=list("abmodelsytrain:{}[],&*!|>-'\"#\n 0123456789.e") + ["\t", "\u00b5"],
                   max_size=120)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(text=_YAMLISH, as_json=st.booleans())
def test_any_text_gives_a_config_or_a_ddlsim_error(tmp_path, text, as_json):
    path = tmp_path / ("cfg.json" if as_json else "cfg.yaml")
    path.write_text(text, encoding="utf-8")
    try:
        ddlsim.load_config(path)
    except DDLSimError:
        pass


def test_check_topology_refuses_before_building():
    from ddlsim.errors import WorkTooLargeError
    from ddlsim.limits import check_topology
    from ddlsim.topologies.spec import parse_spec

    spec = parse_spec({"preset": "dgx-a100", "nodes": 100_000})
    with pytest.raises(WorkTooLargeError, match="--limit topology_links="):
        check_topology(spec)


@pytest.mark.parametrize("text, message", [
    ("model: " + "[" * 2_000_000 + "]" * 2_000_000, "line 1: nested more than 50 levels deep"),
    ("model: [" + "0," * 1_000_000 + "]", "holds more than 20,000 values"),
    # the root mapping, then key and value of each line: value 20,001 is on line 10,000
    ("".join(f"k{i}: {i}\n" for i in range(200_000)), "line 10000: holds more than 20,000"),
], ids=["brackets", "flow-list", "block-mapping"])
def test_large_documents_within_the_size_cap_are_refused_fast(tmp_path, text, message):
    """PyYAML's scanner is quadratic in flow nesting and composes ~10^4 values a second: a
    4 MiB file of brackets or values is refused by counting, not by parsing it all."""
    path = tmp_path / "big.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        ddlsim.load_config(path)
    assert time.perf_counter() - start < 10.0


def test_brackets_in_quotes_and_comments_do_not_count_as_nesting(tmp_path):
    path = tmp_path / "q.yaml"
    brackets = "[" * 60
    path.write_text(EXAMPLE.replace("model: gpt3-175b", f"model: {{preset: gpt3-175b, "
                                    f"source: '{brackets}'}}  # {brackets}"))
    assert ddlsim.load_config(path).model.source == brackets

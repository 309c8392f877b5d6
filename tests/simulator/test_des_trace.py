"""``--trace FILE.json``: a Chrome trace / Perfetto JSON with a process per node, a track per
rank stream, ops as complete events that nest properly, transfers and flows as async slices;
and the CLI's ``--engine des|both``, ``--links N``."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import yaml
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.errors import DDLSimError
from ddlsim.simulator.chrome_trace import build_chrome_trace, write_chrome_trace
from ddlsim.simulator.result import Span

CFG = {"model": {"name": "tiny", "num_hidden_layers": 4, "hidden_size": 256,
                 "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
       "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
       "train": {"micro_batch_size": 2, "global_batch_size": 16, "seq_length": 128},
       "system": {"preset": "dgx-a100", "nodes": 2, "placement": "round_robin"}}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "iteration.json"
    result = ddlsim.predict(CFG, "des", trace_path=path)
    return result, json.loads(path.read_text())


def test_trace_is_valid_chrome_json(traced):
    result, trace = traced
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ms"
    assert {e["ph"] for e in events} <= {"M", "X", "b", "e"}
    for e in events:
        assert isinstance(e["pid"], int) and e["name"]
        if e["ph"] in ("X", "b", "e"):
            assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["tid"], int)
    assert max(e["ts"] + e.get("dur", 0) for e in events if e["ph"] != "M") == pytest.approx(
        result.iteration_time_s * 1e6, rel=1e-6)


def test_trace_has_a_process_per_node_and_a_track_per_rank_stream(traced):
    result, trace = traced
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "node 0", 1: "node 1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    names = set(threads.values())
    for rank in range(result.world_size):
        assert f"rank {rank} · compute" in names
    assert len(names) == len(threads)  # one track per rank stream
    # round-robin placement: even ranks on node 0
    assert all(pid == int(name.split()[1]) % 2 for (pid, _), name in threads.items())


def test_complete_events_nest_and_async_slices_pair_up(traced):
    _, trace = traced
    tracks = defaultdict(list)
    opened = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "b":
            key = (e["cat"], e["id"])
            assert key not in opened
            opened[key] = e
        elif e["ph"] == "e":
            start = opened.pop((e["cat"], e["id"]))
            assert e["name"] == start["name"] and e["ts"] >= start["ts"]
    assert not opened
    assert {"send", "recv", "flow"} <= {e["cat"] for e in trace["traceEvents"]
                                        if e["ph"] == "b"}
    for spans in tracks.values():
        spans.sort()
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-6 or e1 <= e0  # disjoint or properly nested


def test_write_refuses_to_overwrite(tmp_path):
    trace = build_chrome_trace([Span(0, "compute", "op", 0.0, 1e-3, "compute")], [0])
    path = write_chrome_trace(tmp_path / "t.json", trace)
    with pytest.raises(DDLSimError, match="already exists"):
        write_chrome_trace(path, trace)
    write_chrome_trace(path, trace, force=True)
    assert json.loads(path.read_text())["traceEvents"][-1]["dur"] == pytest.approx(1000.0)


def test_cli_des_with_trace_and_links(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    trace = tmp_path / "out.json"
    runner = CliRunner()
    res = runner.invoke(app, ["predict", str(cfg), "--engine", "both", "--trace", str(trace),
                              "--links", "3"])
    assert res.exit_code == 0, res.output
    assert "Busiest links (des)" in res.output and "des − analytical" in res.output
    assert json.loads(trace.read_text())["traceEvents"]
    res = runner.invoke(app, ["predict", str(cfg), "--engine", "des", "--trace", str(trace)])
    assert res.exit_code == 2 and "already exists" in res.output
    res = runner.invoke(app, ["predict", str(cfg), "--engine", "des", "-f", "json"])
    payload = json.loads(res.output)
    assert payload["engine"] == "des" and payload["links"][0]["utilisation"] > 0

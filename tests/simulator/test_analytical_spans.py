"""Spans of the analytical engine's representative ranks: recording observes and changes
nothing; the spans end where the engine's classes end, fill each class's compute stream as
its accounting says, and are the same whichever path (max-plus solver or scheduler) timed
the steps."""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path

import pytest

import ddlsim
from ddlsim.simulator.analytical import engine

# every example but Megatron 1T (64 stages × 1,024 steps: 1.3 M spans, ~10 s to build) and
# the plan searches (search-*.yaml, read by ddlsim search)
EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")
                  if not p.name.startswith(("megatron-1t", "search-")))
PIPELINED = {"model": "gpt3-1.3b",
             "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                          "data_parallel_size": 2},
             "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024},
             "system": {"preset": "dgx-a100", "nodes": 1}}
INTERLEAVED = {"model": "gpt3-2.7b",
               "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
                            "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2},
               "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048},
               "system": {"preset": "dgx-a100", "nodes": 2}}
P2P = ("send", "recv")


def _both(config):
    plain = ddlsim.predict(copy.deepcopy(config), check_fit=False)
    spans = ddlsim.predict(copy.deepcopy(config), check_fit=False, record_spans=True)
    return plain, spans


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_recording_changes_no_prediction_and_spans_end_with_each_class(path):
    plain, rec = _both(path)
    assert plain.spans == () and rec.spans
    assert rec.to_dict() == plain.to_dict()          # bit for bit, every field
    ends = defaultdict(float)
    for s in rec.spans:
        if s.kind not in P2P:     # a send does not hold its class: the transfer may end later
            ends[s.class_name] = max(ends[s.class_name], s.end_s)
    # the solver's steps are replayed through the scheduler from the start the solver gave
    # them, re-summing their ops: the last span may end a rounding away from the solver's
    # closed form (1 ulp in tp-3d-64 once SYNC_WAKE_S became 17.87 us); the prediction itself
    # is bit for bit the same with and without recording (above)
    assert dict(ends) == pytest.approx(rec.per_class_time_s, rel=1e-15, abs=0)
    assert max(ends.values()) == pytest.approx(rec.iteration_time_s, rel=1e-15, abs=0)


@pytest.mark.parametrize("config", [PIPELINED, INTERLEAVED], ids=["1f1b", "interleaved"])
def test_compute_stream_spans_match_the_accounting(config):
    """On the critical class's compute stream, compute and optimizer spans add up to the
    breakdown's compute and optimizer time, and no two spans overlap."""
    _, r = _both(config)
    mine = [s for s in r.spans if s.class_name == r.critical_class and s.stream == "compute"]
    total = defaultdict(float)
    for s in mine:
        total[s.kind] += s.end_s - s.start_s
    assert total["compute"] == pytest.approx(r.breakdown.compute_s, rel=1e-9)
    assert total["optimizer"] == pytest.approx(r.breakdown.optimizer_s, rel=1e-9)
    mine.sort(key=lambda s: s.start_s)
    for a, b in zip(mine, mine[1:]):
        assert b.start_s >= a.end_s - 1e-12 * r.iteration_time_s
    assert len({s.rank for s in r.spans}) == len(r.per_class_time_s)   # one rank per class


@pytest.mark.parametrize("config", [PIPELINED, INTERLEAVED], ids=["1f1b", "interleaved"])
def test_every_path_records_the_same_spans(config, monkeypatch):
    """The max-plus solver (its steps replayed for their spans) and the scheduler alone lay
    out the same spans, to rounding."""
    got = {}
    for solver in (True, False):
        monkeypatch.setattr(engine, "SOLVER", solver)
        got[solver] = ddlsim.predict(copy.deepcopy(config), check_fit=False, record_spans=True)
    # spans that start at the same instant (a receive posted as the block before it sends)
    # may swap places by a rounding difference: compare them in a rounding-free order
    key = lambda s: (s.rank, s.stream, s.kind, s.name, s.start_s)  # noqa: E731
    fast, slow = sorted(got[True].spans, key=key), sorted(got[False].spans, key=key)
    assert [(s.rank, s.stream, s.name, s.kind) for s in fast] == \
           [(s.rank, s.stream, s.name, s.kind) for s in slow]
    for a, b in zip(fast, slow):
        assert a.start_s == pytest.approx(b.start_s, rel=1e-9, abs=1e-12)
        assert a.end_s == pytest.approx(b.end_s, rel=1e-9, abs=1e-12)

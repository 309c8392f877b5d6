"""Progress of a DES run: the hook hears the start, simulated time and events as they grow,
and the end; the console reporter announces a long run with its estimate (rank-ops × seconds
per rank-op) and stays silent for a short one."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import ddlsim
from ddlsim.limits import trace_ops
from ddlsim.simulator.des import engine as des_engine, progress

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wiki-gpt2-9ranks-ddp.yaml"


class Recorder:
    def __init__(self):
        self.calls = []

    def start(self, workload):
        self.calls.append(("start", workload.world_size))

    def update(self, sim_time_s, events):
        self.calls.append(("update", sim_time_s, events))

    def stop(self):
        self.calls.append(("stop",))


def test_the_hook_follows_the_run(monkeypatch):
    monkeypatch.setattr(des_engine, "PROGRESS_EVERY", 10)
    rec = Recorder()
    r = ddlsim.predict(EXAMPLE, "des", progress=rec)
    assert rec.calls[0] == ("start", r.world_size) and rec.calls[-1] == ("stop",)
    updates = rec.calls[1:-1]
    assert [u[2] for u in updates] == [10 * (i + 1) for i in range(len(updates))]
    assert len(updates) == r.extra["des"]["events"] // 10
    times = [u[1] for u in updates]
    assert times == sorted(times) and times[-1] <= r.iteration_time_s


def test_a_long_run_is_announced_with_its_estimate(monkeypatch):
    cfg = ddlsim.load_config(EXAMPLE)
    from ddlsim.api import build_workload
    wl = build_workload(cfg)
    rank_ops = trace_ops(wl)[1]
    monkeypatch.setattr(progress, "SECONDS_PER_RANK_OP", 60.0 / rank_ops)   # 6 to 60 s
    monkeypatch.setattr(progress, "FASTEST_SECONDS_PER_RANK_OP", 6.0 / rank_ops)
    out = io.StringIO()
    p = progress.ConsoleProgress(out)
    p.start(wl)
    p.update(0.5, 100)   # not a terminal: no bar
    p.stop()
    assert out.getvalue() == (f"note: the discrete-event run of {wl.world_size:,} ranks "
                              f"executes {rank_ops:,} rank-ops; estimated 6 s to 60 s on one core\n")


def test_a_short_run_says_nothing():
    cfg = ddlsim.load_config(EXAMPLE)
    from ddlsim.api import build_workload
    out = io.StringIO()
    p = progress.ConsoleProgress(out)
    p.start(build_workload(cfg))
    p.update(0.1, 10)
    p.stop()
    assert out.getvalue() == ""


def test_an_unknown_option_is_still_refused():
    with pytest.raises(ddlsim.ConfigError, match="allowed: .*progress"):
        ddlsim.predict(EXAMPLE, "des", progres=None)

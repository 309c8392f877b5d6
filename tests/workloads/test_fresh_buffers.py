"""Fresh receive buffers (comm_only/gpt2_large.cpp:63-64, comm_only/bert_large.cpp:63-64):
the iteration's first receive pays the host's first-touch cost per page, in both engines,
only with a measurement; without one the result says it is not charged."""

from __future__ import annotations

import math
import warnings

import pytest

import ddlsim
from ddlsim.calibration import CalibrationProfile
from ddlsim.errors import ConfigError, DDLSimWarning

# proxies_check.py's 2-rank runs: `PROXY 4 2 2` on kvm-2core (benchmarks/proxies_table.py)
PIPE = ["model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=2",
        "parallel.data_parallel_size=1", "system.preset=kvm-2core", "system.nodes=1"]
RUNS = {"gpt2_large": (PIPE + ["train.micro_batch_size=1", "train.global_batch_size=2"],
                       808_960 * 4),                 # gpt2_large.cpp:22 P2PSIZE floats
        "bert_large": (PIPE + ["train.micro_batch_size=8", "train.global_batch_size=16"],
                       1_049_600 * 4)}               # bert_large.cpp:22
S_PER_PAGE = 2e-6
MEASURED = [f"system.first_touch.s_per_page={S_PER_PAGE}", "system.first_touch.source=test"]


def _cfg(name, extra=()):
    return ddlsim.load_config(f"examples/proxies/{name}.yaml",
                              overrides=RUNS[name][0] + list(extra))


def _time(cfg, engine, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DDLSimWarning)
        return ddlsim.predict(cfg, engine, check_fit=False, **kw)


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_two_first_receives_on_the_critical_path(name, engine):
    # 2 stages, nothing but transfers: stage 1's first forward receive and stage 0's first
    # backward receive are each waited for by everything after them, so each adds its
    # pages × cost once: ceil(P2P bytes / 4096) pages
    reused = _time(_cfg(name, ["model.recv_buffers=reused"]), engine).iteration_time_s
    fresh = _time(_cfg(name, MEASURED), engine)
    pages = math.ceil(RUNS[name][1] / 4096)
    assert fresh.iteration_time_s - reused == pytest.approx(2 * pages * S_PER_PAGE, rel=1e-9)
    assert "charged at 2 us per 4096 B page (test)" in fresh.extra["first_touch"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_one_touch_per_rank_after_its_first_receive(name):
    # one receive buffer serves both directions: stage 0 first receives in its backward,
    # stage 1 in its forward, each in micro-batch 0 only
    w = ddlsim.build_workload(_cfg(name, MEASURED))
    for cls, kind in zip(w.classes, ("B", "F")):
        steps = [s for s in cls.program.steps if s.block.endswith(".touch")]
        assert [(s.block.split(".")[0], s.microbatch) for s in steps] == [(kind, 0)]
        ops = cls.program.blocks[steps[0].block].ops
        i = next(j for j, o in enumerate(ops) if o.name == "first_touch.recv")
        assert ops[i].deps == (i - 1,) and ops[i - 1].name.startswith("wait.")
        assert ops[i].payload.seconds == pytest.approx(
            math.ceil(RUNS[name][1] / 4096) * S_PER_PAGE)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_without_a_measurement_nothing_is_charged_and_the_result_says_so(name):
    with pytest.warns(DDLSimWarning, match="first touch not charged"):
        r = ddlsim.predict(_cfg(name), "analytical", check_fit=False)
    assert r.extra["first_touch"].startswith("first touch not charged")
    assert r.iteration_time_s == _time(_cfg(name, ["model.recv_buffers=reused"]),
                                       "analytical").iteration_time_s


def _profile(s_per_page=S_PER_PAGE):
    return CalibrationProfile.from_dict({"version": 1, "first_touch": {
        "s_per_page": s_per_page, "page_bytes": 4096, "bytes": 4194304, "repeats": 3,
        "fresh_s": 3e-3, "warm_s": 5e-4, "clock": "process_time",
        "measured_utc": "2026-11-29T15:00:00+00:00", "source": "unit test"}})


def test_a_profiles_measurement_is_charged_as_the_systems():
    by_system = _time(_cfg("gpt2_large", MEASURED), "analytical").iteration_time_s
    r = _time(_cfg("gpt2_large"), "analytical", calibration=_profile())
    assert r.iteration_time_s == by_system
    assert "(unit test)" in r.extra["first_touch"]
    assert r.config["system"]["first_touch"]["s_per_page"] == S_PER_PAGE


def test_a_profile_and_a_system_that_disagree_are_refused():
    with pytest.raises(ConfigError, match="disagree"):
        ddlsim.predict(_cfg("gpt2_large", MEASURED), calibration=_profile(3e-6),
                       check_fit=False)


def test_an_unused_measurement_says_so():
    r = _time(_cfg("gpt2_large", ["model.recv_buffers=reused"]), "analytical",
              calibration=_profile())
    assert "not used" in r.extra["first_touch"]


def test_fresh_buffers_outside_the_comm_only_exchanges_are_refused():
    with pytest.raises(ConfigError, match="recv_buffers = 'fresh' with program 'megatron'"):
        ddlsim.load_config("examples/proxies/gpt2_large.yaml", overrides=[
            "model.program=megatron", "model.pipeline_p2p=dependent", "model.grad_sync=bucketed",
            "model.compute=model", "model.proxy_timings=null"])
    with pytest.raises(ConfigError, match="needs stage_exchange: paired"):
        _cfg("bert_large", ["model.stage_exchange=dependent"])


def test_first_touch_needs_its_source():
    with pytest.raises(ConfigError, match="source"):
        _cfg("gpt2_large", [f"system.first_touch.s_per_page={S_PER_PAGE}"])

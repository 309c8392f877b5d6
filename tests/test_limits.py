"""Plausibility bounds (refused with the reason, or warned about) and work budgets (refused
before any work starts, with the estimate and the option that raises the limit)."""

from __future__ import annotations

import copy
import re
import time
import warnings

from pathlib import Path

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError, DDLSimWarning, WorkTooLargeError
from ddlsim.limits import BOUNDS, Limits, check_work, estimate_work, topology_links
from tests.conftest import BASE

GPT3 = "examples/gpt3-175b-1024-a100.yaml"


def with_sets(*sets):
    return build_config(copy.deepcopy(BASE), list(sets))


# ------------------------------------------------------------------------ plausibility bounds
@pytest.mark.parametrize("override, field, reason", [
    ("system.nic.bandwidth_Bps=200", "system.nic.bandwidth_Bps: 200 B/s is below", "1 Mb/s"),
    ("system.nic.bandwidth_Bps=999 kb/s", "system.nic.bandwidth_Bps", "below the plausible minimum"),
    ("system.nic.latency_s=2", "system.nic.latency_s: 2 s is above", "over 1 s"),
    ("system.nodes=1250001", "nodes × devices_per_node = 1250001 × 8", "10^7 devices"),
    ("model.num_hidden_layers=1e9", "model.num_hidden_layers: 1,000,000,000 is above", "128 layers"),
    ("model.hidden_size=1e7", "model.hidden_size", "25,600"),
    ("model.vocab_size=1e9", "model.vocab_size", "256k"),
    ("train.seq_length=1e9", "train.seq_length", "10M"),
    ("train.global_batch_size=2e7", "the number of micro-batches", "10^6 micro-batches"),
    ("system.device.memory_bytes=1000", "system.device.memory_bytes", "1 MiB"),
    ("system.network.oversubscription=5000", "system.network.oversubscription", "1000:1"),
])
def test_implausible_values_are_refused_with_the_reason(override, field, reason):
    with pytest.raises(ConfigError) as err:
        with_sets(override)
    assert field in str(err.value) and reason in str(err.value)


def test_bounds_sit_far_beyond_every_preset_and_example():
    """Every shipped config loads without an error or a warning (other than the one line
    listing the keys of a published HuggingFace config.json that ddlsim does not model)."""
    import glob

    with warnings.catch_warnings():
        warnings.simplefilter("error", DDLSimWarning)
        warnings.filterwarnings("ignore", r".*config\.json key\(s\) not modelled by ddlsim",
                                DDLSimWarning)
        for path in sorted(glob.glob("examples/*.yaml")):
            if Path(path).name.startswith("search-"):  # a plan search: its base config
                from ddlsim.search import load_search
                data, base_dir, _ = load_search(path)
                build_config(data, (), base_dir)
                continue
            ddlsim.load_config(path)


def test_every_bound_says_why():
    for name, b in BOUNDS.items():
        assert b.why and (b.low is not None or b.high is not None), name
        assert (b.usual_low is None and b.usual_high is None) or b.unusual, name


@pytest.mark.parametrize("override, field", [
    ("system.nic.bandwidth_Bps=100 Mb/s", "system.nic.bandwidth_Bps = 12,500,000 B/s is unusual"),
    ("system.nic.latency_s=5 ms", "system.nic.latency_s = 0.005 s is unusual"),
    ("system.network.switch_latency_s=2 ms", "system.network.switch_latency_s = 0.002 s"),
    ("system.network.oversubscription=32", "system.network.oversubscription = 32 is unusual"),
])
def test_unusual_values_warn_naming_field_value_and_why(override, field):
    with pytest.warns(DDLSimWarning) as record:
        with_sets(override)
    messages = [str(w.message) for w in record]
    assert any(field in m and "is unusual: " in m for m in messages)


def test_usual_values_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DDLSimWarning)
        with_sets("system.nic.bandwidth_Bps=1 Gb/s", "system.nic.latency_s=1 ms")


# ---------------------------------------------------------------------------- work budgets
def test_limits_from_strings():
    assert Limits.from_strings(["des_rank_ops=1e8", "ranks = 5000"]) == Limits(
        des_rank_ops=100_000_000, ranks=5000)
    assert Limits.from_strings(None) == Limits()


@pytest.mark.parametrize("item, message", [
    ("ranks", "must look like NAME=VALUE"),
    ("rank=5", "unknown limit 'rank' (did you mean 'ranks'?); allowed: pipeline_steps"),
    ("ranks=-3", "positive whole number"),
    ("ranks=0", "positive whole number"),
    ("ranks=1.5", "positive whole number"),
    ("ranks=inf", "positive whole number"),
    ("ranks=nan", "positive whole number"),
    ("ranks=lots", "positive whole number"),
])
def test_limits_from_strings_errors(item, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Limits.from_strings([item])


def test_estimates_follow_their_formulas():
    cfg = ddlsim.load_config(GPT3)  # PP16, 1536 / (1 · DP8) = 192 micro-batches, 1 chunk
    work = estimate_work(cfg, "des")
    assert work["ranks"] == 1024
    assert work["pipeline_steps"] == 16 * (2 * 192 * 1 + 1)
    # DGX A100 node: 8 devices + NVSwitch (9 links), 8 NICs on it (8), fat tree 3 × 8 NICs;
    # two directions per link, 128 nodes
    assert work["topology_links"] == 2 * 128 * (9 + 8 + 24)


@pytest.mark.parametrize("preset, nodes", [("dgx-a100", 64), ("cpu-10gbe", 300),
                                           ("dgx-h100", 5)])
def test_topology_link_estimate_bounds_the_built_graph(preset, nodes):
    from ddlsim.topologies import build_topology
    from ddlsim.topologies.spec import parse_spec

    spec = parse_spec({"preset": preset, "nodes": nodes})
    built = build_topology(spec).graph.number_of_edges()
    assert built <= topology_links(spec) <= 3 * built


def test_microbatch_blowup_is_refused_before_any_work():
    """10^6 micro-batches on 16 stages: 3.2·10^7 steps, ~11 GB of step tables if built."""
    cfg = ddlsim.load_config(GPT3, ["train.global_batch_size=8000000"])
    start = time.perf_counter()
    with pytest.raises(WorkTooLargeError) as err:
        ddlsim.predict(cfg)
    assert time.perf_counter() - start < 1.0
    msg = str(err.value)
    assert "32,000,016 pipeline steps" in msg and "limit of 2,000,000" in msg
    assert "--limit pipeline_steps=4e7" in msg


def test_des_work_is_counted_on_the_trace_and_refused():
    cfg = ddlsim.load_config(GPT3)
    with pytest.raises(WorkTooLargeError, match=r"operations executed by the DES .* "
                                                r"--limit des_rank_ops="):
        ddlsim.predict(cfg, "des", limits=Limits(des_rank_ops=1000))


@pytest.mark.parametrize("engine", ["des", "analytical"])
def test_huge_topology_is_refused_before_it_is_built(engine):
    """Both engines build the cluster graph (the analytical one measures the links a group
    crosses on it: 10^6 nodes ran past 90 s and 4 GB before issue 31), so both are bounded."""
    cfg = ddlsim.load_config(GPT3, ["system.nodes=200000"])
    start = time.perf_counter()
    with pytest.raises(WorkTooLargeError, match="directed links in the cluster graph"):
        ddlsim.predict(cfg, engine)
    assert time.perf_counter() - start < 1.0


def test_raising_a_limit_lets_the_run_through():
    cfg = ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml")
    with pytest.raises(WorkTooLargeError, match="9 ranks"):
        ddlsim.predict(cfg, limits=Limits(ranks=8))
    assert ddlsim.predict(cfg, limits=Limits(ranks=9)).iteration_time_s > 0


def test_cli_limit_option(tmp_path):
    from typer.testing import CliRunner

    from ddlsim.cli import app

    runner = CliRunner()
    args = ["predict", "examples/wiki-gpt2-9ranks-ddp.yaml", "-f", "json"]
    refused = runner.invoke(app, [*args, "--limit", "ranks=8"])
    assert refused.exit_code == 2 and "--limit ranks=" in refused.output
    bad = runner.invoke(app, [*args, "--limit", "ranks"])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output
    ok = runner.invoke(app, [*args, "--limit", "ranks=9", "--limit", "pipeline_steps=100"])
    assert ok.exit_code == 0, ok.output


def test_trace_ops_count_every_step_of_every_class():
    from ddlsim.api import build_workload
    from ddlsim.limits import trace_ops

    cfg = ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml")  # one class of 9 ranks
    wl = build_workload(cfg)
    (cls,) = wl.classes
    per_step = [len(cls.program.blocks[step.block].ops) for step in cls.program.steps]
    assert len(per_step) == 3  # forward, backward, update: one micro-batch, no pipeline
    assert trace_ops(wl) == (sum(per_step), 9 * sum(per_step))


def test_a_trace_too_long_for_the_analytical_engine_is_refused():
    cfg = ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml")
    with pytest.raises(WorkTooLargeError, match=r"operations in the trace .* --limit trace_ops="):
        ddlsim.predict(cfg, limits=Limits(trace_ops=10))


def test_trace_ops_count_loops_as_the_ops_they_unroll_to():
    """A Loop of 10^9 iterations is refused by its unrolled size, without unrolling it."""
    from ddlsim.limits import trace_ops
    from ddlsim.workloads.trace import (Block, Compute, Loop, Op, Program, RankClass, Step,
                                        Workload)

    body = (Op(Compute("a", 1.0)), Op(Compute("b", 1.0), deps=(0,)))
    block = Block("F", "forward", (Op(Compute("pre", 1.0)),
                                   Op(Loop("layers", body, 10**9), repeat=2)))
    cls = RankClass("all", (0, 1), Program({"F": block}, (Step("F"), Step("F"))))
    wl = Workload("loop", 2, {}, (cls,))
    per_class, per_rank = trace_ops(wl)
    assert per_class == 2 * (1 + 2 * 10**9 * 2)
    assert per_rank == 2 * per_class


def test_tiny_gradient_buckets_on_a_large_model_are_refused_before_memory_runs_out():
    """Each DDP pass over each bucket is one kernel: a 1 KiB bucket on DeepSeek-V3 would list
    millions (fuzz seed 21 case 193 ran out of memory building them)."""
    cfg = {"model": {"preset": "deepseek-v3"},
           "parallel": {"pipeline_model_parallel_size": 16, "num_layers_in_last_pipeline_stage": 1,
                        "expert_model_parallel_size": 64, "zero_stage": 1,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True},
                        "grad_bucket_size": "1 KiB", "overlap_grad_reduce": True},
           "train": {"micro_batch_size": 1, "global_batch_size": 15360, "seq_length": 4096,
                     "dtype": "fp8"},
           # the fuzz case as it ran: DeepSeek-V3 (MLA, shared experts, its router) and the
           # uneven split under megatron-core-2024, whose 900f1b76 has none of them: a what-if
           "system": {"preset": "dgx-h100", "nodes": 128,
                      "software": {"stack": "megatron-core-2024", "what_if": True}}}
    with pytest.raises(WorkTooLargeError, match="grad_bucket_size.*larger buckets"):
        ddlsim.predict(cfg)

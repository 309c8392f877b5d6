"""The DES engine's semantics: streams, waits, non-blocking point-to-point, rendezvous,
breakdowns of the analytical engine's shape, spans, links, and its exact shortcut."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimError
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.des import run_des
from scenarios import (cluster, concurrent_collectives, cost_model,
                                            send_recv_pair)

SMALL = {"model": {"name": "tiny", "num_hidden_layers": 8, "hidden_size": 256,
                   "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
         "train": {"micro_batch_size": 2, "global_batch_size": 16, "seq_length": 128},
         "system": {"preset": "dgx-a100", "nodes": 2}}


def _cfg(**parallel):
    system = SMALL["system"]
    if parallel.get("zero_stage") == 3:    # the default stack's ZeRO-3: a what-if (no_zero3)
        system = {**system, "software": {"stack": "megatron-core-2024", "what_if": True}}
    return ddlsim.load_config({**SMALL, "parallel": parallel, "system": system})


PLANS = [dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
         dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
              schedule="interleaved", virtual_pipeline_model_parallel_size=2),
         dict(tensor_model_parallel_size=4, zero_stage=3),
         dict(pipeline_model_parallel_size=2, dp_strategy="reduce_broadcast")]


@pytest.mark.parametrize("plan", PLANS, ids=["1f1b", "interleaved", "zero3", "reduce-bcast"])
def test_breakdown_adds_up_and_matches_result_shape(plan):
    cfg = _cfg(**plan)
    d = ddlsim.predict(cfg, "des")
    a = ddlsim.predict(cfg, "analytical")
    b = d.breakdown
    parts = (b.compute_s + b.optimizer_s + sum(b.exposed_comm_s.values()) + b.bubble_s
             + b.host_s)
    assert parts == pytest.approx(d.iteration_time_s, rel=1e-9)
    assert d.engine == "des" and set(d.to_dict()) >= set(a.to_dict()) | {"links"}
    assert d.per_class_time_s.keys() == a.per_class_time_s.keys()
    assert d.hardware_flops == pytest.approx(a.hardware_flops)
    assert set(a.breakdown.exposed_comm_s) <= set(b.exposed_comm_s)


def test_send_does_not_block_and_recv_waits_for_the_transfer():
    """1 MB from ranks 0, 1 (node 0) to 2, 3 (node 1): both flows share node 0's 100 Gb/s
    NIC. Golden: compute 1 GFLOP at 100 TFLOP/s × 0.75, then α = 5.5 µs and 1 MB at 6.25 GB/s."""
    system = cluster(2, 2, "switch")
    wl = send_recv_pair(1e6, p=4)
    run, _ = run_des(wl, cost_model(system, wl))
    compute = 1e9 / (100e12 * 0.75)
    transfer = 5.5e-6 + 1e6 / (100e9 / 8 / 2)
    assert run.timings[0].end == pytest.approx(compute, rel=1e-12)
    assert run.timings[1].end == pytest.approx(2 * compute + transfer, rel=1e-9)
    assert run.timings[1].exposed["pp"] == pytest.approx(compute + transfer - compute, rel=1e-9)
    analytical = simulate_analytical(wl, cost_model(system, wl)).timings
    assert run.timings[1].end == pytest.approx(analytical[1].end, rel=1e-9)


def test_wait_joins_communication_streams():
    system = cluster(4, 1, "switch")
    wl = concurrent_collectives([("all_reduce", "ring", 8e6, 0), ("broadcast", "ring", 8e6, 2)],
                                4, compute_flops=1e9)
    run, _ = run_des(wl, cost_model(system, wl))
    spans = run.spans[0]
    comm_end = max(end for sid, name, start, end, kind in spans if name.startswith("c"))
    assert run.timings[0].end == pytest.approx(comm_end)
    t = run.timings[0]
    assert t.exposed["dp"] == pytest.approx(t.end - t.compute, rel=1e-9)


def test_spans_cover_every_rank_and_never_overlap_on_a_stream():
    r = ddlsim.predict(_cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2), "des")
    assert {s.rank for s in r.spans} == set(range(r.world_size))
    by_track: dict = {}
    for s in r.spans:
        assert 0 <= s.start_s <= s.end_s <= r.iteration_time_s * (1 + 1e-12)
        if s.kind not in ("send", "recv"):
            by_track.setdefault((s.rank, s.stream), []).append(s)
    for spans in by_track.values():
        spans.sort(key=lambda s: (s.start_s, s.end_s))
        for x, y in zip(spans, spans[1:]):
            assert y.start_s >= x.end_s - 1e-15


def test_representative_and_no_spans():
    cfg = _cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    rep = ddlsim.predict(cfg, "des", spans="representative")
    first = {c.ranks[0] for c in ddlsim.build_workload(cfg).classes}
    assert {s.rank for s in rep.spans} == first == {0, 8}  # first rank of each stage
    assert ddlsim.predict(cfg, "des", spans="none").spans == ()
    with pytest.raises(ConfigError, match="allowed: auto, all, representative, none"):
        ddlsim.predict(cfg, "des", spans="some")


def test_same_inputs_same_result_bit_for_bit():
    cfg = _cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    a, b = ddlsim.predict(cfg, "des"), ddlsim.predict(cfg, "des")
    assert a.to_dict() == b.to_dict()
    assert a.spans == b.spans


@pytest.mark.parametrize("plan", PLANS[:3], ids=["1f1b", "interleaved", "zero3"])
def test_idle_link_shortcut_is_exact(plan):
    cfg = _cfg(**plan)
    wl = ddlsim.build_workload(cfg)
    runs = [run_des(wl, cost_model(cfg.system, wl, **cfg.parallel.model_dump()),
                    shortcuts=s)[0] for s in (True, False)]
    fast, slow = runs
    for x, y in zip(fast.timings, slow.timings):
        assert x.end == pytest.approx(y.end, rel=1e-9)
    assert fast.network.bytes_delivered == pytest.approx(slow.network.bytes_delivered, rel=1e-9)
    assert fast.events < slow.events


def test_links_report_the_topology_links():
    r = ddlsim.predict(_cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2), "des")
    assert r.links and {"link", "kind", "bandwidth_Bps", "busy_s", "utilisation",
                        "bytes"} == set(r.links[0])
    assert all("->" in ln["link"] for ln in r.links)
    assert r.extra["des"]["bytes_delivered"] == pytest.approx(r.extra["des"]["bytes_sent"])


def test_trace_path_refuses_to_overwrite(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{}")
    cfg = _cfg(tensor_model_parallel_size=2)
    with pytest.raises(DDLSimError, match="already exists"):
        ddlsim.predict(cfg, "des", trace_path=path)
    ddlsim.predict(cfg, "des", trace_path=path, force=True)
    assert path.stat().st_size > 100


def test_unknown_des_option_names_the_allowed_ones():
    with pytest.raises(ConfigError, match="unknown DES option 'trace'; allowed: trace_path"):
        ddlsim.predict(_cfg(tensor_model_parallel_size=2), "des", trace="x.json")


def test_ring_steps_are_aggregated_not_simulated_one_by_one():
    """A 256-rank ring all-reduce has 510 steps of 256 flows; the DES runs it as one phase
    (one flow set carrying 510 × n/p per flow) in a handful of events, and on time."""
    from scenarios import run_case
    from scenarios import single_collective

    p, n = 256, 1e9
    system = cluster(p, 1, "switch")
    wl = single_collective("all_reduce", "ring", n, p)
    for shortcuts in (True, False):
        run, _ = run_des(wl, cost_model(system, wl), shortcuts=shortcuts)
        assert run.events < 20
        assert run.network.flows_started == p
    case = run_case("all_reduce", "ring", n, p, 1, "switch")
    assert case.des_s == pytest.approx(case.analytical_s, rel=1e-9)

"""Reports: grouped busiest links, the does-not-fit marker, strict JSON, formatted numbers."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
from rich.console import Console

import ddlsim
from ddlsim.errors import DDLSimError
from ddlsim.report import dumps_json, group_links, links_table, render_results

WIKI = "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml"


def _link(name, kind="nvlink", util=0.5, bw=3e11, busy=1.0, nbytes=1.5e11):
    return {"link": name, "kind": kind, "bandwidth_Bps": bw, "busy_s": busy,
            "utilisation": util, "bytes": nbytes}


def test_identical_links_are_one_group_by_tier_and_kind():
    links = [_link(f"node{n}/dev{d}->node{n}/nvswitch") for n in range(2) for d in range(4)]
    links += [_link("node0/nic0->switch0", "nic", 0.9, 2.5e10, 0.9, 2.2e10),
              _link("node1/nic0->switch0", "nic", 0.9, 2.5e10, 0.9, 2.2e10),
              _link("switch0->node1/nic0", "nic", 0.9, 2.5e10, 0.9, 2.2e10),
              _link("leaf0->spine0", "fabric", 0.2, 2.5e10, 0.3, 5e9)]
    groups = group_links(links)
    assert [(g["kind"], g["tier"], g["count"]) for g in groups] == [
        ("nic", "node→fabric", 2), ("nic", "fabric→node", 1), ("nvlink", "in node", 8),
        ("fabric", "fabric", 1)]
    assert sum(g["count"] for g in groups) == len(links)


def test_links_differing_in_load_stay_apart():
    groups = group_links([_link("node0/dev0->node0/nvswitch", util=0.5),
                          _link("node0/dev1->node0/nvswitch", util=0.4)])
    assert [g["count"] for g in groups] == [1, 1]


def _text(renderable_or_fn) -> str:
    console = Console(record=True, width=120, color_system=None, file=open("/dev/null", "w"))
    renderable_or_fn(console)
    return console.export_text()


def test_links_table_rows_are_groups_with_utilisation():
    r = ddlsim.predict(ddlsim.load_config(WIKI), "des")
    text = _text(lambda c: c.print(links_table(r, 3)))
    rows = [ln for ln in text.splitlines() if "×" in ln]
    assert len(rows) == 3 and len(set(rows)) == 3          # no identical rows
    # the PCIe links carry 949 MiB each (the reduce and broadcast of 475 MiB of fp32 gradients)
    busy = 949 * 2**20 / (1.25e9 * r.iteration_time_s)
    assert "PCIe, in node" in text and f"{100 * busy:.1f}%" in text
    assert "GB/s" in text and "MiB" in text and "ms" in text


def test_not_fitting_result_is_marked(tmp_path):
    cfg = ddlsim.load_config("examples/gpt3-175b-1024-a100.yaml",
                             ["system.nodes=1", "parallel.pipeline_model_parallel_size=1",
                              "parallel.data_parallel_size=1", "train.global_batch_size=8"])
    r = ddlsim.predict(cfg, check_fit=False)
    assert r.fits is False and r.to_dict()["fits"] is False
    text = _text(lambda c: render_results(c, cfg, [r]))
    assert "DOES NOT FIT" in text and "✗ does not fit" in text
    ok = ddlsim.predict(ddlsim.load_config(WIKI))
    assert ok.fits is True and "DOES NOT FIT" not in _text(
        lambda c: render_results(c, ddlsim.load_config(WIKI), [ok]))


def test_report_numbers_use_the_formatter():
    cfg = ddlsim.load_config(WIKI)
    text = _text(lambda c: render_results(c, cfg, [ddlsim.predict(cfg)]))
    r = ddlsim.predict(cfg)
    # three significant figures: "911 ms", "2.93%", "210 GFLOP/s"
    assert f"{r.iteration_time_s * 1e3:.0f} ms" in text
    assert f"{100 * r.mfu:.2f}%" in text and f"{r.flops_per_device / 1e9:.0f} GFLOP/s" in text
    assert "0.0%" not in text and "-0.0" not in text


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_json_never_carries_non_finite_numbers(bad):
    d = ddlsim.predict(ddlsim.load_config(WIKI)).to_dict()
    d = copy.deepcopy(d)
    d["breakdown"]["exposed_comm_s"]["dp"] = bad
    with pytest.raises(DDLSimError, match=r"breakdown\.exposed_comm_s\.dp"):
        dumps_json(d)


def test_result_round_trips_through_its_json():
    r = ddlsim.predict(ddlsim.load_config(WIKI), "des")
    back = ddlsim.Result.from_dict(r.to_dict())
    assert back.to_dict() == r.to_dict()
    assert back.to_row() == r.to_row()


def test_old_result_json_without_raw_counts_gives_the_same_rates():
    r = ddlsim.predict(ddlsim.load_config(WIKI))
    d = r.to_dict()
    for k in ("samples", "tokens", "model_flops", "hardware_flops", "peak_flops_per_device"):
        del d[k]
    back = ddlsim.Result.from_dict(d)
    for k in ("mfu", "flops_per_device", "samples_per_s", "tokens_per_s"):
        assert getattr(back, k) == pytest.approx(getattr(r, k), rel=1e-12)


def test_frame_has_unit_named_columns_and_one_row_per_result():
    cfg = ddlsim.load_config(WIKI)
    a, d = ddlsim.predict(cfg), ddlsim.predict(cfg, "des")
    frame = ddlsim.results_frame([a, d], labels=["a", "d"])
    assert list(frame["label"]) == ["a", "d"] and list(frame["engine"]) == ["analytical", "des"]
    for col in ("iteration_time_s", "exposed_comm_dp_s", "bubble_s", "comm_dp_bytes",
                "memory_total_bytes", "memory_capacity_bytes", "fits", "parameter_count",
                "tensor_model_parallel_size"):
        assert col in frame.columns
    assert frame["iteration_time_s"].tolist() == [a.iteration_time_s, d.iteration_time_s]
    parts = frame[["compute_s", "optimizer_s", "exposed_comm_total_s", "bubble_s",
                   "host_s"]].sum(axis=1)
    assert parts.tolist() == pytest.approx(frame["iteration_time_s"].tolist(), rel=1e-12)
    assert a.to_frame().iloc[0].to_dict() == frame.drop(columns="label").iloc[0].to_dict()
    with pytest.raises(ValueError, match="labels"):
        ddlsim.results_frame([a], labels=["x", "y"])


def test_result_describes_itself():
    cfg = ddlsim.load_config(WIKI, ["train.micro_batch_size=2"])
    d = ddlsim.predict(cfg).to_dict()
    assert d["ddlsim_version"] == ddlsim.__version__
    assert d["parameter_count"] == 124_439_808   # GPT-2 small (HF gpt2), tied embeddings
    assert d["settings"] == {"engine": "analytical", "calibration": None, "backend": None,
                             "check_fit": True}
    assert ddlsim.RunConfig.model_validate(d["config"]) == cfg   # after presets and --set
    assert d["config"]["train"]["micro_batch_size"] == 2
    des = ddlsim.predict(cfg, "des", spans="none").to_dict()["settings"]
    assert des["engine"] == "des" and des["des_spans"] == "none"


def test_extra_keys_do_not_hide_predictions():
    r = ddlsim.predict(ddlsim.load_config(WIKI))
    r2 = replace(r, extra={"note": "x"})
    assert r2.to_dict()["note"] == "x" and r2.to_dict()["iteration_time_s"] == r.iteration_time_s


def test_csv_refuses_non_finite_numbers_too():
    from ddlsim.clioutput import csv_text
    from ddlsim.simulator.result import Breakdown

    r = ddlsim.predict(ddlsim.load_config(WIKI))
    bad = replace(r, breakdown=Breakdown(math.inf, 0.0, {}, 0.0))
    with pytest.raises(DDLSimError, match="non-finite number in column compute_s"):
        csv_text([bad])
    assert csv_text([r]).startswith("engine,")

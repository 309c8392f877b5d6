"""Pictures: the timeline of one iteration and the breakdown bars, rendered as PNG.

Each case names what the picture must show from the plan itself: the wiki's reduce-to-root
update has compute, an optimizer step on the root and data-parallel collectives on the
compute stream, and the other ranks wait while the root updates; a TP2 × PP2 × DP2 plan adds
tensor-parallel all-reduces, point-to-point transfers, gradient buckets on their own stream
and a pipeline bubble.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

import ddlsim
from ddlsim.plots import IDLE, PlotError, draw_breakdown, draw_timeline
from ddlsim.textio import OutputFileError

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "examples" / "wiki-gpt2-9ranks-reduce_broadcast.yaml"
PIPELINED = {"model": "gpt3-1.3b",
             "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                          "data_parallel_size": 2},
             "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
             "system": {"preset": "dgx-a100", "nodes": 1}}
PNG = b"\x89PNG\r\n\x1a\n"
WIKI_KINDS = {"compute", "optimizer", "dp", IDLE}
# "pp": the tied embedding's gradient all-reduce between the first and last stages
PIPELINED_KINDS = {"compute", "optimizer", "tp", "dp", "pp", "send/recv", IDLE}


@pytest.fixture(scope="module")
def results():
    return {
        "wiki-analytical": ddlsim.predict(WIKI, record_spans=True),
        "wiki-des": ddlsim.predict(WIKI, "des"),
        "pp-analytical": ddlsim.predict(copy.deepcopy(PIPELINED), record_spans=True),
        "pp-des": ddlsim.predict(copy.deepcopy(PIPELINED), "des"),
    }


def _legend(fig) -> set[str]:
    return {t.get_text() for t in fig.axes[0].get_legend().get_texts()}


@pytest.mark.parametrize("case, kinds", [
    ("wiki-analytical", WIKI_KINDS), ("wiki-des", WIKI_KINDS),
    ("pp-analytical", PIPELINED_KINDS), ("pp-des", PIPELINED_KINDS)])
def test_timeline_png_axes_rows_and_legend(results, case, kinds, tmp_path):
    r = results[case]
    out = tmp_path / "timeline.png"
    fig = draw_timeline(r, out)
    assert out.read_bytes().startswith(PNG)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"          # both iterations are under a second
    assert ax.get_ylabel() == "rank class"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.get_yticks()) == len(r.per_class_time_s) == len(labels)
    for name in r.per_class_time_s:                  # one row per class, named by it
        assert sum(lab.startswith(f"{name} (rank ") for lab in labels) == 1
    assert _legend(fig) == kinds
    title = ax.get_title(loc="left")
    assert ("analytical engine" if r.engine == "analytical" else "discrete-event engine") in title
    assert ddlsim.units.format_time(r.iteration_time_s) in title


def test_timeline_rows_use_the_first_rank_of_each_class(results, tmp_path):
    r = results["wiki-des"]                          # DES spans of all 9 ranks
    assert len({s.rank for s in r.spans}) == 9
    fig = draw_timeline(r, None)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == \
        ["stage0.root (rank 0)", "stage0.rest (rank 1)"]


def test_timeline_in_seconds_when_long_and_title_given(results, tmp_path):
    r = results["pp-analytical"]
    k = 2.0 / r.iteration_time_s       # the same picture for a 2 s iteration
    slow = dataclasses.replace(
        r, iteration_time_s=k * r.iteration_time_s,
        spans=tuple(dataclasses.replace(s, start_s=k * s.start_s, end_s=k * s.end_s)
                    for s in r.spans))
    fig = draw_timeline(slow, tmp_path / "t.png", title="stretched to 2 s")
    assert fig.axes[0].get_xlabel() == "time (s)"
    assert fig.axes[0].get_title(loc="left") == "stretched to 2 s"
    assert fig.axes[0].get_xlim()[1] >= slow.iteration_time_s


def test_timeline_title_names_the_model_when_the_result_carries_its_config(results):
    r = results["wiki-analytical"]
    with_cfg = type("R", (), {**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)},
                              "config": {"model": {"name": "gpt2-124m"}}})()
    assert draw_timeline(with_cfg, None).axes[0].get_title(loc="left").startswith("gpt2-124m · ")


def test_timeline_without_spans_is_refused(results, tmp_path):
    plain = ddlsim.predict(WIKI)
    with pytest.raises(PlotError, match="no spans .* record_spans=True"):
        draw_timeline(plain, tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


def test_files_are_written_through_textio(results, tmp_path):
    r = results["wiki-analytical"]
    out = tmp_path / "t.png"
    out.write_bytes(b"keep")
    with pytest.raises(OutputFileError, match="already exists"):
        draw_timeline(r, out)
    assert out.read_bytes() == b"keep"
    link = tmp_path / "link.png"
    link.symlink_to(out)
    draw_timeline(r, link, force=True)
    assert link.is_symlink() and out.read_bytes().startswith(PNG)
    with pytest.raises(OutputFileError, match="already exists"):
        draw_breakdown([r], out)


def test_breakdown_bars_are_the_breakdown_parts(results, tmp_path):
    rs = [results["pp-analytical"], results["pp-des"], results["wiki-analytical"]]
    out = tmp_path / "b.png"
    fig = draw_breakdown(rs, out, labels=["pp A", "pp D", "wiki A"])
    assert out.read_bytes().startswith(PNG)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "time per iteration (s)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["pp A", "pp D", "wiki A"]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    same = {"rel": 1e-12, "abs": 1e-15}   # matplotlib stores top and bottom, not the height
    for i, r in enumerate(rs):
        b = r.breakdown
        assert bars["compute"][i] == pytest.approx(b.compute_s, **same)
        assert bars["optimizer"][i] == pytest.approx(b.optimizer_s, **same)
        assert bars["bubble"][i] == pytest.approx(b.bubble_s, **same)
        for kind, v in b.exposed_comm_s.items():
            assert bars.get(f"exposed {kind}", [0.0] * len(rs))[i] == pytest.approx(v, **same)
        tops = [c.patches[i].get_y() + c.patches[i].get_height() for c in ax.containers]
        assert max(tops) == pytest.approx(r.iteration_time_s, rel=1e-12)
    assert {"compute", "optimizer", "exposed tp", "exposed dp", "bubble"} <= _legend(fig)


def test_breakdown_labels_must_match_the_results(results):
    with pytest.raises(PlotError, match="2 labels for 1 results"):
        draw_breakdown([results["wiki-des"]], None, labels=["a", "b"])


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_vector_formats_by_suffix(results, tmp_path, suffix, magic):
    out = tmp_path / f"t{suffix}"
    draw_timeline(results["wiki-analytical"], out)
    assert out.read_bytes().startswith(magic)

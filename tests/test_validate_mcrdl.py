"""benchmarks/validate_mcrdl.py on a small sample: the DLRM workload (32 ranks, milliseconds
per prediction) without a profile, and with hand-written two-backend profiles whose outcome is
known in advance. The profiles here are test fixtures, not measurements."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import validate_mcrdl as v  # noqa: E402

DLRM = next(c for c in v.CLAIMS if c.name == "dlrm")
OPS = ("all_reduce", "all_to_all")


def _entry(backend: str, op: str, alpha_s: float, bandwidth_Bps: float) -> dict:
    return {"backend": backend, "op": op, "scope": "inter", "ranks": 32, "nodes": 4,
            "ranks_per_node": 8, "library": "fixture",
            "segments": [{"min_bytes": 0, "alpha_s": alpha_s,
                          "beta_s_per_B": 1.0 / bandwidth_Bps, "source": "test fixture"}]}


def _write(tmp_path: Path, entries: list[dict]) -> Path:
    doc = {"version": 1, "kind": "ddlsim-calibration-profile", "name": "fixture",
           "provenance": {"created_utc": "2026-11-29T00:00:00+00:00", "notes": ["fixture"]},
           "comm": entries}
    (tmp_path / "thetagpu.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_without_a_profile_the_claim_is_unchecked(tmp_path, capsys):
    assert v.main(["--only", "dlrm", "--profiles", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "unchecked: no profile thetagpu.yaml" in out
    assert out.strip().splitlines()[-1].startswith(
        "validate_mcrdl: 0 of 1 MCR-DL gains checked, 0 within 10 points; the rest need")


def test_identical_backends_give_no_gain(tmp_path):
    entries = [_entry(b, op, 20e-6, 20e9) for b in ("mpi", "nccl") for op in OPS]
    o = v.evaluate(DLRM, _write(tmp_path, entries))
    assert o["status"] == "checked"
    assert o["nccl_s"] == o["mpi_s"] == o["auto_s"]
    assert o["gain_over_nccl"] == 0.0 and o["gain_over_best"] == 0.0
    assert o["error_points"] == pytest.approx(-25.0)


def test_the_mix_takes_each_backend_where_it_is_faster(tmp_path):
    # all-reduce, 194 KiB and 2.78 MiB: mpi 1 us + S / 1 GB/s (200 us, 2.9 ms); nccl 1 ms +
    # S / 40 GB/s (1.005 ms, 1.07 ms): mpi wins the small one, nccl the large one, so the mix
    # beats both single backends.
    entries = [_entry("mpi", "all_reduce", 1e-6, 1e9), _entry("nccl", "all_reduce", 1e-3, 40e9),
               _entry("mpi", "all_to_all", 2e-6, 2e9), _entry("nccl", "all_to_all", 5e-6, 20e9)]
    o = v.evaluate(DLRM, _write(tmp_path, entries))
    assert o["auto_s"] < min(o["nccl_s"], o["mpi_s"])
    assert o["gain_over_nccl"] == pytest.approx(o["nccl_s"] / o["auto_s"] - 1)
    assert o["gain_over_best"] > 0
    # the embedding all-to-all carries per-peer splits (uneven table widths): the profile
    # times it as the even all-to-all of its largest exchange (profilesize.profile_size)
    assert o["uncalibrated"] == []
    assert v.summary([o]).startswith("validate_mcrdl: 1 of 1 MCR-DL gains checked")
    assert "did not time" not in v.summary([o])


def test_collectives_the_profile_lacks_are_listed(tmp_path):
    # no all_to_all entry: the embedding all-to-all keeps the preset model, reported
    entries = [_entry(b, "all_reduce", 20e-6, 20e9) for b in ("mpi", "nccl")]
    o = v.evaluate(DLRM, _write(tmp_path, entries))
    assert o["uncalibrated"] == ["emb.all_to_all[4 MiB] (nccl_p2p)"]
    assert "1 with collectives the profile did not time" in v.summary([o])


def test_a_profile_without_mpi_is_refused(tmp_path, capsys):
    _write(tmp_path, [_entry("nccl", op, 5e-6, 20e9) for op in OPS])
    assert v.main(["--only", "dlrm", "--profiles", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profile") and "missing: ['mpi']" in err


@pytest.mark.parametrize("argv, needle", [
    (["--only", "bert"], "--only 'bert' is not a workload; allowed: ds-moe, megatron-ds, dlrm"),
    (["--profiles", "/nonexistent/dir"], "--profiles '/nonexistent/dir' is not a directory"),
])
def test_bad_arguments_are_named(argv, needle, capsys):
    assert v.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_write_docs_replaces_only_its_block(tmp_path, monkeypatch, capsys):
    import public_runs
    doc = tmp_path / "validation.md"
    doc.write_text("before\n<!-- validate_mcrdl: begin -->\nold\n<!-- validate_mcrdl: end -->\nafter\n")
    monkeypatch.setattr(public_runs, "DOC", doc)
    assert v.main(["--only", "dlrm", "--profiles", str(tmp_path), "--write-docs"]) == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- validate_mcrdl: begin -->\n\n| workload |")
    assert "old" not in text and text.endswith("<!-- validate_mcrdl: end -->\nafter\n")
    assert "| dlrm | thetagpu (4 nodes) | +25 % |" in text

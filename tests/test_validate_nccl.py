"""The nccl-tests validation (benchmarks/validate_nccl.py): its data's provenance and roles,
forced algorithms NCCL can run, and the script's summary. No accuracy bounds (as for the other
public validations): the figures are reported in docs/comm.md and docs/validation.md."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("validate_nccl", BENCH / "validate_nccl.py")
vn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vn)
ROWS = vn.rows()
HEADER = "\n".join(ln for ln in vn.DATA.read_text().splitlines() if ln.startswith("#"))


def test_every_source_is_cited_in_the_header():
    for source in {r["source"] for r in ROWS}:
        assert re.search(rf"^# {source}:", HEADER, re.M), source


def test_roles_and_sizes():
    assert {r["role"] for r in ROWS} == {"fitted", "held-out"}
    assert all(int(r["size_bytes"]) > 0 and float(r["busbw_GBps"]) > 0 for r in ROWS)
    # the fitted rows are those measured.py names: nccl212's all-reduce, nccl290, nccl309a
    fitted = {(r["source"], r["op"]) for r in ROWS if r["role"] == "fitted"}
    assert fitted == {("nccl212", "all_reduce"), ("nccl290", "all_reduce"),
                      ("nccl309a", "all_reduce")}


@pytest.mark.parametrize("row", [r for r in ROWS if r["algorithm"]],
                         ids=lambda r: f"{r['source']}-{r['gpus']}-{r['algorithm']}")
def test_a_forced_algorithm_is_one_nccl_runs_there(row):
    """A row that forced NCCL_ALGO names an algorithm NCCL runs on that group (NVLS: more
    than 2 GPUs of a node, src/transport/nvls.cc), so ddlsim times it rather than refusing."""
    busbw, label = vn.predicted_busbw(row, "analytical")
    assert busbw > 0 and label.startswith(row["algorithm"] + "/")


def test_summary_gives_roles_and_the_worst_per_size():
    errors = {"fitted": [0.01], "held-out": [-0.2, 0.1], "size:1048576": [0.1, -0.2],
              "size:4194304": [0.01]}
    text = vn.summary(errors, "analytical")
    assert "held-out (validation): 2 measurements" in text
    assert "worst per size: 1 MiB -20.0% (2), 4 MiB +1.0% (1)" in text

"""benchmarks/validate_memory.py: its data (torchtitan's published H100 peak memory), the
mapping of each row onto a run config, and that every expressible row runs.

Like tests/test_validation_public.py, no accuracy bound: the figures are reported by the script
(docs/memory.md); these tests pin the data and the mapping, derived by hand from the sources.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vm = _load("validate_memory")
pr = _load("public_runs")
ROWS = pr.read_csv(vm.TABLE)


def test_the_data_cites_its_source_and_what_the_column_measures():
    head = pr.header(vm.TABLE)
    for must in ("llama3_h100_202412_torchtitan.md", "9dec370", "reserved_bytes.all.peak",
                 "maximum over all GPUs"):
        assert must in head


def test_the_rows_are_the_published_tables():
    """18 rows in Tables 1-6; the product of the parallel degrees is the GPU count, and the
    global batch is the local batch times the FSDP degree (the tables' own arithmetic)."""
    assert len(ROWS) == 18
    assert [r["memory_gib"] for r in ROWS if r["table"] == "5"] == ["82.5", "72.7"]
    for r in ROWS:
        degrees = int(r["dp_shard"]) * int(r["cp"]) * int(r["tp"]) * int(r["pp"])
        assert degrees == int(r["gpus"]), r
        assert int(r["global_batch"]) == int(r["local_batch"]) * int(r["dp_shard"]), r


def test_torchtitans_split_points():
    """generate_split_points at 9dec370: 126 layers over 8 stages is 15, 16 × 6, 15; 32
    over 4 is even."""
    assert vm.split_points(126, 8) == (15, 15)
    assert vm.split_points(32, 4) == (8, 8)


def test_a_pipelined_row_maps_onto_torchtitans_defaults():
    row = next(r for r in ROWS if r["table"] == "5" and r["schedule"] == "1f1b")
    cfg = vm.config(row)
    par, train = cfg["parallel"], cfg["train"]
    assert train["micro_batch_size"] == 32 // 8          # one micro-batch per stage
    assert (par["num_layers_in_first_pipeline_stage"],
            par["num_layers_in_last_pipeline_stage"]) == (15, 15)
    assert par["zero_stage"] == 3 and par["sequence_parallel"] is True
    assert cfg["system"]["software"] == {"stack": "torchtitan-2024", "compile": True}
    assert train["dtype"] == "fp8" and train["recompute"] == "full"


def test_every_row_ddlsim_can_express_runs():
    """The script evaluates every row; the one left out is the interleaved 405B row, whose
    torchtitan split (7, 8 × 14, 7 over 16 stages) ddlsim's interleaved schedule cannot say."""
    out = vm.evaluate()
    skipped = [vm.label(o) for o in out if o["memory"] is None]
    assert skipped == ["T5 405b Interleaved 1F1B"]
    assert all(o["memory"].reserved > 0 for o in out if o["memory"] is not None)


def test_the_zero_tutorial_rows_and_their_verdicts():
    """The tutorial's three runs: 1.5B (48 x 1600) OOM without ZeRO and trained with ZeRO-1
    on 8 GPUs, 10B (50 x 4096) trained with ZeRO-2 on 32; each row's config says so and the
    script reports ddlsim's verdict and its largest fitting model for each."""
    rows = pr.read_csv(vm.FITS)
    assert [(r["layers"], r["hidden"], r["zero_stage"], r["fits"]) for r in rows] == [
        ("48", "1600", "0", "0"), ("48", "1600", "1", "1"), ("50", "4096", "2", "1")]
    cfg = vm.fits_config(rows[0])
    assert cfg["train"]["seq_length"] == 1024 and cfg["train"]["recompute"] == "full"
    assert cfg["system"]["preset"] == "dgx2-v100" and cfg["model"]["vocab_size"] == 50304
    out = vm.evaluate_fits()
    assert len(out) == 3 and all(o["largest_layers"] > 0 for o in out)
    # more ZeRO, more layers fit at the same width (the scan is monotone)
    assert out[1]["largest_layers"] > out[0]["largest_layers"]

"""benchmarks/validate_memory.py: its data (torchtitan's published H100 peak memory), the
mapping of each row onto a run config, and that every expressible row runs.

Like tests/test_validation_public.py, no accuracy bound: the figures are reported by the script
(docs/memory.md); these tests pin the data and the mapping, derived by hand from the sources.
"""

from __future__ import annotations

from benchscripts import load_script

vm = load_script("validate_memory")
pr = load_script("public_runs")
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


def test_a_pipelined_row_maps_onto_torchtitans_defaults():
    row = next(r for r in ROWS if r["table"] == "5" and r["schedule"] == "1f1b")
    cfg = vm.config(row)
    par, train = cfg["parallel"], cfg["train"]
    assert train["micro_batch_size"] == 32 // 8          # pipeline_parallel_degree of them
    assert par["layers_per_virtual_stage"] == [15] + [16] * 6 + [15]
    assert par["zero_stage"] == 3 and par["sequence_parallel"] is True
    assert cfg["system"]["software"] == {"stack": "torchtitan-2024", "compile": True}
    assert train["dtype"] == "fp8" and train["recompute"] == "full"


def test_every_row_runs_the_interleaved_one_with_torchtitans_split():
    """The interleaved 405B row: 16 virtual stages, two per rank, 7, 8 × 14, 7 layers
    (9dec370 generate_split_points), 8 micro-batches of 4."""
    row = next(r for r in ROWS if r["schedule"] == "interleaved")
    cfg = vm.config(row)
    assert cfg["parallel"]["layers_per_virtual_stage"] == [7] + [8] * 14 + [7]
    assert cfg["train"]["micro_batch_size"] == 4
    out = vm.evaluate()
    assert all(o["memory"] is not None and o["memory"].reserved > 0 for o in out)


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


def test_eager_loss_what_if_moves_only_the_compiled_loss_rows(capsys):
    """``--eager-loss``: the H200 rows (torchtitan 2025 compiles the loss: 4 B per logit) with
    the eager loss's 12 B (docs/memory.md's +32.3 / +31.1 %); the registry is restored after."""
    import pytest
    from ddlsim.workloads.framework_memory import FRAMEWORKS

    before = dict(FRAMEWORKS)
    h200 = ((vm.H200, "torchtitan-2025"),)
    compiled = vm.evaluate(h200)[0]
    with vm.eager_loss():
        eager = vm.evaluate(h200)[0]
    assert FRAMEWORKS == before
    # 2 x 8,192 tokens x 128,256 logits x 8 B more per logit: 15.7 GiB on a ~48 GiB row
    extra = 2 * 8192 * 128256 * (12 - 4)
    assert eager["memory"].reserved - compiled["memory"].reserved == pytest.approx(extra, rel=0.1)
    with pytest.raises(SystemExit) as exc:
        vm.main(["--eager-loss", "--write-docs"])
    assert exc.value.code == 2 and "--write-docs" in capsys.readouterr().err

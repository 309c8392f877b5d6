"""The report speaks each family's plan: the header's plan line (WorkloadFamily.plan_summary),
the communication table's group kinds and labels, and no floating-point residues."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console

import ddlsim
from ddlsim.report import RESIDUE, _breakdown_table, _comm_table, displayed, render_results

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _plan(path: str, *sets: str) -> str:
    cfg = ddlsim.load_config(path, list(sets))
    return cfg.family.plan_summary(cfg)


def _text(renderable) -> str:
    console = Console(record=True, width=400, color_system=None, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


# ----------------------------------------------------------------------------- plan lines
def test_decoder_line_is_megatron_line_unchanged():
    # llama2-70b-64-h100.yaml: 8 nodes × 8 = 64 ranks = TP4 · PP4 · DP4; 1024 / (1 · 4) = 256
    # micro-batches per replica. The exact line the report printed before the hook existed,
    # then the overlaps of the default stack (megatron-core-2024: grad-reduce, param-gather
    # and p2p on, all applicable to this ZeRO-1 pipelined plan; tp_comm_overlap off, so the
    # backward's sequence-parallel collectives overlap through NCCL: tp-async backward),
    # after the gradient dtype when it is not the parameters' (bf16 on Megatron: fp32 main
    # grads); sequence parallelism named after TP, and DDP's update left unnamed (the seed
    # wiki's others are named), since 2026-12-02.
    assert _plan("examples/llama2-70b-64-h100.yaml") == (
        "TP4 SP × PP4(v20) × DP4 = 64 ranks, interleaved, ZeRO-1, micro-batch "
        "1 × 256 per replica, global batch 1024, seq 4096, bf16, recompute selective, "
        "fp32 grads, overlaps: grad-reduce, param-gather, p2p, tp-async backward")


def test_fp16_on_megatron_keeps_fp16_grads_and_says_nothing():
    line = _plan("examples/megatron-1t-3072-a100.yaml")
    assert "fp16, recompute full, overlaps" in line and "grads" not in line


@pytest.mark.parametrize("example, axes", [
    ("examples/tp-2d-64.yaml", "TP64 2-D [8,8]"),        # q = 8: 8² = 64 ranks
    ("examples/tp-2p5d-64.yaml", "TP64 2.5-D [4,4,4]"),  # q = 4, d = 4: 4² · 4 = 64
    ("examples/tp-3d-64.yaml", "TP64 3-D [4,4,4]"),      # q = 4: 4³ = 64
])
def test_decoder_line_names_the_tensor_parallel_grid(example, axes):
    assert _plan(example).startswith(f"{axes} × PP1 × DP1 = 64 ranks, 1f1b, ZeRO-0")


@pytest.mark.parametrize("comm, word", [("p2p", "ring"), ("all_gather", "all-gather")])
def test_decoder_line_shows_context_parallelism(comm, word):
    # 4 nodes × 8 H100 = 32 ranks = TP8 · CP4 · PP1 · DP1: CP is what makes up the 32
    line = _plan("examples/cp-ring-llama3-8b-128k.yaml", f"parallel.cp_comm_type={comm}",
                 "system.software=megatron-core-2025")   # 2024's TE has the ring only
    assert line.startswith(f"TP8 SP × CP4 {word} × PP1 × DP1 = 32 ranks, 1f1b")


def test_cosmoflow_line_names_grid_halos_and_no_decoder_terms():
    # cosmoflow.yaml: grid 2×2×1 (4 ranks per sample) × 4 replicas = 16 ranks; 32 / (8 · 4) = 1
    assert _plan("examples/proxies/cosmoflow.yaml") == (
        "spatial grid 2×2×1 × DP4 = 16 ranks, halos (forward previous_output, input loaded, "
        "backward after_compute, no overlap), conv gradients all-reduced over all ranks, "
        "micro-batch 8 × 1 per replica, global batch 32, fp32")
    line = _plan("examples/proxies/cosmoflow.yaml", "model.spatial_grid=[1,1,1]",
                 "parallel.tensor_model_parallel_size=1", "parallel.data_parallel_size=16",
                 "train.global_batch_size=128")
    assert line.startswith("spatial grid 1×1×1 × DP16 = 16 ranks, conv gradients")  # no halos


def test_dlrm_line_names_sharding_and_ranks():
    # dlrm.yaml: 4 ranks, 2048 / (512 · 4) = 1 micro-batch
    line = _plan("examples/proxies/dlrm.yaml")
    assert line == ("4 ranks: embeddings table_wise over all of them (exchange not overlapped), "
                    "MLPs DP4 (gradient all-reduce overlapped), micro-batch 512 × 1 per rank, "
                    "global batch 2048, fp32")
    assert not any(w in line for w in ("TP", "PP", "ZeRO", "seq", "1f1b", "recompute"))


def test_resnet_and_bert_lines_name_their_buckets():
    # resnet50_ring.yaml: grad_buckets lists 6 buckets; 1024 / (32 · 32) = 1
    assert _plan("examples/proxies/resnet50_ring.yaml") == (
        "DP32 = 32 ranks, 6 listed buckets, ring send/recv after the backward, micro-batch "
        "32 × 1 per replica, global batch 1024, fp32")
    # DDP's rule: PyTorch's bucket_cap_mb = 25 MiB (config default)
    assert "DDP buckets of 25.0 MiB, all-reduce overlapped" in _plan(
        "examples/proxies/resnet50_ring.yaml", "model.grad_buckets=ddp",
        "model.grad_sync=allreduce", "parallel.overlap_grad_reduce=true")
    # bert_large.yaml: PP4 × DP8 = 32 ranks; 512 / (8 · 8) = 8 micro-batches per replica
    assert _plan("examples/proxies/bert_large.yaml") == (
        "PP4 × DP8 = 32 ranks, gpipe, one bucket per layer, all-reduce after the backward, "
        "micro-batch 8 × 8 per replica, global batch 512, seq 128, fp32")


def test_header_prints_the_family_line():
    cfg = ddlsim.load_config("examples/proxies/dlrm.yaml")
    console = Console(record=True, width=400, color_system=None, file=open("/dev/null", "w"))
    render_results(console, cfg, [ddlsim.predict(cfg)])
    text = console.export_text()
    assert f"(dgx-a100) — {cfg.family.plan_summary(cfg)}\n" in text
    assert "Memory per device (every rank)" in " ".join(text.split())  # not "stage 0"


# ----------------------------------------------------------------------- residues hidden
def test_parts_below_the_residue_are_zero():
    assert RESIDUE == 1e-9
    assert displayed(1.7e-18, 0.0938) == 0.0             # cosmoflow's bubble residue
    assert displayed(5e-11, 0.1) == 0.0                   # 5e-10 of the iteration
    assert displayed(2e-10, 0.1) == 2e-10                 # 2e-9 of it: shown
    assert displayed(1e-6, 0.1) == 1e-6                   # 1e-5 of it: shown


def test_residue_rows_are_hidden_and_predictions_kept():
    cfg = ddlsim.load_config("examples/proxies/cosmoflow.yaml")
    r = ddlsim.predict(cfg)
    assert 0 < r.breakdown.bubble_s < RESIDUE * r.iteration_time_s  # the prediction keeps it
    assert "pipeline bubble" not in _text(_breakdown_table([r]))
    shown = replace(r, breakdown=replace(r.breakdown, bubble_s=1e-3))
    assert "pipeline bubble / wait" in _text(_breakdown_table([shown]))
    # a part residual in one engine and real in the other keeps its row, 0 where residual
    text = _text(_breakdown_table([r, replace(shown, engine="des")]))
    row = next(ln for ln in text.splitlines() if "pipeline bubble" in ln)
    assert "0 s" in row and "1.00 ms" in row


# ----------------------------------------------------------------------- communication
def test_context_parallel_bytes_appear_labelled():
    # 2 layers, s = 8192, CP4, TP8, b = 1, llama3-8b: 8 KV heads of 128 → 1 head per TP rank.
    # K and V of s/cp = 2048 positions in bf16: 2 · 2048 · 128 · 2 B = 1 MiB per hop.
    # Ring: forward cp−1 = 3 hops, backward K/V 3 hops + dK/dV cp = 4 hops → 10 hops per layer
    # and micro-batch; × 2 layers × 4 micro-batches (global 4 / micro 1) = 80 MiB.
    cfg = ddlsim.load_config("examples/cp-ring-llama3-8b-128k.yaml",
                             ["model.num_hidden_layers=2", "train.seq_length=8192"])
    r = ddlsim.predict(cfg)
    assert r.comm_bytes["cp"] == 80 * 2**20
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip()
            for ln in _text(_comm_table(cfg, [r])).splitlines() if ln.count("│") == 3}
    assert rows["cp (ring)"] == "80.0 MiB"


def test_grid_groups_are_named_in_the_tp_row():
    cfg = ddlsim.load_config("examples/tp-2p5d-64.yaml")
    r = ddlsim.predict(cfg)
    assert "tp (2.5-D [4,4,4]: tp_dep, tp_col, tp_row)" in _text(_comm_table(cfg, [r]))


def test_every_kind_with_bytes_in_any_engine_is_listed():
    cfg = ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml")
    r = ddlsim.predict(cfg)
    other = replace(r, engine="des", comm_bytes={**r.comm_bytes, "cp": 2.0 * 2**20})
    text = _text(_comm_table(cfg, [r, other]))
    assert "bytes (analytical)" in text and "bytes (des)" in text
    cp = next(ln for ln in text.splitlines() if ln.startswith("│ cp"))
    assert "0 B" in cp and "2.00 MiB" in cp
    assert not any(ln.startswith("│ tp") for ln in text.splitlines())  # TP1: no bytes, no row



def test_decoder_line_names_expert_parallelism_within_data_parallelism():
    """Mixtral example: TP1 × PP4 on 64 GPUs leaves DP16, out of which EP8 is carved."""
    line = _plan("examples/mixtral-8x7b-ep8.yaml")
    assert line.startswith("TP1 × PP4(v8) × DP16 (EP8) = 64 ranks, interleaved")
    assert "(EP" not in _plan("examples/llama2-70b-64-h100.yaml")

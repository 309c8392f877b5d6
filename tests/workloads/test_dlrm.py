"""The dlrm family: parameter counts, per-layer FLOPs, sharding, all-to-all sizes, memory,
the sparse update, engine agreement and refusals.

Every pinned number is derived in its comment from the presets' sources
(``ddlsim/data/dlrm.yaml``) or from the formulas of ``ddlsim/workloads/dlrm/shape.py``.
"""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.commprofile import comm_profile
from ddlsim.errors import ConfigError
from ddlsim.workloads.dlrm.schema import DLRMModel
from ddlsim.workloads.dlrm.shape import DLRMShape, shard_tables
from ddlsim.workloads.registry import get_family
from ddlsim.workloads.trace import Collective, Compute

MLPERF_ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
               405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152,
               12973, 108, 36]  # mlcommons/training recommendation_v2 README --num_embeddings_per_feature
MLPERF_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def preset(name: str, **over) -> DLRMModel:
    return DLRMModel.model_validate({**get_family("dlrm").presets()[name], **over})


def run(model: dict | str = "dlrm-proxy", ranks: int = 4, mb: int = 512, nodes: int = 1,
        **train) -> dict:
    return {"model": model, "parallel": {"data_parallel_size": ranks},
            "train": {"micro_batch_size": mb, "global_batch_size": mb * ranks, "seq_length": 1,
                      "dtype": "fp32", "optimizer": "sgd", **train},
            "system": {"preset": "dgx-a100", "nodes": nodes}}


def ops_of(wl, cls: int = 0):
    return {o.payload.name: o.payload for b in wl.classes[cls].program.blocks.values()
            for o in b.flat.ops}


# ------------------------------------------------------------------ parameter counts
def test_proxy_dlrm_parameters():
    # tables 4 · 80,000 · 128 = 40,960,000; bottom 3 · (128² + 128) = 49,536; top with input
    # 128 + 5·4/2 = 138: 728,065 (derivation in test_proxy_dlrm.py) → 41,737,601
    sh = DLRMShape(preset("dlrm-proxy"))
    assert sh.embedding_params == 40_960_000
    assert [l.params for l in sh.bottom] == [16_512] * 3
    assert sh.interaction_out == 138
    assert sum(l.params for l in sh.top) == 728_065
    assert sh.params == 41_737_601


def test_mlperf_dcnv2_parameters():
    # Σ rows = 5·40,000,000 + 4,184,588 = 204,184,588; × 128 = 26,135,627,264.
    # bottom 13→512→256→128: 7,168 + 131,328 + 32,896 = 171,392.
    # D = 128 + 26·128 = 3,456; 3 low-rank cross layers of rank 512: 3·(2·3,456·512 + 3,456)
    # = 3 · 3,542,400 = 10,627,200.
    # top 3,456→1024→1024→512→256→1: 3,539,968 + 1,049,600 + 524,800 + 131,328 + 257
    # = 5,245,953. Dense 16,044,545; total 26,151,671,809.
    m = preset("mlperf-dlrm-dcnv2")
    assert [t.rows for t in m.tables] == MLPERF_ROWS
    assert [t.pooling for t in m.tables] == MLPERF_HOT
    sh = DLRMShape(m)
    assert sum(MLPERF_ROWS) == 204_184_588
    assert sh.embedding_params == 26_135_627_264
    assert sum(l.params for l in sh.bottom) == 171_392
    assert sh.cross_width == 3_456 and sh.cross_params == 10_627_200
    assert sum(l.params for l in sh.top) == 5_245_953
    assert sh.params == 26_151_671_809


def test_full_rank_cross_layer_and_cat_interaction():
    # full-rank DCN layer on D features: D² + D; cat: F·d wide
    m = preset("dlrm-proxy", interaction="dcnv2", cross_layers=2)
    sh = DLRMShape(m)
    D = 128 + 4 * 128
    assert sh.cross_params == 2 * (D * D + D)
    assert sh.interaction_flops(10) == 10 * 2 * 2.0 * D * D
    assert DLRMShape(preset("dlrm-proxy", interaction="cat")).interaction_out == 5 * 128


# ------------------------------------------------------------------ per-layer FLOPs
def test_per_layer_flops_of_one_micro_batch():
    # b = 512 per rank. Bottom layer: 2·512·128·128 = 16,777,216 forward; backward 2× except
    # the first layer (no gradient for the dense input): 1×. Dot interaction: the batched
    # X·Xᵀ of F = 5 vectors of 128: 2·512·25·128 = 3,276,800, backward the same.
    # Top layer 0: 2·512·138·512 = 72,351,744.
    wl = build_workload(ddlsim.load_config(run("dlrm-proxy")))
    ops = ops_of(wl)
    assert ops["bottom.0.fwd"].flops == ops["bottom.2.fwd"].flops == 16_777_216
    assert ops["bottom.0.bwd"].flops == 16_777_216
    assert ops["bottom.1.bwd"].flops == 2 * 16_777_216
    assert ops["interaction.fwd"].flops == ops["interaction.bwd"].flops == 3_276_800
    assert ops["top.0.fwd"].flops == 72_351_744
    assert ops["top.0.bwd"].flops == 2 * 72_351_744


def test_dcnv2_cross_flops():
    # low rank r: two GEMMs D→r→D per layer, 4·D·r per sample; backward twice that
    sh = DLRMShape(preset("mlperf-dlrm-dcnv2"))
    assert sh.interaction_flops(1) == 3 * 4.0 * 3456 * 512
    assert sh.interaction_backward_flops(1) == 2 * sh.interaction_flops(1)


def test_embedding_lookup_and_sparse_update_cost():
    # proxy table on one rank, all 2048 global samples, pooling 5.05: 10,342.4 lookups of 128
    # elements = 1,323,827.2 adds; the fused backward scatters them (1 FLOP each) and applies
    # SGD to the touched rows (rows touched = batch × pooling: 2 FLOPs per element).
    ops = ops_of(build_workload(ddlsim.load_config(run("dlrm-proxy"))))
    look = 2048 * 5.05
    assert ops["embedding.fwd"].flops == pytest.approx(look * 128)
    assert ops["embedding.bwd+update"].flops == pytest.approx(look * 128 * 3)
    ada = run({"preset": "dlrm-proxy", "embedding_optimizer": "adagrad"})
    # adagrad: 2 + 5 FLOPs per element, plus the scatter
    ops = ops_of(build_workload(ddlsim.load_config(ada)))
    assert ops["embedding.bwd+update"].flops == pytest.approx(look * 128 * 8)


# ------------------------------------------------------------------ sharding
def test_table_wise_runs_and_row_and_column_splits():
    m = preset("mlperf-dlrm-dcnv2")
    # 26 tables on 13 ranks: two contiguous tables each (get_my_slice)
    tw = shard_tables(preset("mlperf-dlrm-dcnv2", sharding="table_wise"), 13)
    assert [[s.table for s in r] for r in tw][:2] == [[0, 1], [2, 3]]
    # row-wise on 8: table 5 has 3 rows → ranks 0-2 one row each, the rest none;
    # 40,000,000 rows → 5,000,000 each, a fraction 1/8 of the lookups
    rw = shard_tables(m, 8)
    assert [r[5].rows for r in rw] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert rw[7][0].rows == 5_000_000 and rw[7][0].fraction == 1 / 8
    # column-wise on 4: 32 columns of every table per rank
    cw = shard_tables(preset("dlrm-proxy", sharding="column_wise"), 4)
    assert {s.dim for r in cw for s in r} == {32} and len(cw[0]) == 4


def test_row_wise_exchanges_partial_sums_with_reduce_scatter_and_all_gather():
    # row-wise on 4 ranks: every rank sums its rows of the 4 tables for all 2048 samples:
    # reduce-scatter input 2048 · 4·128 · 4 B = 4,194,304; backward all-gather of the same
    cfg = ddlsim.load_config(run({"preset": "dlrm-proxy", "sharding": "row_wise"}))
    ops = ops_of(build_workload(cfg))
    assert ops["embedding.reduce_scatter"].bytes == 2048 * 512 * 4
    assert ops["embedding.all_gather"].bytes == 2048 * 512 * 4
    prof = comm_profile(build_workload(cfg))
    rs = prof[prof.op == "ireduce_scatter"]  # overlapped: on the embedding stream
    assert set(rs.send_bytes) == {4_194_304} and set(rs.recv_bytes) == {4_194_304 // 4}


def test_column_wise_all_to_all_sends_a_quarter_of_every_table():
    # 4 tables × 32 columns × 2048 samples × 4 B = 1,048,576 per rank and direction
    cfg = ddlsim.load_config(run({"preset": "dlrm-proxy", "sharding": "column_wise"}))
    assert ops_of(build_workload(cfg))["embedding.all_to_all.fwd"].bytes == 1_048_576


# ------------------------------------------------------------------ memory
def test_memory_of_a_proxy_rank():
    # fp32, SGD (one momentum per dense parameter), table-wise: rank holds one table.
    # weights 80,000·128·4 = 40,960,000 + 777,601·4 = 3,110,404 → 44,070,404
    # gradients: dense 3,110,404 + sparse, one row per lookup: 2048·5.05·128·4 = 5,295,308.8
    # optimizer: dense momentum 3,110,404; embedding sgd: none
    # other: indices 2048·5.05·8 = 82,739.2
    mem = ddlsim.memory_per_device(ddlsim.load_config(run("dlrm-proxy")))
    assert mem.weights == 44_070_404
    assert mem.gradients == pytest.approx(3_110_404 + 5_295_308.8)
    assert mem.optimizer == 3_110_404
    assert mem.other == pytest.approx(82_739.2)


def test_embedding_optimizer_state():
    # adagrad: one fp32 accumulator per element (80,000·128·4 = 40,960,000);
    # row-wise adagrad: one per row (80,000·4 = 320,000)
    def opt(name):
        return ddlsim.memory_per_device(ddlsim.load_config(
            run({"preset": "dlrm-proxy", "embedding_optimizer": name}))).optimizer
    assert opt("adagrad") - opt("sgd") == 40_960_000
    assert opt("rowwise_adagrad") - opt("sgd") == 320_000


def test_mlperf_row_wise_memory_on_eight_gpus():
    # rank 0 holds ⌈rows/8⌉ of each table with a remainder: Σ_t ⌈rows_t/8⌉ if rank 0 < rows_t
    # mod 8; adagrad doubles the table bytes (fp32 accumulator per element)
    cfg = ddlsim.load_config(run({"preset": "mlperf-dlrm-dcnv2"}, ranks=8, mb=8192))
    rows0 = sum(r // 8 + (r % 8 > 0) for r in MLPERF_ROWS)
    mem = ddlsim.memory_per_device(cfg)
    assert mem.weights == rows0 * 128 * 4 + 16_044_545 * 4
    assert mem.optimizer == rows0 * 128 * 4 + 16_044_545 * 4


# ------------------------------------------------------------------ engines
@pytest.mark.parametrize("model", [
    "dlrm-proxy",
    {"preset": "dlrm-proxy", "sharding": "row_wise"},
    {"preset": "dlrm-proxy", "overlap_embedding_all_to_all": False},
    {"preset": "mlperf-dlrm-dcnv2", "sharding": "column_wise"},
], ids=["table_wise-overlap", "row_wise", "blocking", "dcnv2-column_wise"])
def test_des_and_analytical_agree_without_contention(model):
    # one DGX A100 node, gradient all-reduces after the backward (overlap_grad_reduce: false):
    # one collective at a time, each pair of ranks on its own NVSwitch ports
    cfg = run(model)
    cfg["parallel"]["overlap_grad_reduce"] = False
    cfg = ddlsim.load_config(cfg)
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)
    assert d.comm_bytes == a.comm_bytes


def test_overlapped_all_reduce_and_all_to_all_share_links_in_the_des_only():
    # with the Iallreduces running beside the backward all-to-all, the DES shares the NVSwitch
    # ports between them; contention can only slow it down
    cfg = ddlsim.load_config(run("dlrm-proxy"))
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s >= a.iteration_time_s * (1 - 1e-9)


def test_two_micro_batches_reduce_gradients_once():
    cfg = ddlsim.load_config({**run("dlrm-proxy", mb=256), "train": {
        "micro_batch_size": 256, "global_batch_size": 2048, "seq_length": 1, "dtype": "fp32"}})
    prof = comm_profile(build_workload(cfg))
    # the model overlaps its all-to-all and DDP its all-reduce: both non-blocking (i…)
    assert set(prof[prof.op == "ialltoall"].calls) == {4}
    assert set(prof[prof.op == "iallreduce"].calls) == {2}


# ------------------------------------------------------------------ refusals
def _error(model=None, **kw) -> str:
    cfg = run(model or "dlrm-proxy", **kw.pop("run", {}))
    for path, value in kw.items():
        section, key = path.split("__")
        cfg[section] = {**cfg[section], key: value}
    with pytest.raises(ConfigError) as exc:
        ddlsim.load_config(copy.deepcopy(cfg))
    msg = str(exc.value)
    assert "\n" not in msg.strip() and "Traceback" not in msg
    return msg


@pytest.mark.parametrize("model,run_kw,words", [
    ({"preset": "dlrm-proxy", "sharding": "column_wise"}, {"ranks": 3}, ["[128]", "divisible"]),
    ({"preset": "dlrm-proxy", "compute": "proxy"}, {}, ["missing", "embedding_forward"]),
    ({"preset": "dlrm-proxy", "proxy_timings": {"optimizer": "0 s"}}, {}, ["compute = 'model'"]),
    ({"preset": "dlrm-proxy", "compute": "proxy", "proxy_timings": {"embeding_forward": "1 us"}},
     {}, ["embedding_forward", "unknown"]),
    ({"preset": "dlrm-proxy", "bottom_mlp": [64]}, {}, ["dot", "[128]", "64"]),
    ({"preset": "dlrm-proxy", "cross_layers": 3}, {}, ["dcnv2"]),
    ({"preset": "dlrm-proxy", "interaction": "dcnv2"}, {}, ["cross_layers"]),
    ({"preset": "dlrm-proxy", "tables": []}, {}, ["tables"]),
    ({"preset": "dlrm-proxy", "sharding": "diagonal"}, {}, ["model.sharding", "'row_wise'"]),
    ({"preset": "dlrm-proxy", "tables": [{"rows": 0}]}, {}, ["model.tables.0.rows", "got 0"]),
])
def test_bad_models_are_refused_in_one_paragraph(model, run_kw, words):
    msg = _error(model, run=run_kw)
    for w in words:
        assert w in msg, msg


def test_bad_plans_are_refused_in_one_paragraph():
    assert "tensor_model_parallel_size = 2" in _error(
        parallel__tensor_model_parallel_size=2, parallel__data_parallel_size=2)
    assert "seq_length = 8" in _error(train__seq_length=8)
    assert "zero_stage = 1" in _error(parallel__zero_stage=1)


def test_unit_bearing_timing_is_parsed_and_bad_units_refused():
    base = {"preset": "dlrm-proxy", "compute": "proxy",
            "proxy_timings": {k: "1 us" for k in ("embedding_forward", "bottom_mlp_forward",
                                                  "interaction_forward", "top_mlp_forward",
                                                  "top_mlp_backward", "interaction_backward",
                                                  "bottom_mlp_backward", "embedding_backward",
                                                  "optimizer")}}
    cfg = ddlsim.load_config(run(base))
    assert cfg.model.proxy_timings["optimizer"] == pytest.approx(1e-6)
    bad = copy.deepcopy(base)
    bad["proxy_timings"]["optimizer"] = "1 GB"
    assert "proxy_timings.optimizer" in _error(bad)


def test_every_rank_class_issues_the_same_exchange_sizes():
    # a split that is even in width but uneven in rows (row-wise 40M-row tables over 3 ranks)
    # gives rank classes with different memory, never different collective sizes
    cfg = ddlsim.load_config(run({"preset": "mlperf-dlrm-dcnv2"}, ranks=3, mb=1024))
    wl = build_workload(cfg)
    sizes = {(p.name, p.bytes) for c in wl.classes for b in c.program.blocks.values()
             for p in (o.payload for o in b.ops) if isinstance(p, Collective)}
    assert len({n for n, _ in sizes}) == len(sizes)
    assert any(isinstance(o.payload, Compute) for o in wl.classes[0].program.blocks["F"].ops)


def test_backward_all_to_all_follows_the_interaction_not_the_cross_all_reduce():
    # DCN-v2 with overlap: the cross network's all-reduce (dp stream) and the gradient
    # all-to-all (a2a stream) both wait for the interaction's backward, not for each other
    cfg = ddlsim.load_config(run({"preset": "mlperf-dlrm-dcnv2", "sharding": "column_wise"}))
    ops = build_workload(cfg).classes[0].program.blocks["BL"].ops
    names = [o.payload.name for o in ops]
    inter = names.index("interaction.bwd")
    for name in ("cross_net.grad.all_reduce", "embedding.all_to_all.bwd"):
        assert ops[names.index(name)].deps == (inter,)
    assert ops[names.index("top_mlp.grad.all_reduce")].deps == (names.index("top.0.bwd"),)
    assert ops[names.index("bottom_mlp.grad.all_reduce")].deps == (names.index("bottom.0.bwd"),)

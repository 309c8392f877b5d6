"""Layer partitioners (1-D, 2-D, 2.5-D, 3-D) against closed forms derived by hand.

Setting used throughout (64 ranks): a GPT layer with h = 1024, 64 heads, f = 4h, micro-batch
b = 16, sequence s = 512, bf16 (e = 2 bytes). The layer's four GEMMs ``(M, N, K)`` with
``M = b·s = 8192``: qkv (3h, h), proj (h, h), fc1 (4h, h), fc2 (h, 4h). Two sums recur:

    ΣMK = M·(h + h + h + 4h) = 7·M·h        (the activation operand A of each GEMM)
    ΣKN = 3h² + h² + 4h² + 4h² = 12·h²     (the weight operand B)
    ΣMN = M·(3h + h + 4h + h) = 9·M·h       (the output C)

Volumes are the nccl-tests sizes of docs/trace.md, summed per rank over one layer's forward
and backward (docs/tensor_parallel.md derives the per-GEMM forms quoted in each test).
"""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest

import ddlsim
from ddlsim.workloads.decoder.partition import make_partitioner, partitioners
from ddlsim.workloads.decoder.plan import resolve_plan
from ddlsim.workloads.trace import Collective, Compute, Loop

H, B, S, E = 1024, 16, 512, 2
M = B * S
SUM_MK, SUM_KN, SUM_MN = 7 * M * H, 12 * H * H, 9 * M * H

BASE = {
    "model": {"architecture": "gpt", "num_hidden_layers": 2, "hidden_size": H,
              "num_attention_heads": 64, "vocab_size": 32768, "max_position_embeddings": 2048},
    "train": {"micro_batch_size": B, "global_batch_size": B, "seq_length": S},
    "system": {"preset": "dgx-a100", "nodes": 8},
}


def config(parallel: dict, **over) -> ddlsim.RunConfig:
    d = copy.deepcopy(BASE)
    d["parallel"] = parallel
    for key, value in over.items():
        section, field = key.split("__")
        d[section][field] = value
    return ddlsim.load_config(d)


def layer(cfg) -> tuple[list, list]:
    part = make_partitioner(resolve_plan(cfg, cfg.model.shape()))
    return part.layer_forward(), part.layer_backward(0.0)


def volumes(*op_lists) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for ops in op_lists:
        for op in ops:
            if isinstance(op.payload, Collective):
                out[op.payload.group] += op.payload.bytes * op.repeat
    return dict(out)


def flops(ops) -> float:
    return sum(op.payload.flops * op.repeat for op in ops if isinstance(op.payload, Compute))


# ---------------------------------------------------------------- the registry and the config
def test_registry_holds_the_four_schemes():
    assert set(partitioners()) == {"1d", "2d", "2.5d", "3d"}


@pytest.mark.parametrize("spec, size", [({"mode": "1d", "size": 4}, 4),
                                        ({"mode": "2d", "q": 8}, 64),
                                        ({"mode": "2.5d", "q": 4, "d": 4}, 64),
                                        ({"mode": "3d", "q": 4}, 64)])
def test_grid_size_fills_tensor_model_parallel_size(spec, size):
    cfg = config({"tensor_parallel": spec}, train__global_batch_size=B * 64 // size)
    assert cfg.parallel.tp == size and cfg.mesh.size("tp") == size
    assert cfg.dp == 64 // size


# ---------------------------------------------------------------- 1-D
def test_megatron_1d_layer_volume_at_p64():
    # Megatron: g after proj and fc2 (forward), f after fc1 and qkv (backward): four
    # all-reduces of b·s·h·e per layer: 4·M·h·e.
    cfg = config({"tensor_model_parallel_size": 64})
    from ddlsim.workloads.decoder.builder import StageBuilder
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    fwd = [type("O", (), {"payload": x, "repeat": 1}) for x in b.layer_forward()]
    bwd = [type("O", (), {"payload": x, "repeat": 1}) for x in b.layer_backward()]
    assert volumes(fwd, bwd) == {"tp": pytest.approx(4 * M * H * E, rel=1e-12)}


# ---------------------------------------------------------------- 2-D (SUMMA)
def test_summa_bytes_per_rank_per_step():
    # q = 8: the qkv GEMM (N = 3h, K = h) takes q steps; each broadcasts one A block
    # (M/q)·(K/q)·e = 1024·128·2 = 262,144 B along the row and one B block
    # (K/q)·(N/q)·e = 128·384·2 = 98,304 B along the column.
    fwd, _ = layer(config({"tensor_parallel": {"mode": "2d", "q": 8}}))
    a = [op.payload for op in fwd if op.payload.name == "fwd.qkv.bcast_A"]
    b = [op.payload for op in fwd if op.payload.name == "fwd.qkv.bcast_B"]
    assert len(a) == len(b) == 8
    assert {x.bytes for x in a} == {262_144.0} and {x.group for x in a} == {"tp_row"}
    assert {x.bytes for x in b} == {98_304.0} and {x.group for x in b} == {"tp_col"}
    assert [x.root for x in a] == list(range(8))     # step l: the owner of panel l


def test_summa_2d_layer_volume_at_p64():
    # Per GEMM: forward q·(MK + KN)/q²; dA = dC·Bᵀ broadcasts B and reduces A-sized blocks,
    # dB = Aᵀ·dC broadcasts A and reduces B-sized blocks: 3·MK/q on rows, 3·KN/q on columns.
    q = 8
    v = volumes(*layer(config({"tensor_parallel": {"mode": "2d", "q": q}})))
    assert v == {"tp_row": pytest.approx(3 * SUM_MK / q * E, rel=1e-12),
                 "tp_col": pytest.approx(3 * SUM_KN / q * E, rel=1e-12)}


def test_tesseract_2p5d_layer_volume_at_p64():
    # [q, q, d] = [4, 4, 4]: A blocks are (M/dq)·(K/q), B blocks (K/q)·(N/q): rows carry
    # 3·MK/(dq), columns 3·KN/q, and each GEMM's dB block KN/q² is all-reduced over depth.
    q, d = 4, 4
    v = volumes(*layer(config({"tensor_parallel": {"mode": "2.5d", "q": q, "d": d}})))
    assert v == {"tp_row": pytest.approx(3 * SUM_MK / (d * q) * E, rel=1e-12),
                 "tp_col": pytest.approx(3 * SUM_KN / q * E, rel=1e-12),
                 "tp_dep": pytest.approx(SUM_KN / q**2 * E, rel=1e-12)}


def test_agarwal_3d_layer_volume_at_p64():
    # q = 4: forward all-gathers A (MK/q²) on x and B (KN/q²) on y, reduce-scatters C (MN/q²)
    # on z; backward all-gathers dC (z) and B (y) again, reduce-scatters dA (x), all-gathers A
    # (x) again, reduce-scatters dB (y): x 3·MK/q², y 3·KN/q², z 2·MN/q².
    q = 4
    v = volumes(*layer(config({"tensor_parallel": {"mode": "3d", "q": q}})))
    assert v == {"tp_x": pytest.approx(3 * SUM_MK / q**2 * E, rel=1e-12),
                 "tp_y": pytest.approx(3 * SUM_KN / q**2 * E, rel=1e-12),
                 "tp_z": pytest.approx(2 * SUM_MN / q**2 * E, rel=1e-12)}


def test_layer_totals_at_p64():
    # The four totals of the tests above, side by side (M·h = 8192·1024 = 2^23, h² = 2^20):
    # 1-D 4Mh = 33.6 M; 2-D 3(7Mh + 12h²)/8 = 26.7 M; 2.5-D 3(7Mh/16 + 12h²/4) + 12h²/16
    # = 21.2 M; 3-D (21Mh + 36h² + 18Mh)/16 = 22.8 M elements. 2.5-D [4,4,4] moves less than
    # 2-D [8,8,1] (the seed paper's claim) and 1-D; 3-D pays for re-gathering A and B in the
    # backward (agarwal_3d's documented choice) and lands between 2.5-D and 2-D here.
    Mh, h2 = M * H, H * H
    one = 4 * Mh
    two = 3 * (7 * Mh + 12 * h2) / 8
    two5 = 3 * (7 * Mh / 16 + 12 * h2 / 4) + 12 * h2 / 16
    three = (21 * Mh + 36 * h2 + 18 * Mh) / 16
    got = {}
    for name, spec in (("2d", {"mode": "2d", "q": 8}), ("2.5d", {"mode": "2.5d", "q": 4, "d": 4}),
                       ("3d", {"mode": "3d", "q": 4})):
        got[name] = sum(volumes(*layer(config({"tensor_parallel": spec}))).values()) / E
    assert got == pytest.approx({"2d": two, "2.5d": two5, "3d": three}, rel=1e-12)
    assert two5 < three < two < one


@pytest.mark.parametrize("spec", [{"mode": "2d", "q": 8}, {"mode": "2.5d", "q": 4, "d": 4},
                                  {"mode": "3d", "q": 4}])
def test_compute_is_conserved(spec):
    # Every scheme gives each of the 64 ranks 1/64 of the layer's forward FLOPs (the GEMMs and
    # the attention core) and twice that in the backward.
    cfg = config({"tensor_parallel": spec})
    fwd, bwd = layer(cfg)
    total = cfg.model.shape().layer_forward_flops(B, S)
    assert flops(fwd) == pytest.approx(total / 64, rel=1e-12)
    assert flops(bwd) == pytest.approx(2 * total / 64, rel=1e-12)


# ---------------------------------------------------------------- invariants
def predict(parallel: dict, nodes: int = 2, **over):
    return ddlsim.predict(config(parallel, system__nodes=nodes, **over), check_fit=False)


def test_2p5d_with_depth_1_is_2d():
    two = config({"tensor_parallel": {"mode": "2d", "q": 4}}, system__nodes=2)
    flat = config({"tensor_parallel": {"mode": "2.5d", "q": 4, "d": 1}}, system__nodes=2)
    assert [op.payload for op in layer(two)[0]] == [op.payload for op in layer(flat)[0]]
    assert [op.payload for op in layer(two)[1]] == [op.payload for op in layer(flat)[1]]
    a, b = (ddlsim.predict(c, check_fit=False) for c in (two, flat))
    assert a.iteration_time_s == b.iteration_time_s
    assert a.memory.total == b.memory.total


@pytest.mark.parametrize("spec", [{"mode": "2d", "q": 1}, {"mode": "3d", "q": 1},
                                  {"mode": "2.5d", "q": 1, "d": 1}, {"mode": "1d", "size": 1}])
def test_a_one_rank_grid_is_no_tensor_parallelism(spec):
    # A 1-rank grid splits nothing: the prediction and the memory are those of the plain plan
    # (the 2-D family writes the layer as separate GEMMs, so sums may round differently).
    plain = predict({"data_parallel_size": 1}, nodes=1)
    grid = predict({"tensor_parallel": spec, "data_parallel_size": 1}, nodes=1)
    assert grid.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-9)
    assert grid.memory.total == pytest.approx(plain.memory.total, rel=1e-9)
    assert grid.memory.activations == pytest.approx(plain.memory.activations, rel=1e-9)


def test_megatron_template_reproduces_the_builder(monkeypatch):
    # The partitioner template (used by 1-D under context parallelism) with cp = 1 gives the
    # builder's own 1-D numbers: same FLOPs, bytes and collectives, only split into more ops.
    # (Blocking TP collectives: an overlap pairs them with whole blocks in the builder and
    # with single GEMMs in the template.)
    from ddlsim.workloads.decoder.partition.megatron_1d import Megatron1D
    blocking = {"stack": "megatron-core-2024", "overlap": {"tp_async_backward": False}}
    for par in ({"tensor_model_parallel_size": 8, "data_parallel_size": 2},
                {"tensor_model_parallel_size": 8, "sequence_parallel": True,
                 "pipeline_model_parallel_size": 2, "data_parallel_size": 1}):
        for recompute in ("none", "selective", "full"):
            legacy = predict(par, train__recompute=recompute, train__global_batch_size=2 * B,
                             system__software=blocking)
            monkeypatch.setattr(Megatron1D, "structured", property(lambda self: True))
            template = predict(par, train__recompute=recompute,
                               train__global_batch_size=2 * B, system__software=blocking)
            monkeypatch.undo()
            assert template.iteration_time_s == pytest.approx(legacy.iteration_time_s,
                                                              rel=1e-9), (par, recompute)
            assert template.comm_bytes == pytest.approx(legacy.comm_bytes, rel=1e-9)


def test_2d_activations_equal_1d_with_sequence_parallel():
    # Both split every activation 64 ways (Korthikanti's count divided by t = 64).
    two = ddlsim.memory_per_device(config({"tensor_parallel": {"mode": "2d", "q": 8}}))
    one = ddlsim.memory_per_device(config({"tensor_model_parallel_size": 64,
                                           "sequence_parallel": True}))
    assert two.activations == pytest.approx(one.activations, rel=1e-12)


def test_2p5d_replicates_weights_over_depth():
    # [4,4,4]: a rank holds 1/q² = 1/16 of each layer and of the tied V·h embedding, plus the
    # learned positions s_max·h and the final LayerNorm 2h (not split): bf16 weights.
    cfg = config({"tensor_parallel": {"mode": "2.5d", "q": 4, "d": 4}})
    sh = cfg.model.shape()
    params = (2 * sh.layer_params + 32768 * H) / 16 + 2048 * H + 2 * H
    assert ddlsim.memory_per_device(cfg).weights == pytest.approx(2 * params, rel=1e-12)


def test_workloads_validate_and_name_their_grid_groups():
    cfg = config({"tensor_parallel": {"mode": "2.5d", "q": 4, "d": 4}})
    wl = ddlsim.build_workload(cfg)
    wl.validate()
    rows, cols, dep = (wl.groups[n].members for n in ("tp_row", "tp_col", "tp_dep"))
    # rank = j + 4i + 16k (column j innermost): a row varies j, a column i, the depth k
    assert rows[0].tolist() == [0, 1, 2, 3] and cols[0].tolist() == [0, 4, 8, 12]
    assert dep[0].tolist() == [0, 16, 32, 48]
    body = [op for op in wl.classes[0].program.blocks["F0"].ops if isinstance(op.payload, Loop)]
    assert body and body[0].payload.count == 2          # the two layers, one Loop


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("parallel, over, words", [
    ({"tensor_parallel": {"mode": "2.5D", "q": 4, "d": 4}}, {}, ["'2.5D'", "allowed", "2.5d"]),
    ({"tensor_parallel": {"mode": "2d", "q": 4, "d": 2}}, {}, ["'2d'", "not applicable", "d"]),
    ({"tensor_parallel": {"mode": "2.5d", "q": 4}}, {}, ["missing", "d"]),
    ({"tensor_parallel": {"mode": "2d", "q": 8}, "tensor_model_parallel_size": 8}, {},
     ["tensor_model_parallel_size = 8", "64 ranks"]),
    ({"tensor_parallel": {"mode": "2d", "q": 8}, "sequence_parallel": True}, {},
     ["sequence_parallel", "1-D"]),
    ({"tensor_parallel": {"mode": "2d", "q": 8}}, {"train__micro_batch_size": 4},
     ["micro_batch_size = 4", "8 rows"]),
    ({"tensor_parallel": {"mode": "2.5d", "q": 2, "d": 2}}, {"train__micro_batch_size": 2},
     ["micro_batch_size = 2", "4 rows", "'2.5d'"]),
    ({"tensor_parallel": {"mode": "3d", "q": 2}}, {"train__micro_batch_size": 2},
     ["micro_batch_size = 2", "q² = 4"]),
    ({"tensor_parallel": {"mode": "3d", "q": 4}}, {"model__hidden_size": 1048,
                                                   "model__num_attention_heads": 8},
     ["hidden_size = 1048", "16"]),
    ({"tensor_parallel": {"mode": "2d", "q": 4}}, {"model__num_attention_heads": 6,
                                                   "model__hidden_size": 1152},
     ["num_attention_heads = 6", "q = 4"]),
    ({"tensor_parallel": {"mode": "2d", "q": 8}, "zero_stage": 3}, {}, ["zero_stage", "3"]),
])
def test_plans_the_schemes_cannot_run_are_refused_in_one_paragraph(parallel, over, words):
    with pytest.raises(ddlsim.ConfigError) as err:
        config(parallel, **over)
    text = str(err.value)
    assert "\n" not in text.strip() and "Traceback" not in text
    for w in words:
        assert w in text, (w, text)

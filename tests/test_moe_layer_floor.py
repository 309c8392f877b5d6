"""benchmarks/moe_layer_floor.py: validate_moe's rows per MoE layer and micro-batch.

The arithmetic on a record built by hand (no prediction runs): the divisor is layers per
pipeline rank × micro-batches per pipeline, the parts add up to the prediction, and the
tokens each local expert computes follow ``n = etp · ep · T · k / E``.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
from benchscripts import load_script

floor = load_script("moe_layer_floor")
vm = load_script("validate_moe")


def _record(compute: float, comm: dict, bubble: float, optimizer: float) -> dict:
    """ModelZoo row 1 (Qwen3-235B, 94 layers, TP2 PP8 EP32, DP16, MBS 1, GBS 2048) with a
    made-up breakdown in seconds."""
    row = vm.zoo_rows()[0]
    predicted = compute + sum(comm.values()) + bubble + optimizer
    result = SimpleNamespace(breakdown=SimpleNamespace(
        compute_s=compute, exposed_comm_s=comm, bubble_s=bubble, optimizer_s=optimizer))
    return {"row": row, "result": result, "published": 19.7, "predicted": predicted}


def test_parts_are_the_step_over_layers_and_microbatches():
    o = _record(9.4, {"ep": 4.7, "tp": 0.3, "pp": 0.1}, 1.0, 0.02)
    p = floor.layer_parts(o)
    per = 1e3 / (94 / 8 * 2048 / (1 * 16))        # ms per second of step: 1,504 layer-mbs
    assert p["published"] == pytest.approx(19.7 * per)
    assert p["compute"] == pytest.approx(9.4 * per)
    assert p["ep"] == pytest.approx(4.7 * per) and p["other"] == pytest.approx(0.4 * per)
    assert p["bubble"] == pytest.approx(1.02 * per)
    assert p["compute"] + p["ep"] + p["other"] + p["bubble"] == pytest.approx(p["predicted"])
    assert p["gap"] == pytest.approx(p["published"] - p["predicted"])


def test_experts_and_their_tokens():
    p = floor.layer_parts(_record(1.0, {}, 0.0, 0.0))
    # 128 experts over EP32: 4 local; T = 4096 / TP2 = 2048 routed, 8 copies each:
    # n = 1 · 32 · 2048 · 8 / 128 = 4096 tokens per local expert (forced balance)
    assert p["local"] == 4 and p["n"] == pytest.approx(4096)
    assert p["ep"] == 0.0 and p["other"] == 0.0


def test_per_expert_host_is_the_grouped_linears_measured_seconds():
    from ddlsim.workloads.decoder.moe_host_chain import GROUPED_LINEAR_BWD_S, GROUPED_LINEAR_FWD_S
    assert floor.expert_host_ms(16) == pytest.approx(
        2 * (16 * GROUPED_LINEAR_BWD_S + 15 * GROUPED_LINEAR_FWD_S) * 1e3)
    assert floor.expert_host_ms(1) == pytest.approx(2 * GROUPED_LINEAR_BWD_S * 1e3)


def test_expected_max_of_normals():
    # E[max of 2 standard normals] = 1/sqrt(pi); of 1, the mean 0; grows with n
    assert floor.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert floor.expected_max_normal(1) == pytest.approx(0.0, abs=1e-9)
    assert floor.expected_max_normal(8) == pytest.approx(1.4236, abs=1e-4)   # tabulated


def test_random_routing_excess_from_an_enumerated_routing():
    # E = 8 experts over ep = 2 ranks (4 each), top-2: enumerate the 28 pairs a token can
    # pick; a rank's copies per token have the hypergeometric mean and variance used
    pairs = list(itertools.combinations(range(8), 2))
    on_rank = [sum(e < 4 for e in pair) for pair in pairs]
    mean = sum(on_rank) / len(pairs)
    var = sum((c - mean) ** 2 for c in on_rank) / len(pairs)
    n = 3 * 100                                     # 3 routing ranks x 100 tokens
    expected = floor.expected_max_normal(2) * math.sqrt(n * var) / (n * mean)
    assert floor.random_routing_excess(3, 100, 8, 2, 2) == pytest.approx(expected)
    # more tokens: the excess shrinks as 1/sqrt(tokens)
    assert floor.random_routing_excess(3, 400, 8, 2, 2) == pytest.approx(expected / 2)


def test_host_bound_is_the_eager_prediction_less_the_graphed_one_per_layer():
    # ModelZoo row 1's divisor (1,504 layer-micro-batches): 0.3 s of a 12 s prediction that
    # CUDA graphs remove is 0.3 s / 1,504 = 0.1995 ms per layer and micro-batch
    o = _record(9.0, {"ep": 2.0}, 1.0, 0.0)
    assert floor.per_layer_ms(o["row"]) == pytest.approx(1e3 / (94 / 8 * 2048 / 16))
    assert floor.host_bound_ms(o, 11.7) == pytest.approx(0.3e3 / 1504, rel=1e-3)
    assert floor.host_bound_ms(o, 12.0) == 0.0


def test_graphed_config_sets_cuda_graphs_and_leaves_the_row_alone():
    cfg = vm.config(vm.zoo_rows()[0])
    graphed = floor.graphed_config(cfg)
    assert graphed["system"]["software"]["kernels"]["host_dispatch"] == "cuda_graphs"
    assert "host_dispatch" not in cfg["system"]["software"].get("kernels", {})
    assert graphed["parallel"] == cfg["parallel"]


def test_every_set_of_validate_moe_rows_has_a_label():
    """Each kind of row validate_moe predicts (Bridge, ModelZoo, long context, the EP-overlap
    A/B runs) gets a label, so the script's table prints for all of them."""
    rows = vm.rows() + vm.zoo_rows() + vm.long_rows() + vm.ab_rows()
    labels = [floor._label(r) for r in rows]
    assert {r["set"] for r in rows} >= {"modelzoo", "long", "ab"}
    assert all(labels) and any(label.startswith("Bridge A/B") for label in labels)

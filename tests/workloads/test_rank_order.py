"""``parallel.rank_order``: the plan's mesh order decides which ranks share a node."""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.errors import ConfigError

PLAN = {
    "model": "gpt3-1.3b",
    "parallel": {"tensor_model_parallel_size": 2, "data_parallel_size": 8},
    "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
    "system": {"preset": "dgx-a100", "nodes": 2},
}


def _plan(order: str | None) -> dict:
    plan = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PLAN.items()}
    if order is not None:
        plan["parallel"]["rank_order"] = order
    return plan


def test_the_default_is_megatrons_order():
    default = ddlsim.predict(_plan(None)).to_dict()
    explicit = ddlsim.predict(_plan("tp-cp-ep-dp-pp")).to_dict()
    assert default["iteration_time_s"] == explicit["iteration_time_s"]
    assert explicit["config"]["parallel"]["rank_order"] == "tp-cp-ep-dp-pp"


def test_data_parallel_innermost_puts_tensor_parallel_pairs_across_nodes():
    """Ranks fill devices in order, 8 to a node: with tp innermost the TP pairs are (0, 1), …
    inside a node; with dp innermost they are (r, r + 8), one rank on each node, so the
    per-layer TP all-reduces cross the NICs and the iteration is slower on both engines."""
    inner = build_workload(ddlsim.load_config(_plan("tp-dp-pp"))).groups["tp"].members
    outer = build_workload(ddlsim.load_config(_plan("dp-tp-pp"))).groups["tp"].members
    assert inner.tolist()[:2] == [[0, 1], [2, 3]]
    assert outer.tolist()[:2] == [[0, 8], [1, 9]]
    for engine in ("analytical", "des"):
        near = ddlsim.predict(_plan("tp-dp-pp"), engine)
        far = ddlsim.predict(_plan("dp-tp-pp"), engine)
        assert far.breakdown.exposed_comm_s["tp"] > 3 * near.breakdown.exposed_comm_s["tp"]
        assert far.iteration_time_s > near.iteration_time_s


def test_every_order_partitions_the_ranks_into_stages():
    plan = _plan("dp-tp-pp")
    plan["parallel"]["pipeline_model_parallel_size"] = 2
    plan["parallel"]["data_parallel_size"] = 4
    wl = build_workload(ddlsim.load_config(plan))
    ranks = np.sort(np.concatenate([np.asarray(c.ranks) for c in wl.classes]))
    assert ranks.tolist() == list(range(16))


@pytest.mark.parametrize("order, words", [("tp-dp-foo", "foo"), ("tp-tp-dp-pp", "repeated"),
                                          ("dp-pp", "tp")])
def test_bad_orders_are_refused_with_the_axes_allowed(order, words):
    with pytest.raises(ConfigError, match=r"parallel\.rank_order") as exc:
        ddlsim.load_config(_plan(order))
    assert words in str(exc.value)

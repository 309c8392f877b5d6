"""NCCL's all-to-all with uneven sizes (``split_bytes``: a hot expert-parallel rank) is still
NCCL's grouped sends (``nccl_p2p``) at NCCL's share of the NVLink rate, not the cheapest MPI
algorithm at the line rate (until 2026-12-01 it was, so a hot rank made a one-node all-to-all
faster than a balanced one)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import ddlsim
from ddlsim.simulator.collectives import get_algorithm, split_matrix
from ddlsim.simulator.collectives.nccl.p2p import p2p_efficiency

#: Mixtral 8x7B cut to 2 layers, EP 8 on one DGX H100, forced balance (a derived hot rank)
MOE = {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 2},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                            "router_force_load_balancing": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048},
       "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}


def load(**moe) -> ddlsim.RunConfig:
    d = copy.deepcopy(MOE)
    d["parallel"]["moe"].update(moe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def test_the_hot_ranks_all_to_all_is_nccl_p2p_and_slower_than_a_balanced_one():
    hot, even = load(), load(router_imbalance=1.0)
    a_hot, a_even = ddlsim.predict(hot), ddlsim.predict(even)
    name = next(k for k in a_hot.algorithms if k.startswith("ep.all_to_all"))
    assert a_hot.algorithms[name] == a_even.algorithms[name] == "nccl_p2p"
    assert a_hot.breakdown.exposed_comm_s["ep"] > a_even.breakdown.exposed_comm_s["ep"]


def test_the_engines_agree_on_one_node():
    cfg = load()
    a, d = ddlsim.predict(cfg), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-3)
    assert d.breakdown.exposed_comm_s["ep"] == pytest.approx(
        a.breakdown.exposed_comm_s["ep"], rel=0.03)


def test_uniform_sizes_give_the_even_form_and_a_hot_receiver_scales_it():
    """``B`` uniform: the even ``nccl_p2p`` time; one receiver at ``k×`` the others: its
    incoming bytes over NCCL's share of the NVLink rate."""
    from ddlsim.simulator.costs import CostModel
    cfg = load()
    cost = CostModel(cfg.system, ddlsim.build_workload(cfg), cfg.parallel.collective_algorithm)
    net = cost.nets["ep"]
    algo, n, p = get_algorithm("all_to_all", "nccl_p2p"), 64e6, net.p
    even = split_matrix([n / p] * p)
    assert algo.uneven_time(even, net) == pytest.approx(algo.time(n, net), rel=1e-12)
    hot = split_matrix([3 * n / p] + [n / p] * (p - 1))
    expected = net.alpha_s + (p - 1) * 3 * n / p / (net.bw_intra_Bps * p2p_efficiency(net))
    assert algo.uneven_time(hot, net) == pytest.approx(expected, rel=1e-12)
    assert p2p_efficiency(net) < 1.0
    (phase,) = algo.uneven_phases_for(hot / hot.sum() * p, net)
    assert np.allclose(phase.weights * p2p_efficiency(net),
                       (hot / hot.sum() * p)[tuple(phase.pairs.T)])

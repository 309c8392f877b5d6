"""The closed forms' collective choices are made once per what they depend on (issue 27,
speed): a cost model built again for the same plan, or for another plan with an equal group
network, takes the choice already made; anything the choice depends on keeps it apart."""

from __future__ import annotations

import numpy as np

from ddlsim.config import SystemConfig
from ddlsim.simulator.collectives import collective_time
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.payloads import Collective
from ddlsim.workloads.trace import GroupFamily


def _system(backend: str = "auto") -> SystemConfig:
    """4 nodes × 8 A100s on NVSwitch, 8 NICs a node, a fat tree."""
    return SystemConfig.model_validate({
        "name": "t", "nodes": 4, "devices_per_node": 8,
        "device": {"name": "a100", "peak_flops": {"bf16": "312 TFLOP/s"},
                   "memory_bytes": "80 GB", "memory_bandwidth_Bps": "2 TB/s"},
        "intra_node": {"kind": "nvswitch", "bandwidth_Bps": "300 GB/s", "latency_s": "2 us"},
        "nics_per_node": 8, "nic": {"bandwidth_Bps": "200 Gb/s", "latency_s": "1 us"},
        "network": {"topology": "fat_tree"}, "collectives": {"backend": backend}})


def _cost(system: SystemConfig, algorithm: dict | None = None) -> CostModel:
    groups = {"dp": GroupFamily("dp", "dp", np.arange(32).reshape(4, 8).T.copy()),
              "tp": GroupFamily("tp", "tp", np.arange(32).reshape(4, 8))}
    workload = type("W", (), {"world_size": 32, "groups": groups})()
    return CostModel(system, workload, algorithm)


OP = Collective("grads", "all_reduce", "dp", 256e6)


def test_a_cost_model_built_again_takes_the_choice_made():
    first = _cost(_system()).choice(OP)
    again = _cost(_system()).choice(OP)
    assert again is first


def test_what_the_choice_depends_on_keeps_it_apart():
    """The plan's algorithm, the op's own, its size, its group and the backend each give
    their own choice, each as the closed form times it."""
    auto = _cost(_system()).choice(OP)
    ring = _cost(_system(), {"all_reduce": "ring"}).choice(OP)
    assert ring.algorithm == "ring" and ring is not auto
    net = _cost(_system()).nets["dp"]
    assert ring.time_s == collective_time("all_reduce", "ring", OP.bytes, net)
    tree = _cost(_system()).choice(Collective("grads", "all_reduce", "dp", 256e6,
                                              algorithm="tree"))
    assert tree.algorithm == "tree"
    small = _cost(_system()).choice(Collective("grads", "all_reduce", "dp", 1e3))
    assert small.key != auto.key and small.time_s < auto.time_s
    tp = _cost(_system()).choice(Collective("grads", "all_reduce", "tp", 256e6))
    assert tp.key.startswith("tp.") and tp.time_s != auto.time_s
    mpi = _cost(_system("mpi")).choice(OP)
    assert not mpi.algorithm.startswith("nccl") and auto.algorithm.startswith("nccl")

"""``system.collectives.nccl_protocol`` and ``gpu_arch`` are refused where the collectives do
not run on NCCL (ddlsim/simulator/backend_rules.py), as ``nccl_version`` is: an MPI backend
(mpi, mpich, openmpi, or auto on a system without NVLink GPUs) would ignore them silently,
unless the plan pins a collective to one of NCCL's algorithms, which they then time."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.errors import ConfigError


def _config(system: dict, algorithms: dict | None = None) -> ddlsim.RunConfig:
    return ddlsim.load_config({
        "model": {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                  "vocab_size": 1024, "max_position_embeddings": 512},
        "parallel": {"data_parallel_size": 2, "collective_algorithm": algorithms or {}},
        "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 512},
        "system": system})


def _a100(**collectives) -> dict:
    return {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 2, "collectives": collectives}


@pytest.mark.parametrize("field, value", [("nccl_protocol", "LL128"), ("gpu_arch", "hopper")])
@pytest.mark.parametrize("system, backend", [
    (_a100(backend="mpi"), "mpi"), (_a100(backend="openmpi"), "openmpi"),
    (_a100(backend="mpich"), "mpich"),
    ({"preset": "cpu-10gbe", "nodes": 2, "devices_per_node": 1}, "mpi")])   # auto: no NVLink
def test_an_nccl_option_where_nccl_does_not_run_is_refused(field, value, system, backend):
    system = copy.deepcopy(system)
    system.setdefault("collectives", {})[field] = value
    with pytest.raises(ConfigError, match=rf"system\.collectives\.{field} = '{value}' applies "
                                          rf"to NCCL's collectives, but they run on "
                                          rf"'{backend}'.*remove {field} or set backend: nccl"):
        ddlsim.predict(_config(system))


@pytest.mark.parametrize("field, value", [("nccl_protocol", "Simple"), ("gpu_arch", "ampere")])
def test_the_option_is_taken_where_nccl_runs_and_auto_is_no_error(field, value):
    assert ddlsim.predict(_config(_a100(**{field: value}))).iteration_time_s > 0
    assert ddlsim.predict(_config(_a100(backend="mpi", **{field: "auto"}))).iteration_time_s > 0


def test_the_protocol_is_used_by_an_nccl_algorithm_the_plan_pins_under_mpi():
    pinned = {"all_reduce": "nccl_ring"}
    times = {proto: ddlsim.predict(_config(_a100(backend="mpi", nccl_protocol=proto),
                                           pinned)).iteration_time_s
             for proto in ("LL", "Simple")}
    assert times["LL"] != times["Simple"]

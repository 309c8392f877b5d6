"""``system.collectives.nccl_version`` is refused where the collectives do not run on NCCL
(ddlsim/simulator/costs.py ``_backend``): an explicit MPI backend, or ``auto`` on a system
without NVLink GPUs, would otherwise ignore it silently."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.errors import ConfigError


def _config(system: dict) -> dict:
    return {"model": {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                      "vocab_size": 1024, "max_position_embeddings": 512},
            "parallel": {"data_parallel_size": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 512},
            "system": system}


@pytest.mark.parametrize("system, backend", [
    ({"preset": "dgx-a100", "nodes": 1, "devices_per_node": 2,
      "collectives": {"backend": "mpi", "nccl_version": "2.21.5"}}, "'mpi'"),
    ({"preset": "cpu-10gbe", "nodes": 2, "devices_per_node": 1,
      "collectives": {"nccl_version": "2.26.2"}}, "'mpi'"),
])
def test_a_release_for_collectives_nccl_does_not_run_is_refused(system, backend):
    cfg = ddlsim.load_config(_config(system))
    with pytest.raises(ConfigError, match=rf"nccl_version = '2\.2\d\.\d'.*run on {backend}.*"
                                          r"remove nccl_version or set backend: nccl"):
        ddlsim.predict(cfg)


def test_the_release_is_taken_where_nccl_runs_and_unset_is_no_error():
    nccl = {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 2,
            "collectives": {"nccl_version": "2.21.5"}}
    assert ddlsim.predict(ddlsim.load_config(_config(nccl))).iteration_time_s > 0
    mpi = {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 2,
           "collectives": {"backend": "mpi"}}
    assert ddlsim.predict(ddlsim.load_config(_config(mpi))).iteration_time_s > 0


def test_the_defaults_count_as_not_set():
    # a config written out whole (model_dump) carries the defaults; read back on an MPI
    # system it must not be refused (tests/simulator/test_des_components.py's fabrics)
    from ddlsim.config_system import CollectivesSpec
    from ddlsim.simulator.backend_rules import NCCL_ONLY
    assert NCCL_ONLY == {f: CollectivesSpec.model_fields[f].default for f in NCCL_ONLY}

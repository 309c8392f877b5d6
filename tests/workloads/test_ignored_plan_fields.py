"""A plan field a family's trace never reads is refused, never ignored: each family declares
the fields it reads (``WorkloadFamily.plan_fields``) and ``RunConfig`` refuses any other one
set to a value other than its default, before the family's rules."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.registry import families, get_family

ROOT = "examples/proxies"


@pytest.mark.parametrize("example,override,field", [
    ("resnet50.yaml", "train.recompute=full", "train.recompute = 'full'"),
    ("bert_large.yaml", "train.recompute=full", "train.recompute = 'full'"),
    ("cosmoflow.yaml", "parallel.schedule=gpipe", "parallel.schedule = 'gpipe'"),
    ("cosmoflow.yaml", "train.recompute=selective", "train.recompute = 'selective'"),
    ("dlrm.yaml", "parallel.context_parallel_size=2", "parallel.context_parallel_size = 2"),
    # options no family but the decoders reads (accepted and ignored while families listed
    # what they ignore)
    ("resnet50.yaml", "parallel.overlap_p2p_comm=true", "parallel.overlap_p2p_comm = True"),
    ("bert_large.yaml", "parallel.tp_comm_overlap=bulk", "parallel.tp_comm_overlap = 'bulk'"),
    ("dlrm.yaml", "parallel.overlap_param_gather=true", "parallel.overlap_param_gather = True"),
])
def test_an_option_the_family_does_not_read_is_refused(example, override, field):
    with pytest.raises(ddlsim.ConfigError, match=rf"{field}: the \w+ family does not use"):
        ddlsim.load_config(f"{ROOT}/{example}", overrides=[override])


def test_the_default_value_written_out_is_accepted():
    cfg = ddlsim.load_config(f"{ROOT}/resnet50.yaml",
                             overrides=["train.recompute=none", "parallel.schedule=1f1b"])
    assert cfg.train.recompute == "none"


def test_several_are_named_at_once():
    with pytest.raises(ddlsim.ConfigError, match=r"parallel.schedule = 'gpipe'; "
                                                 r"train.recompute = 'full'.*these options"):
        ddlsim.load_config(f"{ROOT}/resnet50.yaml", overrides=[
            "parallel.schedule=gpipe", "train.recompute=full"])


def test_every_declared_field_exists():
    from ddlsim.config import ParallelConfig, TrainConfig
    sections = {"parallel": ParallelConfig, "train": TrainConfig}
    declared = [get_family(name).plan_fields for name in families()]
    assert any(fields is not None for fields in declared)
    for fields in declared:
        for path in fields or ():
            section, field = path.split(".")
            assert field in sections[section].model_fields, path


def test_a_family_that_lists_what_it_ignores_is_refused():
    from ddlsim.workloads.registry import WorkloadFamily, register_workload

    class Old(WorkloadFamily):
        ignores = ("parallel.schedule",)

    with pytest.raises(ddlsim.ConfigError, match="sets 'ignores'.*plan_fields"):
        register_workload("old-style")(Old)
    assert "old-style" not in families()


def test_cosmoflow_sample_is_one_volume():
    with pytest.raises(ddlsim.ConfigError, match="seq_length = 2048: a cosmoflow sample"):
        ddlsim.load_config(f"{ROOT}/cosmoflow.yaml", overrides=["train.seq_length=2048"])

"""A plan field a family's trace never reads is refused, never ignored: each family lists
them (``WorkloadFamily.ignores``) and ``RunConfig`` checks them before the family's rules."""

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


def test_every_ignored_field_exists():
    from ddlsim.config import ParallelConfig, TrainConfig
    sections = {"parallel": ParallelConfig, "train": TrainConfig}
    for name in families():
        for path in get_family(name).ignores:
            section, field = path.split(".")
            assert field in sections[section].model_fields, (name, path)


def test_cosmoflow_sample_is_one_volume():
    with pytest.raises(ddlsim.ConfigError, match="seq_length = 2048: a cosmoflow sample"):
        ddlsim.load_config(f"{ROOT}/cosmoflow.yaml", overrides=["train.seq_length=2048"])

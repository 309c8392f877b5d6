"""ddlsim/workloads/resnet/dataloader.py: the host's DataLoader worker pool beside the step
(issue 29: the 8-GPU AMP rows of DeepLearningExamples' ResNet-50 scale 6.7-7.0x, not 7.8x).

Specification: a GPU's workers run on ``c = min(workers, host_cores / ranks_on_node − 1)``
cores (each training process holds one, spinning on the GPU) and prepare a micro-batch of
``b`` images in ``b / (image_s_per_core · c)`` s, beside the device's step: the iteration is
``max(device step, loader time)`` per micro-batch, the excess booked as exposed ``other``."""

from __future__ import annotations

import pytest

import ddlsim
from benchscripts import load_script
from ddlsim.errors import ConfigError
from ddlsim.workloads.resnet import build
from ddlsim.workloads.resnet.dataloader import STREAM

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def _cfg(gpus: int = 8, batch: int = 256, loader: dict | str | None = None,
         micro: int | None = None, model: dict | None = None) -> dict:
    """DLE's AMP ResNet-50 row on a DGX-1 (validate_resnet's settings)."""
    m = {"preset": "resnet50", "memory_format": "channels_last", "zero_grad": "zero",
         "input_pipeline": "normalize_mixup", "grad_scaler": True, **(model or {})}
    if loader is not None:
        m["data_loader"] = loader
    mb = micro or batch
    return {"model": m, "parallel": {"data_parallel_size": gpus, "overlap_grad_reduce": True},
            "train": {"micro_batch_size": mb, "global_batch_size": batch * gpus,
                      "seq_length": 1, "dtype": "fp16", "optimizer": "sgd"},
            "system": {"preset": "dgx1-v100", "nodes": 1, "devices_per_node": gpus}}


POOL = {"workers": 8, "image_s_per_core": 200.0, "host_cores": 40}


def _loader_ops(cfg: dict):
    blocks = build.build_resnet(ddlsim.load_config(cfg)).classes[0].program.blocks
    return [op for b in blocks.values() for op in b.ops if op.stream == STREAM]


def test_synthetic_data_is_the_default_and_adds_no_op():
    assert ddlsim.load_config(_cfg()).model.data_loader == "synthetic"
    assert _loader_ops(_cfg()) == []
    assert _loader_ops(_cfg(loader="synthetic")) == []


@pytest.mark.parametrize("gpus, cores, seconds", [
    (8, 40, 256 / (200 * 4)),     # 40 / 8 = 5 cores a GPU, one held by its training process
    (1, 40, 256 / (200 * 8)),     # one GPU: its 8 workers each have a core
    (8, 128, 256 / (200 * 8)),    # 16 − 1 cores a GPU, more than its 8 workers
])
def test_one_op_a_micro_batch_of_the_pools_time(gpus, cores, seconds):
    ops = _loader_ops(_cfg(gpus, loader={**POOL, "host_cores": cores}))
    assert len(ops) == 1 and ops[0].deps == ()
    assert ops[0].payload.seconds == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_a_slow_pool_sets_the_step_and_its_excess_is_exposed(engine):
    device = ddlsim.predict(_cfg(), engine)
    slow = ddlsim.predict(_cfg(loader=POOL), engine)
    loader_s = 256 / (200 * 4)
    assert loader_s > device.iteration_time_s
    assert slow.iteration_time_s == pytest.approx(loader_s, rel=1e-9)
    assert slow.breakdown.exposed_comm_s["other"] == pytest.approx(
        loader_s - device.iteration_time_s, rel=1e-6)
    assert slow.breakdown.compute_s == pytest.approx(device.breakdown.compute_s)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_a_fast_pool_costs_nothing(engine):
    fast = {**POOL, "image_s_per_core": 2000.0}    # 32 ms a batch against a ~215 ms step
    assert ddlsim.predict(_cfg(loader=fast), engine).iteration_time_s == pytest.approx(
        ddlsim.predict(_cfg(), engine).iteration_time_s, rel=1e-12)


def test_each_micro_batch_is_loaded():
    step = ddlsim.predict(_cfg(loader=POOL, micro=128)).iteration_time_s
    assert len(_loader_ops(_cfg(loader=POOL, micro=128))) == 1      # in the forward block,
    assert step >= 2 * 128 / (200 * 4) * (1 - 1e-12)                 # which runs twice


def test_the_plan_line_names_the_pool():
    cfg = ddlsim.load_config(_cfg(loader=POOL))
    assert ("data loader: 8 workers/GPU on 4 cores at 200 img/s each, 320.0 ms a batch"
            in cfg.family.plan_summary(cfg))
    plain = ddlsim.load_config(_cfg())
    assert "data loader" not in plain.family.plan_summary(plain)


@pytest.mark.parametrize("loader, words", [
    ({**POOL, "host_cores": 8}, ["host_cores = 8", "8 training processes", "synthetic"]),
    ({**POOL, "workers": 0}, ["workers"]),
    ({**POOL, "workers": True}, ["boolean"]),
    ({**POOL, "image_s_per_core": -1}, ["image_s_per_core"]),
    ({**POOL, "threads": 4}, ["threads"]),
    ({"workers": 8, "host_cores": 40}, ["image_s_per_core"]),
    ("pytorch", ["data_loader", "'synthetic'"]),
])
def test_bad_pools_are_refused_naming_the_field(loader, words):
    with pytest.raises((ConfigError, ValueError)) as err:
        ddlsim.load_config(_cfg(loader=loader))
    for w in words:
        assert w in str(err.value)


def test_a_proxy_has_no_data_loader():
    cfg = _cfg(gpus=2, loader=POOL, model={"compute": "proxy", "proxy_timings": {
        "forward": "1 ms", "backward_per_bucket": "1 ms"}})
    for k in ("zero_grad", "input_pipeline", "grad_scaler", "memory_format"):
        cfg["model"].pop(k)
    with pytest.raises((ConfigError, ValueError),
                       match="data_loader is the host's input pipeline.*proxy"):
        ddlsim.load_config(cfg)


vr = load_script("validate_resnet")


def test_the_data_file_gives_each_hosts_pool_with_its_provenance():
    text = load_script("public_runs").header(vr.TABLE)
    for cite in ("7bdfc81d", "DGXA100 16", "Rome 7742", "E5-2698 v4", "gpu_affinity"):
        assert cite in text
    pools = {(r["preset"], r["host_cores"], r["loader_workers"]) for r in vr.rows()}
    assert pools == {("dgx-a100", "128", "16"), ("dgx1-v100", "40", "8")}


def test_the_rate_at_which_the_pool_binds_each_row():
    rows = [r for r in vr.rows() if r["precision"] == "AMP" and r["system"] != "DGX-1 32GB"]
    out = [{"row": r, "published": vr.published_time(r)} for r in rows]
    got = {(r["system"], r["gpus"]): (c, rate) for r, c, rate in vr.loader_bound_rates(out)}
    pub = {(o["row"]["system"], o["row"]["gpus"]): o["published"] for o in out}
    assert got[("DGX-1 16GB", "8")] == (4, pytest.approx(256 / (4 * pub[("DGX-1 16GB", "8")])))
    assert got[("DGX-1 16GB", "1")][0] == 8
    assert got[("DGX A100 80GB", "8")][0] == 15 and got[("DGX A100 80GB", "1")][0] == 16
    # no single rate binds A100's 8-GPU row but not its 1-GPU row: R* is lower on 8 GPUs
    assert got[("DGX A100 80GB", "8")][1] < got[("DGX A100 80GB", "1")][1]
    # on the DGX-1 one does: 8 GPUs leave 4 cores for 8 workers
    assert got[("DGX-1 16GB", "8")][1] > got[("DGX-1 16GB", "1")][1]


def test_the_what_if_rate_sets_every_rows_pool():
    row = next(r for r in vr.rows() if r["preset"] == "dgx1-v100" and r["gpus"] == "8"
               and r["precision"] == "AMP")
    assert "data_loader" not in vr.config(row)["model"]
    assert vr.config(row, loader_rate=150.0)["model"]["data_loader"] == {
        "workers": 8, "image_s_per_core": 150.0, "host_cores": 40}

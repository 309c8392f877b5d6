"""docs/extending.md, followed literally: its code blocks add a toy MLP family, its run config
names it, and both engines predict it.

The blocks are read from the page itself, so the page cannot drift from what works.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.workloads import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The page's ``mlp.py`` and ``mlp-4ranks.yaml`` written to a folder and imported, with
    the registry restored afterwards (other tests see only the bundled families)."""
    module = next(b for b in blocks("python") if b.startswith("# mlp.py"))
    config = next(b for b in blocks("yaml") if b.startswith("# mlp-4ranks.yaml"))
    (tmp_path / "mlp.py").write_text(module)
    (tmp_path / "mlp-4ranks.yaml").write_text(config)
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("mlp", None)
    yield importlib.import_module("mlp")
    sys.modules.pop("mlp", None)


def test_the_page_names_the_files_a_family_touches():
    text = DOC.read_text()
    assert "BUILTIN_FAMILIES" in text and "ddlsim/workloads/<family>/" in text


def test_toy_family_predicts_with_both_engines(toy):
    usage = next(b for b in blocks("python") if "import mlp" in b)
    exec(compile(usage, "extending.md", "exec"), {})   # the page's own usage block
    cfg = ddlsim.load_config("mlp-4ranks.yaml")
    assert type(cfg.model) is toy.MLPModel and cfg.world_size == 4
    # 8 layers of 4096² weights and 4096 biases
    params = 8 * (4096 * 4096 + 4096)
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert a.parameter_count == d.parameter_count == params
    # model FLOPs: 3 × global batch × layers × 2·width² (no recomputation)
    assert a.model_flops == 3 * 128 * 8 * 2.0 * 4096 ** 2
    # each rank runs 128 / 4 samples, forward + backward: 3 × 32 × 8 × 2·width² FLOPs of GEMM
    # at peak × the device's matmul ceiling (ops with FLOPs only: the roofline), at the least
    from ddlsim.simulator.kernels import kernel_device
    peak = cfg.system.device.peak_flops["bf16"] * kernel_device(cfg.system).ceiling("bf16")
    assert a.breakdown.compute_s >= 3 * 32 * 8 * 2.0 * 4096 ** 2 / peak * (1 - 1e-9)
    # one all-reduce of bf16 gradients per iteration (nccl-tests size)
    assert a.comm_bytes["dp"] == pytest.approx(2 * params)
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.05)
    assert "toy-mlp: MLP, 8 layers of width 4096" == cfg.family.summary(cfg.model)


def test_toy_family_rules_and_schema(toy):
    with pytest.raises(ConfigError, match="the mlp family is data-parallel only"):
        ddlsim.load_config("mlp-4ranks.yaml", ["parallel.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'widht' in model.*did you mean 'width'"):
        ddlsim.load_config("mlp-4ranks.yaml", ["model.widht=8"])


def test_a_second_family_cannot_take_a_registered_name(toy):
    with pytest.raises(ConfigError, match="'mlp' is already registered"):
        registry.register_workload("mlp")(type("Other", (registry.WorkloadFamily,), {}))


def test_a_gpt_prediction_imports_no_other_family():
    """Looking up ``gpt`` and a GPT preset imports the bundled family packages one at a
    time and stops at the first that answers (start-up time): the DLRM, CosmoFlow, ResNet and
    BERT packages stay unimported, and the registry still lists every family afterwards."""
    import subprocess

    code = ("import sys, ddlsim\n"
            "cfg = ddlsim.load_config('examples/gpt2-2ranks-one-node.yaml')\n"
            "ddlsim.predict(cfg)\n"
            "others = [m for m in ('dlrm', 'cosmoflow', 'resnet', 'bert')\n"
            "          if 'ddlsim.workloads.' + m in sys.modules]\n"
            "from ddlsim.workloads.registry import families\n"
            "print(others, sorted(families()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2],
                         env={**os.environ,
                              "PYTHONPATH": str(Path(__file__).resolve().parents[2])}).stdout
    assert out.strip() == "[] ['bert', 'cosmoflow', 'dlrm', 'gpt', 'llama', 'nemotron', 'resnet']"

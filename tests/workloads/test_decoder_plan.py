"""The decoder builder's resolved plan (issue 27, item 5): ``resolve_plan`` reads the run config
once; ``StageBuilder`` and its mixins read the plan and nothing else of the config, and every
attribute a mixin reads is declared (``decoder/stage.py``)."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

import ddlsim
from ddlsim.config import RunConfig
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.plan import DecoderPlan, resolve_plan

DECODER = Path(__file__).resolve().parents[2] / "ddlsim" / "workloads" / "decoder"
#: GPT-3 1.3B, TP2 PP2 on two DGX A100 (16 GPUs: DP 4), Megatron-Core's stack, bf16
BASE = {"model": "gpt3-1.3b",
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                     "zero_stage": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048,
                  "dtype": "bf16"},
        "system": {"preset": "dgx-a100", "nodes": 2, "software": "megatron-core-2024"}}


def plan_of(overrides: list[str] | None = None) -> tuple[RunConfig, DecoderPlan]:
    cfg = ddlsim.load_config(BASE, overrides or [])
    return cfg, resolve_plan(cfg, cfg.model.shape())


def test_plan_fields_come_from_the_config():
    cfg, plan = plan_of()
    assert (plan.tp, plan.pp, plan.vpp, plan.dp, plan.cp, plan.ep) == (2, 2, 1, 4, 1, 1)
    assert (plan.micro_batch, plan.seq_length, plan.dtype, plan.dtype_bytes) == (1, 2048, "bf16", 2)
    # Megatron-Core with bf16: fp32 main grads (grad_reduce_dtype fp32_if_bf16)
    assert plan.grad_dtype_bytes == 4
    assert plan.split == ((12,), (12,))          # 24 layers over 2 stages
    assert (plan.grad_group, plan.grad_group_size) == ("dp", 4)
    assert plan.edp == cfg.mesh.size("edp")
    assert (plan.zero_stage, plan.dp_strategy, plan.recompute) == (1, "ddp", "none")
    assert plan.moe is None and plan.uncheckpointed is None


def test_gradient_buckets_are_megatron_cores_rule():
    # max(40e6, 1e6 · DP 4) parameters of 4 bytes on the first chunk of the first stage; one
    # bucket (infinite) elsewhere; the parameter gather's first bucket in 16-bit parameters
    _, plan = plan_of()
    assert plan.grad_buckets == (40e6 * 4, math.inf)
    assert plan.bucket_bytes(0, 0) == 160e6
    assert plan.bucket_bytes(1, 0) == plan.bucket_bytes(0, 1) == math.inf
    assert plan.param_bucket_bytes == 80e6


def test_layer_checkpointing_resolves_the_plan_without_recomputation():
    # Megatron-Core cannot checkpoint every n-th layer (torchtitan can): a what-if here
    _, plan = plan_of(["train.recompute=full", "train.recompute_every_n_layers=2",
                       "system.software={stack: megatron-core-2024, what_if: true}"])
    plain = plan.uncheckpointed
    assert plain is not None and plain.uncheckpointed is None
    assert (plain.recompute, plain.recompute_every_n_layers) == ("none", 1)
    assert plain.split == plan.split and plain.partitioner.recompute == "none"


def test_the_plan_is_frozen():
    _, plan = plan_of()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tp = 4


@pytest.mark.parametrize("overrides", [[], ["parallel.sequence_parallel=true",
                                             "parallel.tp_comm_overlap=pipelined"]])
def test_the_builder_holds_no_run_config(overrides):
    cfg, plan = plan_of(overrides)
    b = StageBuilder(plan)
    b.chunk_blocks(0, 0, b.grad_sync_ops(0, 0))
    b.update_block(1, True, True)
    assert not hasattr(b, "cfg")
    assert not [k for k, v in vars(b).items() if isinstance(v, RunConfig)]


def _reads(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(attributes ``cls`` defines, attributes its methods read from ``self``)."""
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    read = set()
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            (defined if isinstance(n.ctx, ast.Store) else read).add(n.attr)
    return defined, read


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse((DECODER / module).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


@pytest.mark.parametrize("module, name", [("dpsync.py", "GradSyncOps"), ("moe.py", "MoEOps"),
                                          ("moe_update.py", "MoEUpdateOps"),
                                          ("edges.py", "EdgeOps")])
def test_each_mixin_reads_only_what_it_or_the_stage_base_declares(module, name):
    cls = _class(module, name)
    assert [b.id for b in cls.bases] == ["StageBase"]
    base, _ = _reads(_class("stage.py", "StageBase"))
    own, read = _reads(cls)
    assert sorted(read - own - base) == []
    assert "cfg" not in read


# ------------------------------------------------ the partitioners and the memory model
#: modules that take the resolved plan and must not read the run config
PLAN_ONLY = ["memory.py",
             *sorted(f"partition/{p.name}" for p in (DECODER / "partition").glob("*.py"))]


def _config_reads(module: str, root: Path = DECODER) -> list[str]:
    """Every place ``module`` names the run config: a ``cfg`` name, argument or attribute,
    or ``RunConfig``, as ``line: what``."""
    out = []
    for n in ast.walk(ast.parse((root / module).read_text())):
        if isinstance(n, ast.Name) and n.id in ("cfg", "RunConfig"):
            out.append(f"{n.lineno}: {n.id}")
        elif isinstance(n, ast.arg) and n.arg == "cfg":
            out.append(f"{n.lineno}: argument cfg")
        elif isinstance(n, ast.Attribute) and n.attr == "cfg":
            out.append(f"{n.lineno}: {ast.unparse(n)}")
        elif isinstance(n, ast.alias) and n.name == "RunConfig":
            out.append(f"{n.lineno}: import RunConfig")
    return out


@pytest.mark.parametrize("module", PLAN_ONLY)
def test_partitioners_and_memory_read_only_the_plan(module):
    assert _config_reads(module) == []


def test_the_ast_check_sees_a_config_read(tmp_path):
    # the check above can fail: a method reading self.cfg, a function taking cfg
    (tmp_path / "bad.py").write_text("from x import RunConfig\n"
                                     "def f(self, cfg):\n    return self.cfg.train\n")
    found = _config_reads("bad.py", tmp_path)
    assert sorted(found) == ["1: import RunConfig", "2: argument cfg", "3: self.cfg"]


@pytest.mark.parametrize("overrides", [
    [], ["parallel.context_parallel_size=2", "parallel.tensor_model_parallel_size=1"],
    ["parallel.tensor_parallel={mode: 2d, q: 2}", "parallel.tensor_model_parallel_size=4",
     "train.micro_batch_size=2", "train.global_batch_size=32"]])
def test_the_partitioner_is_built_from_the_plan_once(overrides):
    cfg, plan = plan_of(overrides)
    part = plan.partitioner
    assert part is plan.partitioner and part.plan is plan
    assert not hasattr(part, "cfg")
    assert not [k for k, v in vars(part).items() if isinstance(v, RunConfig)]
    part.layer_forward(), part.layer_backward(0.0)


def test_memory_resolves_the_plan_once_for_all_stages(monkeypatch):
    from ddlsim.workloads.decoder import build, split
    cfg = ddlsim.load_config(BASE, ["parallel.pipeline_model_parallel_size=4",
                                    "parallel.tensor_model_parallel_size=1"])
    calls = []
    real = split.chunk_layers
    monkeypatch.setattr("ddlsim.workloads.decoder.plan.chunk_layers",
                        lambda c: calls.append(1) or real(c))
    mem = build.decoder_memory(cfg, cfg.model.shape())
    assert len(mem) == 4 and len(calls) == 1


def test_a_workload_carries_the_memory_of_its_own_plan(monkeypatch):
    # build_workload resolves the plan once: the trace and every stage's memory from it
    from ddlsim.api import build_workload
    from ddlsim.workloads.decoder import build
    cfg = ddlsim.load_config(BASE)
    calls = []
    real = build.resolve_plan
    monkeypatch.setattr(build, "resolve_plan", lambda c, s: calls.append(1) or real(c, s))
    wl = build_workload(cfg)
    assert len(calls) == 1 and len(wl.memory) == 2
    assert list(wl.memory) == build.decoder_memory(cfg, cfg.model.shape())
